/* Linear layer, AVX-512 + BF16 path.
 *
 * M <= GEMV_MAX_M (decode): memory-bound GEMV that keeps activations fp32. Weights are widened
 * to fp32 in registers (bf16: a shift; i8/u4: zero-extend + convert), which is free next to
 * streaming them from DRAM. i8/u4 never dequantize per weight: per group they accumulate
 * sum(q * x) and fix up once, sum(w x) = scale * (sum(q x) - zero * sum(x)).
 *
 * Larger M (batched decode, prefill): activations are rounded to bf16 once into an MR-row
 * blocked copy, and a register-blocked vdpbf16ps microkernel (MR rows x 64 columns, 24 zmm
 * accumulators) runs over each panel KC k at a time. i8/u4 slices are first dequantized to bf16
 * into a per-thread buffer that stays in L1/L2. f32 weights use the same loop nest with an fp32
 * FMA microkernel on the unrounded activations. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include <immintrin.h>

#include "linear_kernels.h"

#define NR DN_LINEAR_NR
#ifndef GEMV_MAX_M
#define GEMV_MAX_M 4 /* rows the fp32 GEMV handles; above, the bf16 microkernel is faster */
#endif
#define MR 6         /* microkernel rows: 6 x 4 accumulators + 4 weight registers */
#ifndef KC
#define KC 2048 /* k per block: a bf16 slice of 64 columns is 256 KB, at home in L2 */
#endif
#define INLINE static inline __attribute__((always_inline))

static int64_t round64(int64_t n) { return (n + 63) & ~(int64_t)63; }

INLINE __mmask16 col_mask(int valid, int v) {
    int left = valid - 16 * v;
    return left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
}

/* y[r][16v..] = acc[r * nv + v] (+ y if accumulate) (+ bias), only the first `valid` columns.
 * Accumulators are one flat array of at most 24, so gcc keeps them all in registers. */
INLINE void store_tile(const int mr, const int nv, __m512 *acc, float *y, int64_t ldy,
                       int accumulate, const float *bias, int valid) {
    /* fully unrolled, or gcc keeps acc[] in memory and stores it in the hot loop */
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) {
        __mmask16 k = col_mask(valid, v);
        __m512 b = bias ? _mm512_maskz_loadu_ps(k, bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_add_ps(acc[r * nv + v], b);
            if (accumulate) a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(k, y + r * ldy + 16 * v));
            _mm512_mask_storeu_ps(y + r * ldy + 16 * v, k, a);
        }
    }
}

/* ---------------------------------------------------------------- GEMV, fp32 activations */

/* f32 panel [k][nv*16]; x [mb][ldx]. */
INLINE void gemv_f32(const int mb, const int nv, const float *wp, int64_t k, const float *x,
                     int64_t ldx, float *y, int64_t ldy, const float *bias, int valid) {
    __m512 acc[16];
    for (int i = 0; i < mb * nv; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        __m512 w[4];
        for (int v = 0; v < nv; v++) w[v] = _mm512_loadu_ps(wp + (kk * nv + v) * 16);
        for (int r = 0; r < mb; r++) {
            __m512 xv = _mm512_set1_ps(x[r * ldx + kk]);
            for (int v = 0; v < nv; v++) acc[r * nv + v] = _mm512_fmadd_ps(w[v], xv, acc[r * nv + v]);
        }
    }
    store_tile(mb, nv, acc, y, ldy, 0, bias, valid);
}

/* bf16 panel [kp/2][nv*16][2]; x [mb][ldx] with ldx >= kp (zero past K). A pair register
 * holds (k even, k odd) per column: the even half is `<< 16`, the odd half a mask. */
INLINE void gemv_bf16(const int mb, const int nv, const uint16_t *wp, int64_t kpairs,
                      const float *x, int64_t ldx, float *y, int64_t ldy, const float *bias,
                      int valid) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000);
    __m512 acc[16];
    for (int i = 0; i < mb * nv; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < kpairs; kp++) {
        __m512 we[4], wo[4];
        for (int v = 0; v < nv; v++) {
            __m512i raw = _mm512_loadu_si512(wp + (kp * nv + v) * 32);
            we[v] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
            wo[v] = _mm512_castsi512_ps(_mm512_and_si512(raw, hi));
        }
        for (int r = 0; r < mb; r++) {
            __m512 xe = _mm512_set1_ps(x[r * ldx + 2 * kp]);
            __m512 xo = _mm512_set1_ps(x[r * ldx + 2 * kp + 1]);
            for (int v = 0; v < nv; v++) {
                acc[r * nv + v] = _mm512_fmadd_ps(we[v], xe, acc[r * nv + v]);
                acc[r * nv + v] = _mm512_fmadd_ps(wo[v], xo, acc[r * nv + v]);
            }
        }
    }
    store_tile(mb, nv, acc, y, ldy, 0, bias, valid);
}

