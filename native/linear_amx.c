/* Linear layer, AMX path (prefill, batched decode) for bf16 weights at M >= MIN_ROWS and i8q/u4q
 * at M >= Q_MIN_ROWS: the packed bf16 panels (linear.h: [K/2][width][2]) are AMX's B operand as
 * they are, 16 k-pair rows of 16 columns a tile, row stride width * 4 bytes, so nothing is
 * repacked; an i8q/u4q panel is dequantized into that layout a k chunk at a time
 * (linear_amx_panels.c). Activations are rounded to bf16 once, straight into the A tiles'
 * order (amx.h: per 32-row block, step by step, each tile 1 KB contiguous: rows K * 2 bytes
 * apart put a tile's 16 rows in one L1 set at K 2048 or 4096, ~5% slower there), padded to
 * whole tile steps; each thread runs its share of (panel, 32-row block) units
 * (dn_linear_share_of) in passes of up to 256 rows, each summed in fp32 over k chunks of
 * 32 x 32 blocks, or of 16 x 64 row tiles where a pass is one row block (pass()), then stored
 * (plus bias) into y under column masks, or, under a GLU, as act(gate) * up of a gate panel and
 * its up panel.
 *
 * The tile work goes through dn_amx_ops: the instructions where the CPU has AMX, a plain-C
 * emulation under DN_AMX_EMULATED (tests and CI on CPUs without AMX run this very driver; the
 * rounding of activations and the stores have an AVX-512 and a portable form, the latter for
 * CPUs without AVX-512, which only ever emulate). Fewer rows run the kernels the weight has
 * without AMX (the ISA path's GEMV, the int8 kernels): a few rows read the weights once either
 * way, and the int8 kernels read fewer bytes. */
#include <immintrin.h>

#include "amx.h"
#include "elementwise.h"
#include "linear_kernels.h"

#define ROWS 32        /* rows of a tile block: two tiles */
#define MIN_ROWS 5     /* bf16 weights: fewer rows run the ISA path */
#define Q_MIN_ROWS 32   /* i8q/u4q: fewer run the int8 kernels, which read a quarter to half the
                         * bytes and dequantize nothing (2 threads: 1.3x at 32 rows, ~1x at 24,
                         * 0.6x at 8) */
#define PASS_ROWS 256  /* rows a pass sums over every k chunk, in fp32 [PASS_ROWS][64] a panel */
#define CHUNK_STEPS 32 /* tile steps (16 k pairs) of a k chunk: a pass's activations of one chunk
                        * (256 rows x 2 KB) fit L2 while each column block reads them. Whole-K
                        * blocks ran K 8960 at 2.7 TFLOP/s against 3.9 at K 1536 on the Xeon; the
                        * chunks' own gain there is not yet measured on a quiet run */

#define ROW_STEPS 8 /* tile steps one row tile of two runs before the other reads the same 32 KB
                     * from L1 (2 threads, M 32: 18.7-19.8 GB/s against 17.0-17.9 a whole chunk) */

static int64_t round64(int64_t n) { return (n + 63) & ~(int64_t)63; }

/* k pairs of an activation row: whole tile steps, zero past K */
static int64_t row_pairs(const dn_linear_w *w) { return (w->kp / 2 + DN_AMX_PAIRS - 1) / DN_AMX_PAIRS * DN_AMX_PAIRS; }
static int64_t padded_rows(int64_t m) { return (m + ROWS - 1) / ROWS * ROWS; }
static int64_t act_bytes(const dn_linear_w *w, int64_t m) { return round64(padded_rows(m) * row_pairs(w) * 4); }

/* Per thread: a pass's sums of two panels (gate and up under a GLU) and the zero-padded last k
 * pairs of up to a panel's columns [16][64], and an i8q/u4q panel's k chunk as bf16 pairs. */
