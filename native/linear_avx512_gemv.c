/* Linear layer, AVX-512 GEMV for M <= GEMV_MAX_M (decode): memory-bound, so activations stay
 * fp32. bf16 and i8 weights are widened to fp32 in registers (a shift; zero-extend + convert),
 * which is free next to streaming them from DRAM; u4 goes through vdpbf16ps with x split into
 * bf16 hi + lo parts (see gemv_u4). i8/u4 never dequantize per weight: per group they sum
 * q * x and fix up once, sum(w x) = scale * (sum(q x) - zero * sum(x)). */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include "linear_avx512.h"

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
    float scale[NR], zero[NR];
    for (int64_t g = 0; g < ngroups; g++) {
        const uint8_t *blk = panel + dn_linear_panel_head(DN_W_U4, width) + g * gb;
        const uint8_t *codes = blk + dn_linear_group_head(DN_W_U4, width);
        dn_u4_params(panel, blk, width, scale, zero); /* read ahead of the codes: the stream runs forward */
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
static void gemv_scratch_parts(const dn_linear_w *w, int64_t m, int64_t *xpad_bytes, int64_t *xs_bytes,
                         int64_t *xhl_bytes) {
    *xpad_bytes = w->k % 2 ? round64(m * w->kp * 4) : 0;
    *xs_bytes = dn_linear_quantized(w->wtype) ? round64(m * (w->k / w->group) * 2 * 4) : 0;
    *xhl_bytes = w->wtype == DN_W_U4 ? round64(m * w->kp * 4) : 0;
}

/* xs[g][0..1] = sums of x[g * group ...] over the group's even and odd k (x zero past k). */
static void group_sums(const float *x, int64_t k, int64_t group, float *xs) {
    for (int64_t g = 0; g < k / group; g++) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = g * group; i < (g + 1) * group; i += 16) {
            int64_t left = (g + 1) * group - i; /* group may be K, any length */
            acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(left >= 16 ? 0xffff : (1u << left) - 1, x + i));
        }
        /* group starts even except when it is K (one group), so lane parity is k parity */
        xs[2 * g] = _mm512_mask_reduce_add_ps(0x5555, acc);
        xs[2 * g + 1] = _mm512_mask_reduce_add_ps(0xaaaa, acc);
    }
}

/* x[k] (k even) -> per k pair, bf16 hi pair then bf16 lo pair: x ~ hi + lo to 2^-17. */
static void split_bf16(const float *x, int64_t k, uint32_t *xhl) {
    const __m512i interleave = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    for (int64_t i = 0; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? 0xffff : (__mmask16)((1u << (k - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(v, v); /* 16 bf16 twice; pairs in dwords 0-7 */
        __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
        __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(v, back), _mm512_sub_ps(v, back));
        /* (hi pair j, lo pair j) for the 8 pairs of these 16 k */
        __m512i out = _mm512_permutex2var_epi32(hi, interleave, lo);
        _mm512_mask_storeu_epi32(xhl + i, m, out);
    }
}

size_t dn_avx512_gemv_scratch(const dn_linear_w *w, int64_t m) {
    int64_t xpad_bytes, xs_bytes, xhl_bytes;
    gemv_scratch_parts(w, m, &xpad_bytes, &xs_bytes, &xhl_bytes);
    return (size_t)(xpad_bytes + xs_bytes + xhl_bytes);
}

void dn_avx512_gemv(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    int64_t m = c->m, k = w->k, xpad_bytes, xs_bytes, xhl_bytes;
    gemv_scratch_parts(w, m, &xpad_bytes, &xs_bytes, &xhl_bytes);
    const float *x = c->x;
    int64_t ldx = k;
    float *xpad = (float *)c->scratch, *xs = (float *)(c->scratch + xpad_bytes);
    uint32_t *xhl = (uint32_t *)(c->scratch + xpad_bytes + xs_bytes);
    if (xpad_bytes) x = xpad, ldx = w->kp;
    if (xpad_bytes || xs_bytes) {
#pragma omp single
        for (int64_t r = 0; r < m; r++) {
            if (xpad_bytes) {
                memcpy(xpad + r * ldx, c->x + r * k, k * 4);
                xpad[r * ldx + k] = 0;
            }
            if (xs_bytes) group_sums(x + r * ldx, k, w->group, xs + r * (k / w->group) * 2);
            if (xhl_bytes) split_bf16(x + r * k, k, xhl + r * k); /* u4: K is even, ldx = K */
        }
    }
    int64_t p0, p1;
    dn_split(w->npanels, t, nt, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) gemv_panel(w, p, (int)m, x, ldx, xs, xhl, c->y, c->bias);
}

#pragma GCC pop_options