/* Codes of one k pair for 8 columns as fp32 lanes (c0 k0, c0 k1, c1 k0, ...): `h` counts
 * 8-column halves across the panel. */
INLINE __m512 codes_i8(const uint8_t *row, int h) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + 16 * h))));
}
INLINE __m512 nibbles(__m512i bytes, int high) {
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    /* vpermps reads the low 4 bits of each index: the low nibble as is, the high one shifted */
    return _mm512_permutexvar_ps(high ? _mm512_srli_epi32(bytes, 4) : bytes, table);
}
INLINE __m512i bytes_u4(const uint8_t *row, int u) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + 16 * u)));
}

/* Per-column scale/zero of 8-column half h, each repeated for the two k of a pair. */
INLINE __m512 dup_half(const float *v16, int h) {
    const __m512i lo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i hi = _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    return _mm512_permutexvar_ps(h & 1 ? hi : lo, _mm512_loadu_ps(v16 + 16 * (h / 2)));
}

/* A 64-bit broadcast of (x[k], x[k+1]): the pair lanes of the code registers. */
INLINE __m512 bcast_pair(const float *p) {
    double d;
    memcpy(&d, p, 8);
    return _mm512_castpd_ps(_mm512_set1_pd(d));
}

/* i8 panel, `mb` rows, `cv` 8-column halves at a time (mb * cv accumulators).
 * x [mb][ldx] (zero past K), xs [mb][ngroups][2]: per-group sums of x over even / odd k. */
INLINE void gemv_i8(const int mb, const int cv, const uint8_t *panel, int width,
                       int64_t ngroups, int64_t group, const float *x, int64_t ldx,
                       const float *xs, float *y, int64_t ldy, const float *bias, int valid) {
    const int halves = width / 8;
    const int64_t gpairs = (group + 1) / 2, gb = dn_linear_group_bytes(DN_W_I8, group, width);
    __m512 total[4][8]; /* [row][half]: lanes (column, k parity) */
    for (int r = 0; r < mb; r++)
        for (int h = 0; h < halves; h++) total[r][h] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ngroups; g++) {
        const uint8_t *blk = panel + g * gb;
        const float *scale = (const float *)blk, *zero = scale + width;
        const uint8_t *codes = blk + 8 * width;
        /* Touch scale/zero now, although the fix-up reads them after the codes: a stream that
         * steps back every group stalls the hardware prefetcher (2x slower from DRAM). */
        for (int l = 0; l < 8 * width; l += 64) _mm_prefetch((const char *)blk + l, _MM_HINT_T0);
        for (int h0 = 0; h0 < halves; h0 += cv) {
            __m512 acc[4][8];
            for (int r = 0; r < mb; r++)
                for (int j = 0; j < cv; j++) acc[r][j] = _mm512_setzero_ps();
            for (int64_t kp = 0; kp < gpairs; kp++) {
                const uint8_t *row = codes + kp * 2 * width;
                __m512 q[8];
                for (int j = 0; j < cv; j++) q[j] = codes_i8(row, h0 + j);
                for (int r = 0; r < mb; r++) {
                    __m512 xp = bcast_pair(x + r * ldx + g * group + 2 * kp);
                    for (int j = 0; j < cv; j++) acc[r][j] = _mm512_fmadd_ps(q[j], xp, acc[r][j]);
                }
            }
            for (int j = 0; j < cv; j++) {
                __m512 s = dup_half(scale, h0 + j), z = dup_half(zero, h0 + j);
                for (int r = 0; r < mb; r++) {
                    __m512 t = _mm512_fnmadd_ps(z, bcast_pair(xs + (r * ngroups + g) * 2), acc[r][j]);
                    total[r][h0 + j] = _mm512_fmadd_ps(s, t, total[r][h0 + j]);
                }
            }
        }
    }
    /* add the two k parities of each column: evens and odds of a half pair, in column order */
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int u = 0; u < width / 16; u++) {
        __mmask16 k = col_mask(valid, u);
        __m512 b = bias ? _mm512_maskz_loadu_ps(k, bias + 16 * u) : _mm512_setzero_ps();
        for (int r = 0; r < mb; r++) {
            __m512 a = total[r][2 * u], c = total[r][2 * u + 1];
            __m512 sum = _mm512_add_ps(_mm512_permutex2var_ps(a, ev, c), _mm512_permutex2var_ps(a, od, c));
            _mm512_mask_storeu_ps(y + r * ldy + 16 * u, k, _mm512_add_ps(sum, b));
        }
    }
}