#define SUMS_FLOATS (PASS_ROWS * DN_LINEAR_NR)
#define CHUNK_BYTES (CHUNK_STEPS * DN_AMX_PAIRS * DN_LINEAR_NR * 4)
static int64_t thread_bytes(const dn_linear_w *w) {
    return 2 * SUMS_FLOATS * 4 + DN_AMX_PAIRS * DN_LINEAR_NR * 4 + (w->wtype == DN_W_BF16 ? 0 : CHUNK_BYTES);
}

/* Where k pair p of row r goes in the A tiles: [r / 32][p / 16][r % 32][p % 16] (amx.h). */
static int64_t a_index(int64_t r, int64_t p, int64_t lda) {
    return ((r / ROWS * (lda / DN_AMX_PAIRS) + p / DN_AMX_PAIRS) * ROWS + r % ROWS) * DN_AMX_PAIRS + p % DN_AMX_PAIRS;
}

/* Rows [r0, r1) of x [m][k] as bf16 pairs into the A tiles xa (lda pairs a row); rows past m and
 * pairs past K zero. */
DN_TARGET_AVX512 static void convert_rows_avx512(const float *x, int64_t m, int64_t k, uint32_t *xa, int64_t lda,
                                                 int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t kk = 0; kk < 2 * lda; kk += 32) {
            int64_t left = r < m ? k - kk : 0;
            __mmask16 lo = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            __mmask16 hi = left >= 32 ? 0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            const float *s = x + r * k + kk;
            __m512 a = _mm512_maskz_loadu_ps(lo, s), b = _mm512_maskz_loadu_ps(hi, s + 16);
            _mm512_store_si512(xa + a_index(r, kk / 2, lda), (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
    }
}

static void convert_rows_portable(const float *x, int64_t m, int64_t k, uint32_t *xa, int64_t lda, int64_t r0,
                                  int64_t r1) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t p = 0; p < lda; p++) {
            uint16_t lo = r < m && 2 * p < k ? dn_f32_to_bf16(x[r * k + 2 * p]) : 0;
            uint16_t hi = r < m && 2 * p + 1 < k ? dn_f32_to_bf16(x[r * k + 2 * p + 1]) : 0;
            xa[a_index(r, p, lda)] = (uint32_t)hi << 16 | lo;
        }
}

/* Pairs [first, last) of columns [col, col + cols) of a chunk `width` wide (fewer than a tile
 * step: the pairs past K's whole steps) as tail [16][cols], zero-padded to one step; columns past
 * the panel zero too. */
static void copy_tail(const uint32_t *chunk, int width, int64_t first, int64_t last, int col, int cols,
                      uint32_t *tail) {
    memset(tail, 0, DN_AMX_PAIRS * cols * 4);
    const int copied = width - col < cols ? width - col : cols;
    for (int64_t p = first; p < last; p++) memcpy(tail + (p - first) * cols, chunk + p * width + col, copied * 4);
}

/* A panel's weights as bf16 pairs, a k chunk at a time: the bf16 panel itself, or an i8q/u4q
 * panel dequantized into the thread's buffer (linear_amx_panels.c). */
typedef struct {
    const dn_linear_w *w;
    const uint8_t *panel;
    int width, avx512;
    uint32_t *buf; /* [CHUNK_STEPS * 16][width] pairs */
} source;

static const uint32_t *chunk_pairs(const source *src, int64_t p0, int64_t p1) {
    if (src->w->wtype == DN_W_BF16) return (const uint32_t *)src->panel + p0 * src->width;
    dn_amx_panel_pairs(src->w, src->panel, src->width, p0, p1, src->buf, src->avx512);
    return src->buf;
}

/* y[r][0..valid) = sums[r][..] (+ bias) for rows [0, rows), sums DN_LINEAR_NR floats a row. */
DN_TARGET_AVX512 static void store_rows_avx512(const float *sums, int64_t rows, float *y, int64_t ldy,
                                               const float *bias, int valid) {
    for (int v = 0; 16 * v < valid; v++) {
        int left = valid - 16 * v;
        __mmask16 k = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        __m512 b = bias ? _mm512_maskz_loadu_ps(k, bias + 16 * v) : _mm512_setzero_ps();
        for (int64_t r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(y + r * ldy + 16 * v, k,
                                  _mm512_add_ps(_mm512_loadu_ps(sums + r * DN_LINEAR_NR + 16 * v), b));
    }
}

static void store_rows_portable(const float *sums, int64_t rows, float *y, int64_t ldy, const float *bias,
                                int valid) {
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < valid; j++) y[r * ldy + j] = sums[r * DN_LINEAR_NR + j] + (bias ? bias[j] : 0.0f);
}

