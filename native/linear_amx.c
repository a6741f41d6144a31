/* Linear layer, AMX path for bf16 weights at M >= MIN_ROWS (prefill, batched decode): the
 * packed bf16 panels (linear.h: [K/2][width][2]) are AMX's B operand as they are, 16 k-pair rows
 * of 16 columns a tile, row stride width * 4 bytes, so nothing is repacked. Activations are
 * rounded to bf16 once into rows of k pairs padded to whole tile steps; each thread runs its
 * share of (panel, 32-row block) units (dn_linear_share_of), 32 columns x 32 rows a block, and
 * stores the block's fp32 tile (plus bias) into y under column masks.
 *
 * The tile work goes through dn_amx_ops: the instructions where the CPU has AMX, a plain-C
 * emulation under DN_AMX_EMULATED (tests and CI on CPUs without AMX run this very driver; the
 * rounding of activations and the stores have an AVX-512 and a portable form, the latter for
 * CPUs without AVX-512, which only ever emulate). Fewer rows run the ISA path's kernels (its
 * GEMV): a few rows read the weights once either way. */
#include <immintrin.h>

#include "amx.h"
#include "linear_kernels.h"

#define ROWS 32    /* rows of a block: two tiles */
#define MIN_ROWS 5 /* fewer: the ISA path */

static int64_t round64(int64_t n) { return (n + 63) & ~(int64_t)63; }

/* k pairs of an activation row: whole tile steps, zero past K */
static int64_t row_pairs(const dn_linear_w *w) { return (w->kp / 2 + DN_AMX_PAIRS - 1) / DN_AMX_PAIRS * DN_AMX_PAIRS; }
static int64_t padded_rows(int64_t m) { return (m + ROWS - 1) / ROWS * ROWS; }
static int64_t act_bytes(const dn_linear_w *w, int64_t m) { return round64(padded_rows(m) * row_pairs(w) * 4); }

/* Per thread: the fp32 block [ROWS][32] and the zero-padded last k pairs of 32 columns [16][32]. */
#define THREAD_BYTES (ROWS * 32 * 4 + DN_AMX_PAIRS * 32 * 4)

static size_t scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) {
    if (m < MIN_ROWS) return dn_linear_isa_kernels()->scratch_bytes(w, m, nthreads);
    return (size_t)(act_bytes(w, m) + (int64_t)nthreads * THREAD_BYTES);
}

/* Rows [r0, r1) of x [m][k] as bf16 pairs into xa [.][lda]; rows past m and pairs past K zero. */
DN_TARGET_AVX512 static void convert_rows_avx512(const float *x, int64_t m, int64_t k, uint32_t *xa, int64_t lda,
                                                 int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        uint32_t *d = xa + r * lda;
        for (int64_t kk = 0; kk < 2 * lda; kk += 32) {
            int64_t left = r < m ? k - kk : 0;
            __mmask16 lo = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            __mmask16 hi = left >= 32 ? 0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            const float *s = x + r * k + kk;
            __m512 a = _mm512_maskz_loadu_ps(lo, s), b = _mm512_maskz_loadu_ps(hi, s + 16);
            _mm512_storeu_si512(d + kk / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
    }
}

static void convert_rows_portable(const float *x, int64_t m, int64_t k, uint32_t *xa, int64_t lda, int64_t r0,
                                  int64_t r1) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t p = 0; p < lda; p++) {
            uint16_t lo = r < m && 2 * p < k ? dn_f32_to_bf16(x[r * k + 2 * p]) : 0;
            uint16_t hi = r < m && 2 * p + 1 < k ? dn_f32_to_bf16(x[r * k + 2 * p + 1]) : 0;
            xa[r * lda + p] = (uint32_t)hi << 16 | lo;
        }
}

/* The last k pairs (past the whole tile steps) of columns [col, col + 32) of a panel `width`
 * wide, zero-padded to one step; columns past the panel zero too. */
static void copy_tail(const uint32_t *panel, int width, int64_t pairs, int col, uint32_t *tail) {
    int64_t first = pairs / DN_AMX_PAIRS * DN_AMX_PAIRS;
    memset(tail, 0, DN_AMX_PAIRS * 32 * 4);
    int cols = width - col < 32 ? width - col : 32;
    for (int64_t p = first; p < pairs; p++) memcpy(tail + (p - first) * 32, panel + p * width + col, cols * 4);
}