/* u4 through vdpbf16ps: codes 0..15 are exact in bf16 (a table lookup, vpermw, turns 32 of them
 * into a register), and x is split into bf16 hi + lo parts whose two dot products keep fp32
 * accuracy (|x - hi - lo| <= 2^-17 |x|). Half the instructions of widening to fp32, so this
 * GEMV runs at memory speed. A 32-byte unit of a k-pair row (two 16-column chunks) widens to
 * A = columns {0-7, 16-23} and B = {8-15, 24-31} of the unit, as (k, k+1) pairs.
 * xhl [mb][ldp][2]: per k pair, hi and lo as bf16 pairs; xs [mb][ngroups][2] group sums. */
INLINE void gemv_u4(const int mb, const int units, const uint8_t *panel, int width,
                    int64_t ngroups, int64_t group, const uint32_t *xhl, int64_t ldp,
                    const float *xs, float *y, int64_t ldy, const float *bias, int valid) {
    const __m512i table = _mm512_setr_epi32(0x3f800000, 0x40404000, 0x40a04080, 0x40e040c0,
                                            0x41104100, 0x41304120, 0x41504140, 0x41704160,
                                            0x3f800000, 0x40404000, 0x40a04080, 0x40e040c0,
                                            0x41104100, 0x41304120, 0x41504140, 0x41704160);
    const __m512i ia = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i ib = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const int split = mb == 1; /* one row: separate lo sums, for more independent chains */
    const int64_t gpairs = group / 2, gb = dn_linear_group_bytes(DN_W_U4, group, width);
    const __mmask32 tail = width % 32 ? 0xffff : 0xffffffff; /* last unit: one chunk or two */
    __m512 total[4][4]; /* [row][unit A, unit B] */
    for (int r = 0; r < mb; r++)
        for (int j = 0; j < 2 * units; j++) total[r][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ngroups; g++) {
        const uint8_t *blk = panel + g * gb;
        const float *scale = (const float *)blk, *zero = scale + width;
        const uint8_t *codes = blk + 8 * width;
        for (int l = 0; l < 8 * width; l += 64) _mm_prefetch((const char *)blk + l, _MM_HINT_T0);
        __m512 acc[4][4], lo[4];
        for (int r = 0; r < mb; r++)
            for (int j = 0; j < 2 * units; j++) acc[r][j] = _mm512_setzero_ps();
        for (int j = 0; j < 2 * units; j++) lo[j] = _mm512_setzero_ps();
        for (int64_t kp = 0; kp < gpairs; kp++) {
            const uint8_t *row = codes + kp * width;
            __m512i q[4];
            for (int u = 0; u < units; u++) {
                __mmask32 k = u == units - 1 ? tail : 0xffffffff;
                __m512i b = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(k, row + 32 * u));
                q[2 * u] = _mm512_permutexvar_epi16(b, table);
                q[2 * u + 1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), table);
            }
            for (int r = 0; r < mb; r++) {
                const uint32_t *xp = xhl + (r * ldp + g * gpairs + kp) * 2;
                __m512bh hi = (__m512bh)_mm512_set1_epi32((int)xp[0]);
                __m512bh lx = (__m512bh)_mm512_set1_epi32((int)xp[1]);
                for (int j = 0; j < 2 * units; j++) {
                    acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)q[j], hi);
                    if (split) lo[j] = _mm512_dpbf16_ps(lo[j], (__m512bh)q[j], lx);
                    else acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)q[j], lx);
                }
            }
        }
        for (int u = 0; u < units; u++) {
            __mmask16 k = u == units - 1 && width % 32 ? 0 : 0xffff;
            __m512 s0 = _mm512_loadu_ps(scale + 32 * u), s1 = _mm512_maskz_loadu_ps(k, scale + 32 * u + 16);
            __m512 z0 = _mm512_loadu_ps(zero + 32 * u), z1 = _mm512_maskz_loadu_ps(k, zero + 32 * u + 16);
            __m512 sa = _mm512_permutex2var_ps(s0, ia, s1), sb = _mm512_permutex2var_ps(s0, ib, s1);
            __m512 za = _mm512_permutex2var_ps(z0, ia, z1), zb = _mm512_permutex2var_ps(z0, ib, z1);
            for (int r = 0; r < mb; r++) {
                __m512 sum = _mm512_set1_ps(xs[(r * ngroups + g) * 2] + xs[(r * ngroups + g) * 2 + 1]);
                __m512 a = acc[r][2 * u], b = acc[r][2 * u + 1];
                if (split) a = _mm512_add_ps(a, lo[2 * u]), b = _mm512_add_ps(b, lo[2 * u + 1]);
                total[r][2 * u] = _mm512_fmadd_ps(sa, _mm512_fnmadd_ps(za, sum, a), total[r][2 * u]);
                total[r][2 * u + 1] = _mm512_fmadd_ps(sb, _mm512_fnmadd_ps(zb, sum, b), total[r][2 * u + 1]);
            }
        }
    }
    for (int u = 0; u < units; u++)
        for (int h = 0; h < 2 && 32 * u + 16 * h < width; h++) {
            __mmask16 k = col_mask(valid, 2 * u + h);
            __m512 b = bias ? _mm512_maskz_loadu_ps(k, bias + 32 * u + 16 * h) : _mm512_setzero_ps();
            for (int r = 0; r < mb; r++) {
                __m512 a = total[r][2 * u], c = total[r][2 * u + 1];
                __m512 cols = h ? _mm512_shuffle_f32x4(a, c, 0xee) : _mm512_shuffle_f32x4(a, c, 0x44);
                _mm512_mask_storeu_ps(y + r * ldy + 32 * u + 16 * h, k, _mm512_add_ps(cols, b));
            }
        }
}

