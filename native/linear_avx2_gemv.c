/* Linear layer, AVX2 GEMV for M <= GEMV_ROWS (decode and small batches): bound by the weight stream, so every
 * weight register goes from its load straight into the FMAs, nothing written back. bf16 pairs
 * widen by a shift (even k) and a mask (odd k); i8/u4 codes zero-extend and convert, and never
 * dequantize per weight: per group they sum q * x and fix up once,
 * sum(w x) = scale * (sum(q x) - zero * sum(x)).
 * A panel runs block by block (KB k pairs of bf16, one group of i8/u4); with several rows a
 * block is cut into column blocks (mb * nv accumulators stay in 16 registers) that rerun it
 * from L1 while the next block is prefetched, whose lines the hardware prefetcher would not
 * fetch in time for a stream read in pieces: bf16's column blocks each ask for their share of
 * them, i8/u4's first column block for all. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "linear_avx2.h"

#define KB 64 /* k pairs per bf16 block: 64 x 64 columns x 4 bytes = 16 KB, in L1 */

/* Lines [kp * per_kp, (kp + 1) * per_kp) of the next block. */
INLINE void prefetch_row(const uint8_t *next, int64_t kp, const int per_kp) {
#pragma GCC unroll 4
    for (int l = 0; l < per_kp; l++) _mm_prefetch((const char *)next + (kp * per_kp + l) * 64, _MM_HINT_T0);
}

/* acc[r * nv + v] += we * x[r][0] + wo * x[r][1] for every row: one column register, one k
 * pair. The two products meet before the accumulator, whose dependency chain is then one add
 * (3 cycles, on the adder pipes) per k pair: few accumulators still keep both FMA pipes busy. */
INLINE void fma_col(const int mb, const int nv, const int v, __m256 we, __m256 wo, const float *x,
                    int64_t ldx, __m256 *acc) {
#pragma GCC unroll 4
    for (int r = 0; r < mb; r++) {
        __m256 p = _mm256_mul_ps(we, _mm256_broadcast_ss(x + r * ldx));
        p = _mm256_fmadd_ps(wo, _mm256_broadcast_ss(x + r * ldx + 1), p);
        acc[r * nv + v] = _mm256_add_ps(acc[r * nv + v], p);
    }
}

/* The same for nv <= 2 registers at once, row by row: with 3-4 rows, 8 accumulators chained
 * by FMAs keep the pipes busy, and only 4 weight and 2 x registers are live beside them. */
INLINE void fma_rows(const int mb, const int nv, const __m256 *we, const __m256 *wo,
                     const float *x, int64_t ldx, __m256 *acc) {
#pragma GCC unroll 4
    for (int r = 0; r < mb; r++) {
        __m256 xe = _mm256_broadcast_ss(x + r * ldx), xo = _mm256_broadcast_ss(x + r * ldx + 1);
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++)
            acc[r * nv + v] = _mm256_fmadd_ps(wo[v], xo, _mm256_fmadd_ps(we[v], xe, acc[r * nv + v]));
    }
}

/* tot[r][8v..] += x rows . bf16 pairs over np k pairs, 8 * nv columns.
 * pairs [np][width] (even k low, odd k high); x [mb][ldx], zero past K. */
INLINE void block_bf16(const int mb, const int nv, const uint32_t *pairs, int width, int64_t np,
                       const float *x, int64_t ldx, float *tot, const uint8_t *next, int per_kp) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000);
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < mb * nv; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t kp = 0; kp < np; kp++) {
        const uint32_t *row = pairs + kp * width;
        if (next) prefetch_row(next, kp, per_kp);
        __m256 we[8], wo[8];
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(row + 8 * v));
            we[v] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
            wo[v] = _mm256_castsi256_ps(_mm256_and_si256(raw, hi));
            if (mb <= 2) fma_col(mb, nv, v, we[v], wo[v], x + 2 * kp, ldx, acc);
        }
        if (mb > 2) fma_rows(mb, nv, we, wo, x + 2 * kp, ldx, acc);
    }
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 4
        for (int r = 0; r < mb; r++) {
            float *t = tot + r * NR + 8 * v;
            _mm256_storeu_ps(t, _mm256_add_ps(_mm256_loadu_ps(t), acc[r * nv + v]));
        }
}

