/* i8q/u4q linear on AVX512-VNNI (layout and math in linear.h): the activations quantized to
 * int8 per 32 k, then per block one vpdpbusd per 4 k x 16 columns (u8 weight codes x s8
 * activations, exact int32 sums), the block's int32 sums scaled once by scale * d into fp32,
 * and the zero point subtracted once per group. One row (decode) streams a 64-column panel
 * through one tile; more rows take it a chunk of k at a time, every MR-row tile of up to
 * DN_Q8_ROW_BLOCK rows over the chunk from L1 while the next chunk is prefetched. int8 codes are
 * half the bytes of bf16, uint4 a quarter, and the arithmetic stays far below the memory time,
 * so a decode step runs at the speed of its bytes. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include "linear_kernels.h"
#include "q8_params_avx512.h"

#define INLINE static inline __attribute__((always_inline))
#define MR 2 /* rows per tile: 2 x 4 int32 + 2 x 4 fp32 accumulators + 8 code registers */

int dn_linear_vnni(void) {
    static int vnni = -1;
    if (vnni < 0) {
        __builtin_cpu_init();
        vnni = __builtin_cpu_supports("avx512vnni") != 0;
    }
    return vnni && dn_isa() == DN_ISA_AVX512;
}

INLINE __mmask16 col_mask(int valid, int v) {
    int left = valid - 16 * v;
    return left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
}