/* 8-column halves per pass: as many as keep mb * cv accumulators within 16 registers. */
static int quant_cv(int mb, int halves) {
    if (mb * halves <= 16) return halves;
    return halves % 4 == 0 ? 4 : 2;
}

#define NV_CASES(F, ...) \
    case 1: F(__VA_ARGS__, 1); break; \
    case 2: F(__VA_ARGS__, 2); break; \
    case 3: F(__VA_ARGS__, 3); break; \
    default: F(__VA_ARGS__, 4); break;

static void gemv_panel(const dn_linear_w *w, int64_t p, int mb, const float *x, int64_t ldx,
                       const float *xs, const uint32_t *xhl, float *y, const float *bias) {
    const uint8_t *panel = dn_linear_panel(w, p);
    int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p), nv = width / 16;
    int64_t col0 = p * NR, ldy = w->n;
    y += col0;
    if (bias) bias += col0;
    if (w->wtype == DN_W_F32) {
#define F32(MB, NV) gemv_f32(MB, NV, (const float *)panel, w->k, x, ldx, y, ldy, bias, valid)
#define F32_MB(MB) switch (nv) { NV_CASES(F32, MB) }
        switch (mb) {
        case 1: F32_MB(1); break;
        case 2: F32_MB(2); break;
        case 3: F32_MB(3); break;
        default: F32_MB(4); break;
        }
    } else if (w->wtype == DN_W_BF16) {
#define BF16(MB, NV) gemv_bf16(MB, NV, (const uint16_t *)panel, w->kp / 2, x, ldx, y, ldy, bias, valid)
#define BF16_MB(MB) switch (nv) { NV_CASES(BF16, MB) }
        switch (mb) {
        case 1: BF16_MB(1); break;
        case 2: BF16_MB(2); break;
        case 3: BF16_MB(3); break;
        default: BF16_MB(4); break;
        }
    } else if (w->wtype == DN_W_U4) {
        int64_t ngroups = w->k / w->group, ldp = w->kp / 2;
#define U4(MB, U) gemv_u4(MB, U, panel, width, ngroups, w->group, xhl, ldp, xs, y, ldy, bias, valid)
#define U4_MB(MB) if (width > 32) U4(MB, 2); else U4(MB, 1);
        switch (mb) {
        case 1: U4_MB(1); break;
        case 2: U4_MB(2); break;
        case 3: U4_MB(3); break;
        default: U4_MB(4); break;
        }
    } else {
        int cv = quant_cv(mb, 2 * nv);
        int64_t ngroups = w->k / w->group;
#define Q(MB, CV) gemv_i8(MB, CV, panel, width, ngroups, w->group, x, ldx, xs, y, ldy, bias, valid)
#define Q_MB(MB) switch (cv) { case 2: Q(MB, 2); break; case 4: Q(MB, 4); break; \
                               case 6: Q(MB, 6); break; default: Q(MB, 8); break; }
        switch (mb) {
        case 1: Q_MB(1); break;
        case 2: Q_MB(2); break;
        case 3: Q_MB(3); break;
        default: Q_MB(4); break;
        }
    }
}