/* The group's fix-up: tot[r][8v..] += scale * (acc - zero * xs[r]), xs [mb][ldxs] the rows'
 * sums of x over the group. */
INLINE void fix_up(const int mb, const int nv, const __m256 *acc, const float *scale,
                   const float *zero, const float *xs, int64_t ldxs, float *tot) {
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) {
        __m256 s = _mm256_loadu_ps(scale + 8 * v), z = _mm256_loadu_ps(zero + 8 * v);
#pragma GCC unroll 4
        for (int r = 0; r < mb; r++) {
            float *t = tot + r * NR + 8 * v;
            __m256 q = _mm256_fnmadd_ps(z, _mm256_broadcast_ss(xs + r * ldxs), acc[r * nv + v]);
            _mm256_storeu_ps(t, _mm256_fmadd_ps(s, q, _mm256_loadu_ps(t)));
        }
    }
}

/* One i8 group, 8 * nv columns: codes [np][width][2] (k even, k odd per column). */
INLINE void block_i8(const int mb, const int nv, const uint8_t *codes, int width, int64_t np,
                     const float *x, int64_t ldx, const float *scale, const float *zero,
                     const float *xs, int64_t ldxs, float *tot, const uint8_t *next) {
    const __m256i low = _mm256_set1_epi32(0xff);
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < mb * nv; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t kp = 0; kp < np; kp++) {
        const uint8_t *row = codes + kp * 2 * width;
        if (next) prefetch_row(next, kp, NR / 32);
        __m256 qe[8], qo[8];
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            /* a 16-bit lane per column: k even in the low byte, k odd in the high */
            __m256i q = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 16 * v)));
            qe[v] = _mm256_cvtepi32_ps(_mm256_and_si256(q, low));
            qo[v] = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 8));
            if (mb <= 2) fma_col(mb, nv, v, qe[v], qo[v], x + 2 * kp, ldx, acc);
        }
        if (mb > 2) fma_rows(mb, nv, qe, qo, x + 2 * kp, ldx, acc);
    }
    fix_up(mb, nv, acc, scale, zero, xs, ldxs, tot);
}

/* One u4 group, 8 * nv columns (nv even): codes [np][width / 16][16], byte j of a chunk is
 * column j/2 (low nibble) and j/2 + 8 (high nibble) at k parity j%2 (linear.h). */
INLINE void block_u4(const int mb, const int nv, const uint8_t *codes, int width, int64_t np,
                     const float *x, int64_t ldx, const float *scale, const float *zero,
                     const float *xs, int64_t ldxs, float *tot, const uint8_t *next) {
    const __m256i nib = _mm256_set1_epi32(15);
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < mb * nv; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t kp = 0; kp < np; kp++) {
        const uint8_t *row = codes + kp * width;
        if (next && kp % 2 == 0) prefetch_row(next, kp / 2, NR / 32);
#pragma GCC unroll 4
        for (int v = 0; v < nv; v += 2) {
            /* a 16-bit lane per column pair (c, c + 8): nibbles c even, c+8 even, c odd, c+8 odd */
            __m256i q = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 8 * v)));
            __m256 le = _mm256_cvtepi32_ps(_mm256_and_si256(q, nib));
            __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(q, 8), nib));
            __m256 he = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(q, 4), nib));
            __m256 ho = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 12));
            if (mb == 1) { /* 8 accumulators, a 4-iteration loop apart: two chained FMAs hide in it */
                const __m256 we[2] = {le, he}, wo[2] = {lo, ho};
                fma_rows(1, 2, we, wo, x + 2 * kp, ldx, acc + v);
            } else {
                fma_col(mb, nv, v, le, lo, x + 2 * kp, ldx, acc);
                fma_col(mb, nv, v + 1, he, ho, x + 2 * kp, ldx, acc);
            }
        }
    }
    fix_up(mb, nv, acc, scale, zero, xs, ldxs, tot);
}