/* sums [rows][DN_LINEAR_NR] = x . panel over every k chunk for rows [r0, r1) (r0 a multiple of
 * ROWS): chunk-major, so a chunk's activations serve every column block from L2; the tile sums
 * go to memory between chunks (fp32 both ways: the same sums as one long block). A pass of one
 * row block over a full panel runs a row tile across all 64 columns at a time (amx.h row_bf16):
 * its weights come from DRAM, and that reads them in order. */
static void pass(const dn_amx_ops *ops, const uint32_t *xa, int64_t lda, const source *src, int64_t pairs,
                 int64_t r0, int64_t r1, float *sums, uint32_t *tail) {
    const int width = src->width, by_row = r1 - r0 <= ROWS && width == DN_LINEAR_NR;
    const int streams = src->w->wtype == DN_W_BF16; /* its first row tile reads the panel from memory */
    const int64_t sub = r1 - r0 > DN_AMX_ROWS ? ROW_STEPS : CHUNK_STEPS; /* by row: steps per row tile */
    const int64_t steps = pairs / DN_AMX_PAIRS, chunks = steps ? (steps + CHUNK_STEPS - 1) / CHUNK_STEPS : 1;
    for (int64_t ch = 0; ch < chunks; ch++) {
        const int64_t s0 = ch * CHUNK_STEPS, s1 = s0 + CHUNK_STEPS < steps ? s0 + CHUNK_STEPS : steps;
        const int last = ch == chunks - 1;
        const int64_t p0 = s0 * DN_AMX_PAIRS, p1 = last ? pairs : s1 * DN_AMX_PAIRS; /* the tail with the last */
        const uint32_t *chunk = chunk_pairs(src, p0, p1);
        const int has_tail = p1 > s1 * DN_AMX_PAIRS;
        if (by_row) {
            if (has_tail) copy_tail(chunk, width, s1 * DN_AMX_PAIRS - p0, p1 - p0, 0, width, tail);
            for (int64_t u0 = s0; u0 < s1 || (u0 == s0 && has_tail); u0 += sub) { /* a tail alone too */
                const int64_t u1 = u0 + sub < s1 ? u0 + sub : s1;
                const uint32_t *t = has_tail && u1 == s1 ? tail : NULL;
                for (int64_t r = r0; r < r1; r += DN_AMX_ROWS)
                    ops->row_bf16(xa + a_index(r, u0 * DN_AMX_PAIRS, lda), chunk + (u0 - s0) * DN_AMX_PAIRS * width,
                                  u1 - u0, t, sums + (r - r0) * DN_LINEAR_NR, DN_LINEAR_NR, ch > 0 || u0 > s0,
                                  streams && r == r0);
            }
            continue;
        }
        for (int col = 0; col < width; col += 32) {
            if (has_tail) copy_tail(chunk, width, s1 * DN_AMX_PAIRS - p0, p1 - p0, col, 32, tail);
            for (int64_t r = r0; r < r1; r += ROWS)
                ops->block_bf16(xa + a_index(r, p0, lda), chunk + col, width, s1 - s0, has_tail ? tail : NULL,
                                r1 - r > 16 ? 2 : 1, width - col >= 32 ? 2 : 1, sums + (r - r0) * DN_LINEAR_NR + col,
                                DN_LINEAR_NR, ch > 0, streams && r == r0 && col == 0 && width == DN_LINEAR_NR);
        }
    }
}

/* Under a GLU (c->glu_out) the grid is of gate panels q: a pass sums gate panel q and up panel
 * q + half over the same rows, then stores act(g) * u (no gate_up round trip through memory). */