/* Scratch of the GEMV: x padded to even K (when K is odd), the group sums, and for u4 the
 * bf16 hi/lo split of x. */
static void gemv_scratch(const dn_linear_w *w, int64_t m, int64_t *xpad_bytes, int64_t *xs_bytes,
                         int64_t *xhl_bytes) {
    *xpad_bytes = w->k % 2 ? round64(m * w->kp * 4) : 0;
    *xs_bytes = dn_linear_quantized(w->wtype) ? round64(m * (w->k / w->group) * 2 * 4) : 0;
    *xhl_bytes = w->wtype == DN_W_U4 ? round64(m * w->kp * 4) : 0;
}

static void gemv(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    int64_t m = c->m, k = w->k, xpad_bytes, xs_bytes, xhl_bytes;
    gemv_scratch(w, m, &xpad_bytes, &xs_bytes, &xhl_bytes);
    const float *x = c->x;
    int64_t ldx = k;
    float *xpad = (float *)c->scratch, *xs = (float *)(c->scratch + xpad_bytes);
    uint32_t *xhl = (uint32_t *)(c->scratch + xpad_bytes + xs_bytes);
    if (xpad_bytes) x = xpad, ldx = w->kp;
    if (xpad_bytes || xs_bytes) {
#pragma omp single
        {
            for (int64_t r = 0; r < m && xpad_bytes; r++) {
                memcpy(xpad + r * ldx, c->x + r * k, k * 4);
                xpad[r * ldx + k] = 0;
            }
            int64_t ngroups = xs_bytes ? k / w->group : 0;
            for (int64_t r = 0; r < m; r++)
                for (int64_t g = 0; g < ngroups; g++) {
                    float s[2] = {0, 0};
                    for (int64_t kk = g * w->group; kk < (g + 1) * w->group; kk++) s[kk & 1] += x[r * ldx + kk];
                    xs[(r * ngroups + g) * 2] = s[0], xs[(r * ngroups + g) * 2 + 1] = s[1];
                }
            for (int64_t i = 0; i < (xhl_bytes ? m * k : 0); i += 2) {
                uint16_t h0 = dn_f32_to_bf16(x[i]), h1 = dn_f32_to_bf16(x[i + 1]);
                uint16_t l0 = dn_f32_to_bf16(x[i] - dn_bf16_to_f32(h0));
                uint16_t l1 = dn_f32_to_bf16(x[i + 1] - dn_bf16_to_f32(h1));
                xhl[i] = h0 | (uint32_t)h1 << 16, xhl[i + 1] = l0 | (uint32_t)l1 << 16;
            }
        }
    }
    int64_t p0, p1;
    dn_split(w->npanels, t, nt, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) gemv_panel(w, p, (int)m, x, ldx, xs, xhl, c->y, c->bias);
}

/* ---------------------------------------------------------------- GEMM, bf16 microkernel */

/* While one weight slice is in use, the next one is prefetched into L2 a few lines per
 * iteration, spread over the row-block calls that share the slice: with few rows (batched
 * decode) the weights come from DRAM, and a slice fetched on demand by the first row block
 * would stall it while the others wait for nothing. */
typedef struct {
    const char *at; /* this call's share of the next slice */
    int64_t iters;  /* iterations that prefetch ... */
    int lines;      /* ... this many cache lines each */
} prefetch;

INLINE void prefetch_step(const prefetch *pf, int64_t i) {
    if (i < pf->iters)
        for (int l = 0; l < pf->lines; l++) _mm_prefetch(pf->at + (i * pf->lines + l) * 64, _MM_HINT_T1);
}

