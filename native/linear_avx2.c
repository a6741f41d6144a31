/* Linear layer, AVX2 + FMA path: everything in fp32. Up to GEMV_ROWS rows the GEMV
 * (linear_avx2_gemv.c) converts weights in registers. Above, each panel is widened to fp32 KC
 * rows at a time into a per-thread slice of 16-column strips, [width/16][KC][16]: one strip is
 * 16 KB of contiguous lines that stays in L1 while the 6 x 16 microkernel (12 accumulators, 2
 * weight loads and 6 broadcasts per k: the two FMA pipes full) runs it for every block of 6
 * rows of an MC-row chunk of x, which stays in L2. f32 panels are used in place, row-major. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "linear_avx2.h"

#define MR 6   /* rows per microkernel: 6 x 2 accumulators + 2 weights + 1 broadcast */
#define KC 256 /* k per slice: 256 x 64 floats = 64 KB in L2, a 16 KB strip in L1 */
#define MC 120 /* rows of x per chunk: 120 x 256 floats = 120 KB, in L2 */
#ifndef KC_FEW
#define KC_FEW 32 /* ... with 1-2 rows: widen and use 8 KB at a time, so the DRAM stream never idles */
#endif

/* y[r][0..8*nv) = sum over kc of x[r][k] * wf[k][0..8*nv) (+ sum[r][..]) (+ bias); `valid`
 * columns stored. x [mr][ldx], wf [kc][ldw], y [mr][ldy], sum NULL or the earlier k slices'
 * partial sums [mr][ldsum] floats (may be y itself). One row takes a whole 64-column panel
 * (weights fold into the FMAs as memory operands); more rows take 16-32 columns, at most 12
 * accumulators. */
INLINE void mk(const int mr, const int nv, int64_t kc, const float *x, int64_t ldx,
               const float *wf, int ldw, float *y, int64_t ldy, const float *sum, int64_t ldsum,
               const float *bias, int valid) {
    __m256 acc[12];
    /* unrolled, or gcc also zeroes acc[] in memory (rep stos) on every call */
#pragma GCC unroll 12
    for (int i = 0; i < mr * nv; i++) acc[i] = _mm256_setzero_ps();
    if (sum) /* written a k slice ago: in L1 by the end of this call, not waited for then */
        for (int r = 0; r < mr; r++)
            for (int v = 0; v < nv; v += 2) _mm_prefetch((const char *)(sum + r * ldsum + 8 * v), _MM_HINT_T0);
    for (int64_t k = 0; k < kc; k++) {
        __m256 w[8];
        for (int v = 0; v < nv; v++) w[v] = _mm256_loadu_ps(wf + k * ldw + 8 * v);
        for (int r = 0; r < mr; r++) {
            __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
            for (int v = 0; v < nv; v++) acc[r * nv + v] = _mm256_fmadd_ps(w[v], xv, acc[r * nv + v]);
        }
    }
    /* fully unrolled, or gcc keeps acc[] in memory and stores it every iteration above */
    if (valid >= 8 * nv) { /* every column real: plain moves (vmaskmovps stores are slow on AMD) */
        /* every load before the first store: when sum is y, rows a multiple of 4 KB apart make
         * a load after a store to another row wait on it as if at the same address */
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            __m256 b = bias ? _mm256_loadu_ps(bias + 8 * v) : _mm256_setzero_ps();
#pragma GCC unroll 6
            for (int r = 0; r < mr; r++) {
                acc[r * nv + v] = _mm256_add_ps(acc[r * nv + v], b);
                if (sum) acc[r * nv + v] = _mm256_add_ps(acc[r * nv + v], _mm256_loadu_ps(sum + r * ldsum + 8 * v));
            }
        }
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
#pragma GCC unroll 6
            for (int r = 0; r < mr; r++) _mm256_storeu_ps(y + r * ldy + 8 * v, acc[r * nv + v]);
        return;
    }
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) {
        __m256i m = lane_mask(valid - 8 * v);
        __m256 b = bias ? _mm256_maskload_ps(bias + 8 * v, m) : _mm256_setzero_ps();
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m256 a = _mm256_add_ps(acc[r * nv + v], b);
            if (sum) a = _mm256_add_ps(a, _mm256_maskload_ps(sum + r * ldsum + 8 * v, m));
            _mm256_maskstore_ps(y + r * ldy + 8 * v, m, a);
        }
    }
}

/* 8-column registers per call for mr rows (see mk). */
static int row_nv(int mr) { return mr == 1 ? 8 : mr <= 3 ? 4 : 2; }