INLINE int32_t quad(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* A u4q panel unpacked once for many row tiles: its codes one byte each in i8q's order
 * ([k/4][width][4]), per group the fp32 scale and scale*zero of each column. */
typedef struct {
    uint8_t *codes;
    float *scale, *sz; /* [k/group][width] */
} unpacked;

/* Groups [g0, g1) of x[r] . W^T for `mr` rows over one panel `nv` x 16 columns wide, from the
 * packed panel (u4: u4q, else i8q), or from up (pass u4 = 0) when it is not NULL; the sums so far
 * come from acc (rows of 64) unless g0 is 0, and go back there unless g1 is the last group, where
 * y[r][0..valid) gets them. */
INLINE void tile(const int mr, const int nv, const int u4, const uint8_t *panel, const unpacked *up, int width,
                 int64_t group, int64_t k, int64_t g0, int64_t g1, float *acc, const dn_q8_act *a, int64_t row0,
                 float *y, int64_t ldy, const float *bias, int valid, dn_q8_ahead pf, __m512 unscale) {
    const dn_wtype t = u4 ? DN_W_U4Q : DN_W_I8Q;
    const int64_t ng = k / group, nb = k / DN_Q8_BLOCK;
    const __m512i low = _mm512_set1_epi8(15);
    __m512 total[MR][4];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++)
            total[r][v] = g0 ? _mm512_loadu_ps(acc + r * DN_LINEAR_NR + 16 * v) : _mm512_setzero_ps();
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *blk = up ? NULL : dn_linear_group_at(t, group, panel, width, g);
        const uint8_t *codes = up ? up->codes + g * group * width : blk + dn_linear_group_head(t, width);
        __m512 s[4], z[4]; /* the group's scale and scale*zero, 16 columns a vector */
        for (int v = 0; v < nv; v++) {
            if (up) {
                s[v] = _mm512_loadu_ps(up->scale + g * width + 16 * v);
                z[v] = _mm512_loadu_ps(up->sz + g * width + 16 * v);
            } else if (u4) {
                u4_params16(panel, blk, width, 16 * v, &s[v], &z[v]);
            } else { /* i8q: fp16 scales, then fp16 scale*zeros */
                s[v] = half16((const uint16_t *)blk + 16 * v);
                z[v] = half16((const uint16_t *)blk + width + 16 * v);
            }
        }
        for (int l = 0; l < pf.lines; l++) _mm_prefetch(pf.at + ((g - g0) * pf.lines + l) * 64, _MM_HINT_T1);
        for (int64_t b = 0; b < group / DN_Q8_BLOCK; b++) {
            const int64_t k0 = g * group + b * DN_Q8_BLOCK;
            /* one row: two sums per column (even / odd steps), so no chain of 8 dependent vpdpbusd */
            __m512i dot[MR][4], odd[4];
            for (int r = 0; r < mr; r++)
                for (int v = 0; v < nv; v++) dot[r][v] = _mm512_setzero_si512();
            for (int v = 0; v < nv; v++) odd[v] = _mm512_setzero_si512();
            if (u4) {
                for (int j = 0; j < DN_Q8_BLOCK / 8; j++) {
                    const uint8_t *row = codes + (b * DN_Q8_BLOCK / 8 + j) * width * 4;
                    __m512i lo[4], hi[4];
                    for (int v = 0; v < nv; v++) {
                        __m512i raw = _mm512_loadu_si512(row + 64 * v);
                        lo[v] = _mm512_and_si512(raw, low);
                        hi[v] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
                    }
                    for (int r = 0; r < mr; r++) {
                        const int8_t *xr = a->xq + (row0 + r) * k + k0 + 8 * j;
                        __m512i x0 = _mm512_set1_epi32(quad(xr)), x1 = _mm512_set1_epi32(quad(xr + 4));
                        for (int v = 0; v < nv; v++) {
                            dot[r][v] = _mm512_dpbusd_epi32(dot[r][v], lo[v], x0);
                            if (mr == 1) odd[v] = _mm512_dpbusd_epi32(odd[v], hi[v], x1);
                            else dot[r][v] = _mm512_dpbusd_epi32(dot[r][v], hi[v], x1);
                        }
                    }
                }
            } else if (mr == 1) {
                /* two steps a turn, not unrolled further: the block unrolled (8 steps) streamed
                 * from DRAM 16-24% slower a byte than bf16's GEMV, this as fast (an edit here
                 * moves the other tiles' code too: measure M 2-32 beside it) */
#pragma GCC unroll 1
                for (int j = 0; j < DN_Q8_BLOCK / 4; j += 2) {
                    const uint8_t *row = codes + (b * DN_Q8_BLOCK / 4 + j) * width * 4;
                    const int8_t *xr = a->xq + row0 * k + k0 + 4 * j;
                    __m512i q0[4], q1[4];
                    for (int v = 0; v < nv; v++) q0[v] = _mm512_loadu_si512(row + 64 * v);
                    for (int v = 0; v < nv; v++) q1[v] = _mm512_loadu_si512(row + width * 4 + 64 * v);
                    const __m512i x0 = _mm512_set1_epi32(quad(xr)), x1 = _mm512_set1_epi32(quad(xr + 4));
                    for (int v = 0; v < nv; v++) {
                        dot[0][v] = _mm512_dpbusd_epi32(dot[0][v], q0[v], x0);
                        odd[v] = _mm512_dpbusd_epi32(odd[v], q1[v], x1);
                    }
                }
            } else {
#pragma GCC unroll 8
                for (int j = 0; j < DN_Q8_BLOCK / 4; j++) {
                    const uint8_t *row = codes + (b * DN_Q8_BLOCK / 4 + j) * width * 4;
                    __m512i q[4];
                    for (int v = 0; v < nv; v++) q[v] = _mm512_loadu_si512(row + 64 * v);
                    for (int r = 0; r < mr; r++) {
                        __m512i xv = _mm512_set1_epi32(quad(a->xq + (row0 + r) * k + k0 + 4 * j));
                        for (int v = 0; v < nv; v++) dot[r][v] = _mm512_dpbusd_epi32(dot[r][v], q[v], xv);
                    }
                }
            }
            if (mr == 1)
                for (int v = 0; v < nv; v++) dot[0][v] = _mm512_add_epi32(dot[0][v], odd[v]);
            for (int r = 0; r < mr; r++) {
                __m512 d = _mm512_set1_ps(a->xd[(row0 + r) * nb + k0 / DN_Q8_BLOCK]);
                for (int v = 0; v < nv; v++)
                    total[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][v]), _mm512_mul_ps(s[v], d),
                                                  total[r][v]);
            }
        }
        for (int v = 0; v < nv; v++)
            for (int r = 0; r < mr; r++)
                total[r][v] = _mm512_fnmadd_ps(z[v], _mm512_set1_ps(a->xg[(row0 + r) * ng + g]), total[r][v]);
    }
    if (g1 < ng) {
        for (int r = 0; r < mr; r++)
            for (int v = 0; v < nv; v++) _mm512_storeu_ps(acc + r * DN_LINEAR_NR + 16 * v, total[r][v]);
        return;
    }
    for (int v = 0; v < nv; v++) {
        __mmask16 m = col_mask(valid, v);
        __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + 16 * v) : _mm512_setzero_ps();
        for (int r = 0; r < mr; r++)
            _mm512_mask_storeu_ps(y + (row0 + r) * ldy + 16 * v, m, _mm512_fmadd_ps(total[r][v], unscale, bv));
    }
}