/* acc[r][v] = sum over kcp pairs of xb[r][kp] . wb[kp][v*16..][2] (vdpbf16ps), then store.
 * xb [mr][kcp] bf16 pairs as uint32; wb [kcp][ldw*16][2] bf16, of which nv*16 columns. */
INLINE void mk_bf16(const int mr, const int nv, int64_t kcp, const uint32_t *xb,
                    const uint16_t *wb, int ldw, float *y, int64_t ldy, int accumulate,
                    const float *bias, int valid, const prefetch *pf) {
    __m512 acc[MR * 4];
    for (int i = 0; i < mr * nv; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < kcp; kp++) {
        prefetch_step(pf, kp);
        __m512i w[4];
        for (int v = 0; v < nv; v++) w[v] = _mm512_loadu_si512(wb + (kp * ldw + v) * 32);
        for (int r = 0; r < mr; r++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xb[r * kcp + kp]);
            for (int v = 0; v < nv; v++)
                acc[r * nv + v] = _mm512_dpbf16_ps(acc[r * nv + v], xv, (__m512bh)w[v]);
        }
    }
    store_tile(mr, nv, acc, y, ldy, accumulate, bias, valid);
}

/* Same loop with fp32 weights [kc][ldw*16] and fp32 activations x [mr][ldx]. */
INLINE void mk_f32(const int mr, const int nv, int64_t kc, const float *x, int64_t ldx,
                   const float *wf, int ldw, float *y, int64_t ldy, int accumulate,
                   const float *bias, int valid, const prefetch *pf) {
    __m512 acc[MR * 4];
    for (int i = 0; i < mr * nv; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < kc; kk++) {
        prefetch_step(pf, kk);
        __m512 w[4];
        for (int v = 0; v < nv; v++) w[v] = _mm512_loadu_ps(wf + (kk * ldw + v) * 16);
        for (int r = 0; r < mr; r++) {
            __m512 xv = _mm512_set1_ps(x[r * ldx + kk]);
            /* one broadcast per row: folded into each FMA as {1to16} it would be four loads */
            __asm__("" : "+v"(xv));
            for (int v = 0; v < nv; v++) acc[r * nv + v] = _mm512_fmadd_ps(w[v], xv, acc[r * nv + v]);
        }
    }
    store_tile(mr, nv, acc, y, ldy, accumulate, bias, valid);
}

typedef struct {
    int64_t kc;                 /* k of this block (even except maybe the last f32 block) */
    const uint32_t *xb;         /* bf16 activations of the row block, [MR][kc/2] */
    const float *x;             /* fp32 activations of the row block, [MR][ldx] at k0 */
    int64_t ldx;
    const void *wt;             /* the weight slice: bf16 [kc/2][width][2] or f32 [kc][width] */
    int ldw;                    /* width / 16 */
    float *y;                   /* output tile, [mr][ldy] at the panel's first column */
    int64_t ldy;
    int accumulate;
    const float *bias;          /* NULL unless this is the last k block */
    int valid;
    prefetch pf;
} mk_args;

#define MK_BF16(MR_, NV) mk_bf16(MR_, NV, a->kc / 2, a->xb, a->wt, a->ldw, a->y, a->ldy, a->accumulate, a->bias, a->valid, &a->pf)
#define MK_F32(MR_, NV) mk_f32(MR_, NV, a->kc, a->x, a->ldx, a->wt, a->ldw, a->y, a->ldy, a->accumulate, a->bias, a->valid, &a->pf)
#define MK_ROWS(MK) switch (mr) { \
    case 1: switch (nv) { NV_CASES(MK, 1) } break; \
    case 2: switch (nv) { NV_CASES(MK, 2) } break; \
    case 3: switch (nv) { NV_CASES(MK, 3) } break; \
    case 4: switch (nv) { NV_CASES(MK, 4) } break; \
    case 5: switch (nv) { NV_CASES(MK, 5) } break; \
    default: switch (nv) { NV_CASES(MK, 6) } break; }

static void mk_bf16_any(const mk_args *a, int mr, int nv) { MK_ROWS(MK_BF16) }
static void mk_f32_any(const mk_args *a, int mr, int nv) { MK_ROWS(MK_F32) }