/* 8-column registers per column block at mb rows: 8 accumulators at most, and one or two rows'
 * broadcasts hoisted out of the column loop leave no more than 16 registers live. */
static int block_nv(int mb, int left) {
    int nv = mb == 1 ? 8 : 2;
    while (nv > left / 8) nv /= 2;
    return nv;
}

#define MB_NV_CASES_OF(MB_, F, ...) \
    switch ((MB_) * 16 + nv) { \
    case 1 * 16 + 8: F(1, 8, __VA_ARGS__); break; \
    case 1 * 16 + 4: F(1, 4, __VA_ARGS__); break; \
    case 1 * 16 + 2: F(1, 2, __VA_ARGS__); break; \
    case 2 * 16 + 2: F(2, 2, __VA_ARGS__); break; \
    case 3 * 16 + 2: F(3, 2, __VA_ARGS__); break; \
    default: F(4, 2, __VA_ARGS__); break; \
    }

/* tot [mb][NR] = rows of x . panel p (before bias). x [mb][ldx] zero past K; xs [mb][ngroups]. */
static void gemv_panel(const dn_linear_w *w, int64_t p, int mb, const float *x, int64_t ldx,
                       const float *xs, float *tot) {
    const uint8_t *panel = dn_linear_panel(w, p);
    const int width = dn_linear_width(w, p);
    const int64_t kpairs = w->kp / 2;
    if (w->wtype == DN_W_BF16) {
        const uint32_t *pairs = (const uint32_t *)panel; /* [kpairs][width] */
        for (int64_t k0 = 0; k0 < kpairs; k0 += KB) {
            int64_t np = kpairs - k0 < KB ? kpairs - k0 : KB;
            const uint32_t *blk = pairs + k0 * width;
            const float *xb = x + 2 * k0;
            /* every column block asks for its share of the next block's lines, spread over its k
             * pairs: the first asking for all of them in its quarter of the time stalled on
             * the misses, and with 2-4 rows the stream then waited on the arithmetic (0.5 of
             * the bandwidth). More than 4 rows run 4 at a time over the block from L1 (one
             * column register for 8 rows loads 2 broadcasts per 2 FMAs). */
            int calls = 0;
            for (int r0 = 0; r0 < mb; r0 += 4) calls += width / (8 * block_nv(mb - r0 < 4 ? mb - r0 : 4, width));
            const int share = (int)((np * NR * 4 / 64 + calls - 1) / calls);
            const int per_kp = (int)((share + np - 1) / np);
            for (int r0 = 0, call = 0; r0 < mb; r0 += 4) {
                const int rows = mb - r0 < 4 ? mb - r0 : 4;
                for (int c0 = 0, nv; c0 < width; c0 += 8 * nv, call++) {
                    nv = block_nv(rows, width - c0);
                    const uint8_t *next = width == NR ? (const uint8_t *)(blk + np * width) + call * share * 64 : NULL;
#define BF16(MB, NV, ...) \
    block_bf16(MB, NV, blk + c0, width, np, xb + r0 * ldx, ldx, tot + r0 * NR + c0, next, per_kp)
                    MB_NV_CASES_OF(rows, BF16, 0)
#undef BF16
                }
            }
        }
        return;
    }
    const int u4 = w->wtype == DN_W_U4;
    const int64_t ngroups = w->k / w->group, gpairs = (w->group + 1) / 2;
    const int64_t gb = dn_linear_group_bytes(w->wtype, w->group, width);
    const int64_t head = dn_linear_group_head(w->wtype, width);
    float u4_scale[NR], u4_zero[NR];
    for (int64_t g = 0; g < ngroups; g++) {
        const uint8_t *blk = dn_linear_group_at(w->wtype, w->group, panel, width, g), *codes = blk + head;
        const float *scale = (const float *)blk, *zero = scale + width;
        if (u4) {
            u4_params(panel, blk, width, u4_scale, u4_zero);
            scale = u4_scale, zero = u4_zero;
        }
        const float *xg = x + g * 2 * gpairs;
        /* the next group's scales and zeros; its codes go row by row below */
        for (int l = 0; l < head; l += 64) _mm_prefetch((const char *)blk + gb + l, _MM_HINT_T0);
        /* the next group's codes, all asked for by the first column block: the quantized
         * blocks' arithmetic is slower than their stream, and sharing the lines out over the
         * column blocks as bf16 does measured 5-15% slower at 2 rows */
        for (int r0 = 0; r0 < mb; r0 += 4) { /* more than 4 rows: 4 at a time, as bf16 */
            const int rows = mb - r0 < 4 ? mb - r0 : 4;
            for (int c0 = 0, nv; c0 < width; c0 += 8 * nv) {
                nv = block_nv(rows, width - c0);
                const uint8_t *next = r0 == 0 && c0 == 0 && width == NR ? codes + gb : NULL;
#define QUANT(MB, NV, KERNEL)                                                                                 \
    KERNEL(MB, NV, codes + (u4 ? c0 : 2 * c0), width, gpairs, xg + r0 * ldx, ldx, scale + c0, zero + c0,     \
           xs + r0 * ngroups + g, ngroups, tot + r0 * NR + c0, next)
                if (u4) MB_NV_CASES_OF(rows, QUANT, block_u4)
                else MB_NV_CASES_OF(rows, QUANT, block_i8)
#undef QUANT
            }
        }
    }
}