/* 32 floats -> int8 codes and their scale, as dn_q8_quantize_block (rint, nearest even). */
static int quantize_block(const float *x, int8_t *q, float *d) {
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    __m512 id = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, id));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qb));
    *d = amax / 127.0f;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}

#define NV_TILE(MR_, NV, U4, UP)                                                                        \
    tile(MR_, NV, U4, panel, UP, width, w->group, w->k, g0, g1, acc + (i - r0) * DN_LINEAR_NR, &a, i,      \
         c->y + col0, w->n, bias, valid, pf, unscale)
#define NV_TILES(MR_, U4, UP)                         \
    switch (nv) {                                     \
    case 1: NV_TILE(MR_, 1, U4, UP); break;           \
    case 2: NV_TILE(MR_, 2, U4, UP); break;           \
    case 3: NV_TILE(MR_, 3, U4, UP); break;           \
    default: NV_TILE(MR_, 4, U4, UP); break;          \
    }

/* u4q panels are unpacked first for at least this many rows: the nibbles' masks and shifts, done
 * once instead of once per 2-row tile, cost more than a dpbusd each (u4q ran at 0.4 of i8q's
 * GFLOP/s at 32 rows and more). */
#define UNPACK_MIN_ROWS 8

/* Bytes of a thread's unpacked panel. */
static size_t unpacked_bytes(const dn_linear_w *w) {
    return (size_t)DN_LINEAR_NR * w->k + 2 * (size_t)(w->k / w->group) * DN_LINEAR_NR * sizeof(float);
}

static int unpacks(const dn_linear_w *w, int64_t m) { return w->wtype == DN_W_U4Q && m >= UNPACK_MIN_ROWS; }

static size_t scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) {
    return dn_q8_scratch_bytes(w, m, nthreads) + (unpacks(w, m) ? nthreads * unpacked_bytes(w) : 0);
}

/* Groups [g0, g1) of the u4q panel: codes one a byte in i8q's order, per group fp32 parameters. */
static void unpack_groups(const dn_linear_w *w, const uint8_t *panel, int width, int64_t g0, int64_t g1,
                          unpacked *up) {
    const int64_t steps = w->group / 8; /* 8 k of 4-byte code pairs a step */
    const __m512i low = _mm512_set1_epi8(15);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *blk = dn_linear_group_at(DN_W_U4Q, w->group, panel, width, g);
        const uint8_t *codes = blk + dn_linear_group_head(DN_W_U4Q, width);
        uint8_t *out = up->codes + g * w->group * width;
        for (int v = 0; v < width / 16; v++) {
            __m512 s, sz;
            u4_params16(panel, blk, width, 16 * v, &s, &sz);
            _mm512_storeu_ps(up->scale + g * width + 16 * v, s);
            _mm512_storeu_ps(up->sz + g * width + 16 * v, sz);
        }
        for (int64_t j = 0; j < steps; j++)
            for (int v = 0; v < width / 16; v++) {
                __m512i raw = _mm512_loadu_si512(codes + j * width * 4 + 64 * v);
                _mm512_storeu_si512(out + (2 * j) * width * 4 + 64 * v, _mm512_and_si512(raw, low));
                _mm512_storeu_si512(out + (2 * j + 1) * width * 4 + 64 * v,
                                    _mm512_and_si512(_mm512_srli_epi16(raw, 4), low));
            }
    }
}