static void gemm(const dn_linear_call *c, int t, int nt) {
    const dn_amx_ops *ops = dn_amx() == DN_AMX_TILES ? &dn_amx_tile_ops : &dn_amx_emulated_ops;
    const int avx512 = dn_isa() == DN_ISA_AVX512, glu = c->glu_out != NULL;
    const dn_linear_w *w = c->w;
    const int64_t m = c->m, n = w->n, lda = row_pairs(w), pairs = w->kp / 2;
    const int64_t half = w->npanels / 2, inter = n / 2;
    uint32_t *xa = (uint32_t *)c->scratch;
    float *sums = (float *)(c->scratch + act_bytes(w, m) + t * thread_bytes(w));
    uint32_t *tail = (uint32_t *)(sums + 2 * SUMS_FLOATS), *chunk_buf = tail + DN_AMX_PAIRS * DN_LINEAR_NR;
    int64_t r0, r1;
    dn_split(padded_rows(m), t, nt, &r0, &r1);
    (avx512 ? convert_rows_avx512 : convert_rows_portable)(c->x, m, w->k, xa, lda, r0, r1);
#pragma omp barrier
    dn_linear_part share = dn_linear_share_of(glu ? half : w->npanels, m, ROWS, t, nt);
    int64_t q0, q1, m0, m1;
    dn_linear_panels(&share, &q0, &q1);
    ops->begin();
    for (int64_t q = q0; q < q1; q++) {
        dn_linear_rows(&share, q, &m0, &m1);
        for (int64_t g0 = m0; g0 < m1; g0 += PASS_ROWS) {
            const int64_t g1 = g0 + PASS_ROWS < m1 ? g0 + PASS_ROWS : m1;
            for (int h = 0; h <= glu; h++) {
                const int64_t p = q + h * half;
                source src = {w, dn_linear_panel(w, p), dn_linear_width(w, p), avx512, chunk_buf};
                pass(ops, xa, lda, &src, pairs, g0, g1, sums + h * SUMS_FLOATS, tail);
            }
            if (glu) {
                for (int64_t r = g0; r < g1; r++)
                    dn_glu_row(sums + (r - g0) * DN_LINEAR_NR, sums + SUMS_FLOATS + (r - g0) * DN_LINEAR_NR,
                               c->glu_out + r * inter + q * DN_LINEAR_NR, dn_linear_valid(w, q), c->act);
            } else {
                (avx512 ? store_rows_avx512 : store_rows_portable)(
                    sums, g1 - g0, c->y + g0 * n + q * DN_LINEAR_NR, n,
                    c->bias ? c->bias + q * DN_LINEAR_NR : NULL, dn_linear_valid(w, q));
            }
        }
    }
    ops->end();
}

/* Whether m rows of w run on the tiles; else the kernels w has without AMX. */
static int tiles_for(const dn_linear_w *w, int64_t m) { return m >= (w->wtype == DN_W_BF16 ? MIN_ROWS : Q_MIN_ROWS); }

static size_t scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) {
    if (!tiles_for(w, m)) return dn_linear_fallback_kernels(w)->scratch_bytes(w, m, nthreads);
    return (size_t)(act_bytes(w, m) + nthreads * thread_bytes(w));
}

static void run(const dn_linear_call *c, int t, int nt) {
    if (!tiles_for(c->w, c->m)) dn_linear_fallback_kernels(c->w)->run(c, t, nt);
    else gemm(c, t, nt);
}

static int64_t units(const dn_linear_w *w, int64_t m) {
    const dn_linear_kernels *other = dn_linear_fallback_kernels(w);
    if (!tiles_for(w, m)) return other->units ? other->units(w, m) : INT64_MAX;
    return w->npanels * ((m + ROWS - 1) / ROWS);
}

static int fuses_glu(const dn_linear_w *w, int64_t m) {
    const dn_linear_kernels *other = dn_linear_fallback_kernels(w);
    return tiles_for(w, m) || (other->fuses_glu && other->fuses_glu(w, m));
}

const dn_linear_kernels dn_linear_amx = {scratch_bytes, run, fuses_glu, units};