/* Per thread: x padded with zeros to an even K [m][kp] (odd K only: the last pair's partner,
 * and an odd group's padding code, meet 0), and group sums xs [m][ngroups]. */
static size_t thread_bytes(const dn_linear_w *w, int64_t m) {
    int64_t ngroups = dn_linear_quantized(w->wtype) ? w->k / w->group : 0;
    return ((size_t)m * (w->kp + ngroups) * 4 + 63) / 64 * 64;
}

size_t dn_avx2_gemv_scratch(const dn_linear_w *w, int64_t m, int nthreads) {
    return (size_t)nthreads * thread_bytes(w, m);
}

void dn_avx2_gemv(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    const int mb = (int)c->m;
    int64_t k = w->k, p0, p1;
    dn_linear_part share = dn_linear_share(w, c->m, GEMV_ROWS, t, nt); /* whole panels, every row */
    dn_linear_panels(&share, &p0, &p1);
    if (p0 >= p1) return;
    float *pad = (float *)(c->scratch + (size_t)t * thread_bytes(w, c->m)), *xs = pad + mb * w->kp;
    const float *x = c->x;
    int64_t ldx = k;
    if (k % 2) {
        for (int r = 0; r < mb; r++) {
            memcpy(pad + r * w->kp, c->x + r * k, k * 4);
            pad[r * w->kp + k] = 0.0f;
        }
        x = pad, ldx = w->kp;
    }
    if (dn_linear_quantized(w->wtype)) {
        int64_t ngroups = k / w->group;
        for (int r = 0; r < mb; r++)
            for (int64_t g = 0; g < ngroups; g++) {
                float s = 0.0f;
                for (int64_t i = 0; i < w->group; i++) s += c->x[r * k + g * w->group + i];
                xs[r * ngroups + g] = s;
            }
    }
    for (int64_t p = p0; p < p1; p++) {
        float tot[GEMV_ROWS * NR] __attribute__((aligned(32))) = {0};
        gemv_panel(w, p, mb, x, ldx, xs, tot);
        gemv_store(tot, mb, dn_linear_width(w, p), dn_linear_valid(w, p), c->bias ? c->bias + p * NR : NULL,
                   c->y + p * NR, w->n);
    }
}

#pragma GCC pop_options