/* Dequantize k pairs [kp0, kp1) of an i8/u4 panel to bf16 dst [kp1-kp0][width][2]. */
static void dequant_bf16(const dn_linear_w *w, const uint8_t *panel, int width, int64_t kp0,
                         int64_t kp1, uint16_t *dst) {
    const int u4 = w->wtype == DN_W_U4, halves = width / 8;
    const int64_t gpairs = (w->group + 1) / 2, gb = dn_linear_group_bytes(w->wtype, w->group, width);
    const int64_t rowbytes = u4 ? width : 2 * width;
    for (int64_t kp = kp0; kp < kp1;) {
        int64_t g = kp / gpairs, end = (g + 1) * gpairs < kp1 ? (g + 1) * gpairs : kp1;
        const uint8_t *blk = panel + g * gb;
        const float *scale = (const float *)blk, *zero = scale + width;
        const uint8_t *codes = blk + 8 * width;
        __m512 s[8], b[8]; /* w = q * s + b, b = -zero * scale */
        for (int h = 0; h < halves; h++) {
            s[h] = dup_half(scale, h);
            b[h] = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), dup_half(zero, h)), s[h]);
        }
        for (; kp < end; kp++) {
            const uint8_t *row = codes + (kp - g * gpairs) * rowbytes;
            uint16_t *d = dst + (kp - kp0) * width * 2;
            for (int u = 0; u < width / 16; u++) {
                __m512 qa, qb;
                if (u4) {
                    __m512i bytes = bytes_u4(row, u);
                    qa = nibbles(bytes, 0), qb = nibbles(bytes, 1);
                } else {
                    qa = codes_i8(row, 2 * u), qb = codes_i8(row, 2 * u + 1);
                }
                __m512 fa = _mm512_fmadd_ps(qa, s[2 * u], b[2 * u]);
                __m512 fb = _mm512_fmadd_ps(qb, s[2 * u + 1], b[2 * u + 1]);
                _mm512_storeu_si512(d + 32 * u, (__m512i)_mm512_cvtne2ps_pbh(fb, fa));
            }
        }
    }
}

/* Rows of a block of MR, bf16 pairs, laid out [k block][row block][MR][kc/2] so that each
 * microkernel call reads one contiguous tile. Rows past M and k past K are zero. */
static void convert_x(const float *x, int64_t m, int64_t k, int64_t kp, int64_t mpad,
                      uint32_t *xb, int64_t r0, int64_t r1) {
    for (int64_t k0 = 0; k0 < kp; k0 += KC) {
        int64_t kc = kp - k0 < KC ? kp - k0 : KC;
        uint32_t *blk = xb + k0 / 2 * mpad;
        for (int64_t r = r0; r < r1; r++) {
            uint32_t *d = blk + r * (kc / 2);
            for (int64_t kk = 0; kk < kc; kk += 32) {
                int64_t left = r < m ? k - k0 - kk : 0; /* real k left from here */
                __mmask16 lo = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
                __mmask16 hi = left >= 32 ? 0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
                const float *s = x + r * k + k0 + kk;
                __m512 a = _mm512_maskz_loadu_ps(lo, s), b = _mm512_maskz_loadu_ps(hi, s + 16);
                int64_t pairs = (kc - kk) / 2 < 16 ? (kc - kk) / 2 : 16;
                _mm512_mask_storeu_epi32(d + kk / 2, (__mmask16)((1u << pairs) - 1),
                                         (__m512i)_mm512_cvtne2ps_pbh(b, a));
            }
        }
    }
}

static int64_t slice_bytes(void) { return round64(KC * NR * 2); }

static size_t scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) {
    if (m <= GEMV_MAX_M) {
        int64_t xpad_bytes, xs_bytes, xhl_bytes;
        gemv_scratch(w, m, &xpad_bytes, &xs_bytes, &xhl_bytes);
        return (size_t)(xpad_bytes + xs_bytes + xhl_bytes);
    }
    if (w->wtype == DN_W_F32) return 0;
    int64_t mpad = (m + MR - 1) / MR * MR;
    int64_t xb = round64(mpad * w->kp * 2);
    return (size_t)(xb + (dn_linear_quantized(w->wtype) ? nthreads * slice_bytes() : 0));
}