static void run(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    dn_q8_act a = dn_q8_prepare(c, t, nt, quantize_block);
    int64_t p0, p1, m0, m1;
    int u4 = w->wtype == DN_W_U4Q;
    unpacked up = {NULL, NULL, NULL};
    if (unpacks(w, c->m)) {
        up.codes = c->scratch + dn_q8_scratch_bytes(w, c->m, nt) + t * unpacked_bytes(w);
        up.scale = (float *)(up.codes + DN_LINEAR_NR * w->k);
        up.sz = up.scale + (w->k / w->group) * DN_LINEAR_NR;
    }
    float acc[DN_Q8_ROW_BLOCK * DN_LINEAR_NR] __attribute__((aligned(64))); /* the row block's sums between chunks */
    dn_linear_part share = dn_linear_share(w, c->m, MR, t, nt);
    dn_linear_panels(&share, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        dn_linear_rows(&share, p, &m0, &m1);
        const uint8_t *panel = dn_linear_panel(w, p);
        int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p), nv = width / 16;
        int64_t col0 = p * DN_LINEAR_NR;
        const float *bias = c->bias ? c->bias + col0 : NULL;
        const __m512 unscale = _mm512_set1_ps(w->unscale);
        int64_t tiles = (m1 - m0 + MR - 1) / MR, ng = w->k / w->group;
        const int unpack = up.codes && m1 - m0 >= UNPACK_MIN_ROWS;
        /* Several row tiles take the panel a chunk of k at a time, all of them over one chunk
         * before the next: the chunk's weights come from DRAM once and stay in L1 for the
         * others (a tile over the whole panel at a time waited on DRAM alone, then computed
         * from L2 alone). The next chunk's bytes are asked of L2 a few lines a group while
         * this chunk's tiles compute, so the stream from memory runs beside the arithmetic. */
        const int64_t chunk = tiles > 1 ? (DN_Q8_CHUNK_K + w->group - 1) / w->group : ng;
        const int ahead_on = tiles > 1 && m1 - m0 <= DN_Q8_ROW_BLOCK; /* more rows: compute-bound */
        for (int64_t r0 = m0; r0 < m1; r0 += DN_Q8_ROW_BLOCK) {
            const int64_t r1 = r0 + DN_Q8_ROW_BLOCK < m1 ? r0 + DN_Q8_ROW_BLOCK : m1;
            for (int64_t g0 = 0, g1; g0 < ng; g0 = g1) {
                g1 = g0 + chunk < ng ? g0 + chunk : ng;
                if (unpack && r0 == m0) unpack_groups(w, panel, width, g0, g1, &up);
                const dn_q8_prefetch plan =
                    dn_q8_prefetch_plan(w, p, p1, width, g0, g1, chunk, ahead_on, (r1 - r0 + MR - 1) / MR);
                for (int64_t i = r0; i < r1; i += MR) {
                    const dn_q8_ahead pf = dn_q8_ahead_of(&plan, (i - r0) / MR);
                    if (r1 - i >= 2) {
                        if (unpack) NV_TILES(2, 0, &up) else if (u4) NV_TILES(2, 1, NULL) else NV_TILES(2, 0, NULL)
                    } else {
                        if (unpack) NV_TILES(1, 0, &up) else if (u4) NV_TILES(1, 1, NULL) else NV_TILES(1, 0, NULL)
                    }
                }
            }
        }
    }
}

static int64_t units(const dn_linear_w *w, int64_t m) { return w->npanels * ((m + MR - 1) / MR); }

const dn_linear_kernels dn_linear_q8_vnni = {scratch_bytes, run, NULL, units};

#pragma GCC pop_options