static void mk_any(int mr, int nv, int64_t kc, const float *x, int64_t ldx, const float *wf,
                   int ldw, float *y, int64_t ldy, const float *sum, int64_t ldsum, const float *bias,
                   int valid) {
#define MK(MR_, NV) mk(MR_, NV, kc, x, ldx, wf, ldw, y, ldy, sum, ldsum, bias, valid)
    switch (mr * 16 + nv) {
    case 1 * 16 + 8: MK(1, 8); break;
    case 1 * 16 + 6: MK(1, 6); break;
    case 1 * 16 + 4: MK(1, 4); break;
    case 1 * 16 + 2: MK(1, 2); break;
    case 2 * 16 + 4: MK(2, 4); break;
    case 2 * 16 + 2: MK(2, 2); break;
    case 3 * 16 + 4: MK(3, 4); break;
    case 3 * 16 + 2: MK(3, 2); break;
    case 4 * 16 + 2: MK(4, 2); break;
    case 5 * 16 + 2: MK(5, 2); break;
    default: MK(6, 2); break;
    }
#undef MK
}

/* Where row k, column c of a slice of strips [width/16][kc][16] lives. */
static inline float *strip_at(float *slice, int64_t kc, int64_t k, int c) {
    return slice + (c / 16) * kc * 16 + k * 16 + c % 16;
}

/* bf16 pairs [kc/2][width][2] -> fp32 strips: even k is the low half of each 32-bit pair
 * shifted up, odd k the high half masked. */
static void widen_bf16(const uint16_t *src, int width, int64_t kc, float *dst) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000);
    for (int64_t kp = 0; kp < kc / 2; kp++)
        for (int c = 0; c < width; c += 8) {
            __m256i pairs = _mm256_loadu_si256((const __m256i *)(src + (kp * width + c) * 2));
            float *d = strip_at(dst, kc, 2 * kp, c);
            _mm256_storeu_ps(d, _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)));
            _mm256_storeu_ps(d + 16, _mm256_castsi256_ps(_mm256_and_si256(pairs, hi)));
        }
}

/* 16 codes (k even, k odd) x 8 columns, interleaved, -> rows k and k+1 of q * s + b. */
INLINE void dequant_pairs(__m128i codes, __m256 s, __m256 b, float *row0, float *row1) {
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m128i eo = _mm_shuffle_epi8(codes, split);
    __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eo));
    __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(eo, 8)));
    _mm256_storeu_ps(row0, _mm256_fmadd_ps(q0, s, b));
    _mm256_storeu_ps(row1, _mm256_fmadd_ps(q1, s, b));
}

/* i8/u4 rows [k0, k0+kc) of a panel -> fp32 strips, k0 and kc even (see linear.h);
 * w = q * scale + offset, offset = -zero * scale worked out once per group. */
static void dequant(const dn_linear_w *w, const uint8_t *panel, int width, int64_t k0, int64_t kc,
                    float *dst) {
    const int u4 = w->wtype == DN_W_U4;
    const int64_t gpairs = (w->group + 1) / 2;
    const int64_t rowbytes = u4 ? width : 2 * width;
    const __m128i low = _mm_set1_epi8(15);
    float offset[NR], u4_scale[NR], u4_zero[NR];
    for (int64_t kp0 = k0 / 2, kp1; kp0 < (k0 + kc) / 2; kp0 = kp1) {
        int64_t g = kp0 / gpairs;
        kp1 = (g + 1) * gpairs < (k0 + kc) / 2 ? (g + 1) * gpairs : (k0 + kc) / 2;
        const uint8_t *blk = dn_linear_group_at(w->wtype, w->group, panel, width, g);
        const uint8_t *codes = blk + dn_linear_group_head(w->wtype, width) - g * gpairs * rowbytes;
        const float *scale = (const float *)blk, *zero = scale + width;
        if (u4) {
            u4_params(panel, blk, width, u4_scale, u4_zero);
            scale = u4_scale, zero = u4_zero;
        }
        for (int c = 0; c < width; c++) offset[c] = -zero[c] * scale[c];
        for (int64_t kp = kp0; kp < kp1; kp++) {
            const uint8_t *row = codes + kp * rowbytes;

            for (int c = 0; c < width; c += 8) {
                __m128i q;
                if (!u4) {
                    q = _mm_loadu_si128((const __m128i *)(row + 2 * c));
                } else { /* 16-column chunks: cols 0-7 in the low nibbles, 8-15 in the high */
                    q = _mm_loadu_si128((const __m128i *)(row + (c & ~15)));
                    q = _mm_and_si128(c & 8 ? _mm_srli_epi16(q, 4) : q, low);
                }
                float *d = strip_at(dst, kc, 2 * kp - k0, c);
                dequant_pairs(q, _mm256_loadu_ps(scale + c), _mm256_loadu_ps(offset + c), d, d + 16);
            }
        }
    }
}