/* Where k block [k0, k0+kc) of panel p lies in the packed buffer. */
static const char *slice_span(const dn_linear_w *w, int64_t p, int64_t k0, int64_t kc,
                              int64_t *bytes) {
    int width = dn_linear_width(w, p);
    const char *panel = (const char *)dn_linear_panel(w, p);
    if (!dn_linear_quantized(w->wtype)) {
        int64_t size = w->wtype == DN_W_F32 ? 4 : 2;
        *bytes = kc * width * size;
        return panel + k0 * width * size;
    }
    int64_t gb = dn_linear_group_bytes(w->wtype, w->group, width), ngroups = w->k / w->group;
    int64_t g0 = k0 / w->group, g1 = (k0 + kc + w->group - 1) / w->group;
    *bytes = ((g1 < ngroups ? g1 : ngroups) - g0) * gb;
    return panel + g0 * gb;
}

/* Share of the next slice [at, at + bytes) that row block `i` of `calls` prefetches while
 * running `iters` iterations. */
static prefetch prefetch_share(const char *at, int64_t bytes, int64_t i, int64_t calls,
                               int64_t iters) {
    prefetch pf = {NULL, 0, 0};
    int64_t lines = (bytes + 63) / 64, share = (lines + calls - 1) / calls;
    int64_t first = i * share, mine = lines - first < share ? lines - first : share;
    if (!at || mine <= 0 || iters <= 0) return pf;
    pf.lines = (int)((mine + iters - 1) / iters);
    if (pf.lines > 4) pf.lines = 4; /* more than the slice itself streams: let hardware do it */
    pf.iters = (mine + pf.lines - 1) / pf.lines;
    pf.at = at + first * 64;
    return pf;
}

static void gemm(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    int64_t m = c->m, k = w->k, kp = w->kp, n = w->n;
    int64_t mblocks = (m + MR - 1) / MR, mpad = mblocks * MR;
    int f32 = w->wtype == DN_W_F32;
    uint32_t *xb = (uint32_t *)c->scratch;
    uint16_t *slice = (uint16_t *)(c->scratch + round64(mpad * kp * 2) + t * slice_bytes());
    if (!f32) {
        int64_t r0, r1;
        dn_split(mblocks, t, nt, &r0, &r1);
        convert_x(c->x, m, k, kp, mpad, xb, r0 * MR, r1 * MR);
#pragma omp barrier
    }
    int64_t p0, p1, m0, m1;
    dn_linear_share(w, m, MR, t, nt, &p0, &p1, &m0, &m1);
    int64_t kend = f32 ? k : kp, calls = (m1 - m0 + MR - 1) / MR;
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *panel = dn_linear_panel(w, p);
        int width = dn_linear_width(w, p), nv = width / 16;
        mk_args a = {.ldx = k, .ldy = n, .ldw = nv, .valid = dn_linear_valid(w, p)};
        for (int64_t k0 = 0; k0 < kend; k0 += KC) {
            a.kc = kend - k0 < KC ? kend - k0 : KC;
            a.accumulate = k0 > 0;
            a.bias = k0 + KC >= kend && c->bias ? c->bias + p * NR : NULL;
            if (f32) {
                a.wt = (const float *)panel + k0 * width;
            } else if (w->wtype == DN_W_BF16) {
                a.wt = (const uint16_t *)panel + k0 * width;
            } else {
                dequant_bf16(w, panel, width, k0 / 2, (k0 + a.kc) / 2, slice);
                a.wt = slice;
            }
            /* the slice this thread reads next: the next k block, or the next panel's first */
            int64_t next_bytes = 0, np = k0 + KC < kend ? p : p + 1, nk0 = np == p ? k0 + KC : 0;
            const char *next = NULL;
            if (np < p1) next = slice_span(w, np, nk0, kend - nk0 < KC ? kend - nk0 : KC, &next_bytes);
            for (int64_t r = m0, i = 0; r < m1; r += MR, i++) {
                int mr = m1 - r < MR ? (int)(m1 - r) : MR;
                a.y = c->y + r * n + p * NR;
                a.pf = prefetch_share(next, next_bytes, i, calls, f32 ? a.kc : a.kc / 2);
                if (f32) {
                    a.x = c->x + r * k + k0;
                    mk_f32_any(&a, mr, nv);
                } else {
                    a.xb = xb + k0 / 2 * mpad + r * (a.kc / 2);
                    mk_bf16_any(&a, mr, nv);
                }
            }
        }
    }
}

static void run(const dn_linear_call *c, int t, int nt) {
    if (c->m <= GEMV_MAX_M) gemv(c, t, nt);
    else gemm(c, t, nt);
}

const dn_linear_kernels dn_linear_avx512 = {scratch_bytes, run};

#pragma GCC pop_options