/* y[r][col..] = c[r][..] (+ bias) for rows [0, rows) and the first `valid` (<= 32) columns. */
DN_TARGET_AVX512 static void store_block_avx512(const float *c, int64_t rows, float *y, int64_t ldy,
                                                const float *bias, int valid) {
    for (int v = 0; v < 2 && 16 * v < valid; v++) {
        int left = valid - 16 * v;
        __mmask16 k = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        __m512 b = bias ? _mm512_maskz_loadu_ps(k, bias + 16 * v) : _mm512_setzero_ps();
        for (int64_t r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(y + r * ldy + 16 * v, k, _mm512_add_ps(_mm512_loadu_ps(c + r * 32 + 16 * v), b));
    }
}

static void store_block_portable(const float *c, int64_t rows, float *y, int64_t ldy, const float *bias, int valid) {
    int cols = valid < 32 ? valid : 32;
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) y[r * ldy + j] = c[r * 32 + j] + (bias ? bias[j] : 0.0f);
}

static void gemm(const dn_linear_call *c, int t, int nt) {
    const dn_amx_ops *ops = dn_amx() == DN_AMX_TILES ? &dn_amx_tile_ops : &dn_amx_emulated_ops;
    const int avx512 = dn_isa() == DN_ISA_AVX512;
    const dn_linear_w *w = c->w;
    const int64_t m = c->m, n = w->n, lda = row_pairs(w), pairs = w->kp / 2, steps = pairs / DN_AMX_PAIRS;
    uint32_t *xa = (uint32_t *)c->scratch;
    float *block = (float *)(c->scratch + act_bytes(w, m) + (int64_t)t * THREAD_BYTES);
    uint32_t *tail = (uint32_t *)(block + ROWS * 32);
    int64_t r0, r1;
    dn_split(padded_rows(m), t, nt, &r0, &r1);
    (avx512 ? convert_rows_avx512 : convert_rows_portable)(c->x, m, w->k, xa, lda, r0, r1);
#pragma omp barrier
    dn_linear_part share = dn_linear_share(w, m, ROWS, t, nt);
    int64_t q0, q1, m0, m1;
    dn_linear_panels(&share, &q0, &q1);
    ops->begin();
    for (int64_t q = q0; q < q1; q++) {
        dn_linear_rows(&share, q, &m0, &m1);
        const uint32_t *panel = (const uint32_t *)dn_linear_panel(w, q);
        const int width = dn_linear_width(w, q), valid = dn_linear_valid(w, q);
        for (int col = 0; col < width; col += 32) {
            const int ntiles = width - col >= 32 ? 2 : 1;
            if (steps * DN_AMX_PAIRS < pairs) copy_tail(panel, width, pairs, col, tail);
            for (int64_t r = m0; r < m1; r += ROWS) {
                const int64_t rows = m1 - r < ROWS ? m1 - r : ROWS;
                ops->block_bf16(xa + r * lda, lda, panel + col, width, steps,
                                steps * DN_AMX_PAIRS < pairs ? tail : NULL, rows > 16 ? 2 : 1, ntiles, block, 32);
                (avx512 ? store_block_avx512 : store_block_portable)(
                    block, rows, c->y + r * n + q * DN_LINEAR_NR + col, n,
                    c->bias ? c->bias + q * DN_LINEAR_NR + col : NULL, valid - col);
            }
        }
    }
    ops->end();
}

static void run(const dn_linear_call *c, int t, int nt) {
    if (c->m < MIN_ROWS) dn_linear_isa_kernels()->run(c, t, nt);
    else gemm(c, t, nt);
}

static int64_t units(const dn_linear_w *w, int64_t m) {
    const dn_linear_kernels *isa = dn_linear_isa_kernels();
    if (m < MIN_ROWS) return isa->units ? isa->units(w, m) : INT64_MAX;
    return w->npanels * ((m + ROWS - 1) / ROWS);
}

/* No fused act(gate)*up: dn_linear_glu runs this, then dn_glu_mul. */
const dn_linear_kernels dn_linear_amx = {scratch_bytes, run, NULL, units};