static int gemv(const dn_linear_w *w, int64_t m) { return m <= GEMV_ROWS && w->wtype != DN_W_F32; }

static size_t scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) {
    if (gemv(w, m)) return dn_avx2_gemv_scratch(w, m, nthreads);
    return w->wtype == DN_W_F32 ? 0 : (size_t)nthreads * (KC + m) * NR * 4;
}

static void run(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    if (gemv(w, c->m)) {
        dn_avx2_gemv(c, t, nt);
        return;
    }
    int64_t n = w->n, k = w->k, p0, p1, m0, m1;
    dn_linear_part share = dn_linear_share(w, c->m, MR, t, nt);
    dn_linear_panels(&share, &p0, &p1);
    float *slice = (float *)c->scratch + (size_t)t * (KC + c->m) * NR; /* strips [width/16][kb][16] */
    /* [m1 - m0][NR]: a panel's sums over its k slices but the last, which adds them as it stores
     * y. Kept apart from y, whose rows (N floats apart, often a multiple of 4 KB) fall on few
     * cache sets: 0.86 -> 0.93 of the FMA peak over a chunk of x at N 2048 and 12288. */
    float *partial = slice + KC * NR;
    for (int64_t p = p0; p < p1; p++) {
        dn_linear_rows(&share, p, &m0, &m1);
        int64_t kb = m1 - m0 <= 2 ? KC_FEW : KC;
        const uint8_t *panel = dn_linear_panel(w, p);
        int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p);
        for (int64_t k0 = 0; k0 < k; k0 += kb) {
            int64_t kc = k - k0 < kb ? k - k0 : kb;
            int last = k0 + kb >= k;
            const float *bias = last && c->bias ? c->bias + p * NR : NULL;
            if (w->wtype == DN_W_F32) { /* in place: rows of the whole panel */
                const float *wf = (const float *)panel + k0 * width;
                for (int64_t r = m0; r < m1; r += MR) {
                    int mr = m1 - r < MR ? (int)(m1 - r) : MR, nv = row_nv(mr);
                    if (nv > width / 8) nv = width / 8;
                    for (int j = 0; j < width; j += 8 * nv)
                        mk_any(mr, nv, kc, c->x + r * k + k0, k, wf + j, width, c->y + r * n + p * NR + j,
                               n, k0 > 0 ? c->y + r * n + p * NR + j : NULL, n, bias ? bias + j : NULL, valid - j);
                }
                continue;
            }
            /* whole pairs: KC is even, and a final odd k meets its zero partner */
            int64_t kcp = (kc + 1) / 2 * 2;
            if (w->wtype == DN_W_BF16) widen_bf16((const uint16_t *)panel + k0 * width, width, kcp, slice);
            else dequant(w, panel, width, k0, kcp, slice);
            for (int64_t r0 = m0; r0 < m1; r0 += MC) {
                int64_t r1 = m1 - r0 < MC ? m1 : r0 + MC;
                for (int j = 0; j < width; j += 16)
                    for (int64_t r = r0; r < r1; r += MR) {
                        int mr = r1 - r < MR ? (int)(r1 - r) : MR;
                        float *part = partial + (r - m0) * NR + j;
                        if (last) /* y, 'valid' columns */
                            mk_any(mr, 2, kc, c->x + r * k + k0, k, slice + j * kcp, 16, c->y + r * n + p * NR + j,
                                   n, k0 > 0 ? part : NULL, NR, bias ? bias + j : NULL, valid - j);
                        else /* every column of the strip: padded ones are zero */
                            mk_any(mr, 2, kc, c->x + r * k + k0, k, slice + j * kcp, 16, part, NR,
                                   k0 > 0 ? part : NULL, NR, NULL, 16);
                    }
            }
        }
    }
}

/* the GEMV shares whole panels; the GEMM (panel, MR rows) units */
static int64_t units(const dn_linear_w *w, int64_t m) {
    return gemv(w, m) ? w->npanels : w->npanels * ((m + MR - 1) / MR);
}

const dn_linear_kernels dn_linear_avx2 = {scratch_bytes, run, NULL, units};

#pragma GCC pop_options
