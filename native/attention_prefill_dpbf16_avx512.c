/* AVX-512 prefill tile of bf16, int8 and uint4 caches (attention_prefill_avx512.c dispatches
 * here; its fp32 tile is there). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attention_tile.h"
#include "common.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")

#include "exp_prefetch_avx512.h"

/* ---- bf16, int8, uint4 caches: both products on vpdpbf16ps (two bf16 products per fp32 lane,
 * fp32 sums), with q and the softmax weights rounded to bf16, as bf16 attention does. bf16 K
 * pairs are read straight from the cache; V is interleaved in token pairs once per block. */

/* S[j][0..16*IC) = sum_d k[t][d] * q[d][..] for R tokens t = t0 + j of bf16 K groups kp
 * ([bs/16][D/2][16][2]); qp [D/2][ld_q] q pairs */
/* the bf16 pair at p, broadcast */
static inline __m512bh bcast_pair(const void *p) {
    int32_t x;
    memcpy(&x, p, 4);
    return (__m512bh)_mm512_set1_epi32(x);
}

static inline __attribute__((always_inline)) void qk_kernel_bf16(const uint16_t *kp, int t0, int D,
                                                               const uint32_t *qp, int ld_q,
                                                               float *s, int ld_s, const int R,
                                                               const int IC) {
    const uint16_t *kr[6]; /* token r's pair j at kr[r] + 32 * j */
    for (int r = 0; r < R; r++) kr[r] = kp + (int64_t)((t0 + r) >> 4) * 16 * D + 2 * ((t0 + r) & 15);
    __m512 a[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < IC; c++) a[r][c] = _mm512_setzero_ps();
    for (int j = 0; j < D / 2; j++) {
        __m512bh q[4];
        for (int c = 0; c < IC; c++) q[c] = (__m512bh)_mm512_load_si512(qp + j * ld_q + 16 * c);
        for (int r = 0; r < R; r++) {
            __m512bh k = bcast_pair(kr[r] + 32 * j);
            for (int c = 0; c < IC; c++) a[r][c] = _mm512_dpbf16_ps(a[r][c], k, q[c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < IC; c++) _mm512_store_ps(s + r * ld_s + 16 * c, a[r][c]);
}

static void qk_block_bf16(const uint16_t *kp, int t0, int n, int D, const uint32_t *qp, int mp,
                          float *s) {
    const int ic = mp / 16;
    int j = 0;
#define QK(R, IC) qk_kernel_bf16(kp, t0 + j, D, qp, mp, s + j * mp, mp, R, IC)
#define QK_IC(R)                        \
    switch (ic) {                       \
    case 1: QK(R, 1); break;            \
    case 2: QK(R, 2); break;            \
    case 3: QK(R, 3); break;            \
    default: QK(R, 4); break;           \
    }
    for (; j + 6 <= n; j += 6) QK_IC(6);
    for (; j < n; j++) QK_IC(1);
#undef QK_IC
#undef QK
}

/* acc[i][d0..d0+16*DC) = acc * alpha[i] + sum_t p[t][i] v[t][..] for R vectors from i0, over np
 * token pairs: pp [np][mp] weight pairs, vp [np][D] value pairs */
static inline __attribute__((always_inline)) void pv_kernel_bf16(const uint32_t *pp, int mp, int i0,
                                                               int np, const uint32_t *vp, int D,
                                                               int d0, const float *alpha,
                                                               float *acc, const int R,
                                                               const int DC) {
    __m512 a[6][4];
    for (int r = 0; r < R; r++) {
        __m512 al = _mm512_set1_ps(alpha[i0 + r]);
        for (int c = 0; c < DC; c++)
            a[r][c] = _mm512_mul_ps(al, _mm512_load_ps(acc + (int64_t)(i0 + r) * D + d0 + 16 * c));
    }
    for (int tp = 0; tp < np; tp++) {
        __m512bh v[4];
        for (int c = 0; c < DC; c++) v[c] = (__m512bh)_mm512_load_si512(vp + (int64_t)tp * D + d0 + 16 * c);
        for (int r = 0; r < R; r++) {
            __m512bh w = (__m512bh)_mm512_set1_epi32((int)pp[tp * mp + i0 + r]);
            for (int c = 0; c < DC; c++) a[r][c] = _mm512_dpbf16_ps(a[r][c], w, v[c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < DC; c++)
            _mm512_store_ps(acc + (int64_t)(i0 + r) * D + d0 + 16 * c, a[r][c]);
}

static void pv_block_bf16(const uint32_t *pp, int mp, int np, const uint32_t *vp, int D,
                          const float *alpha, float *acc) {
    for (int d0 = 0; d0 < D; d0 += 64) {
        int dc = D - d0 >= 64 ? 4 : 2; /* D is a multiple of 32 */
        int i = 0;
#define PV(R)                                                                        \
    if (dc == 4) pv_kernel_bf16(pp, mp, i, np, vp, D, d0, alpha, acc, R, 4);         \
    else pv_kernel_bf16(pp, mp, i, np, vp, D, d0, alpha, acc, R, 2)
        for (; i + 6 <= mp; i += 6) PV(6);
        for (; i + 2 <= mp; i += 2) PV(2);
        for (; i < mp; i++) PV(1);
#undef PV
    }
}

/* two fp32 vectors to bf16 (round to nearest even), interleaved: lane l = (a[l], b[l]) */
static inline __m512i pair_bf16(__m512 a, __m512 b) {
    static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(order), (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* e^x for the softmax weights of the bf16 products, which are rounded to bf16 (2^-9) before
 * use: degree 5 (relative error < 3e-6), two FMAs fewer per 16 weights than exp512. */
static inline __m512 exp512_bf16(__m512 x) { return exp512_degree(x, 5); }

/* K of the groups covering tokens 0..n of an int8 / uint4 slice: the codes in bf16 (exact: at
 * most 8 significant bits), in the bf16 K layout [n/16][D/2][16][2]. */
static void k_codes_bf16(const dn_kv_cache_t *c, int64_t slice, int n, uint16_t *dst) {
    const int D = c->head_dim, groups = (n + 15) / 16;
    if (c->format == DN_KV_INT8) { /* same pair layout: convert in place order */
        const int8_t *src = (const int8_t *)c->k + slice * D;
        for (int64_t e = 0; e < (int64_t)groups * 16 * D; e += 16)
            _mm256_store_si256((__m256i *)(dst + e), (__m256i)_mm512_cvtneps_pbh(_mm512_cvtepi32_ps(
                                                         _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + e))))));
        return;
    }
    /* uint4 octets: byte b of a token holds d = 8j + b (low nibble), 8j + 4 + b (high); pair
     * 4j + m takes bytes (0, 1) for m = 0, 2 and (2, 3) for m = 1, 3, high nibbles for m >= 2 */
    const uint8_t *src = (const uint8_t *)c->k + slice * (D / 2);
    const __m512i nib = _mm512_set1_epi32(15), hi16 = _mm512_set1_epi32((int)0xffff0000u);
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < D / 8; j++) {
            __m512i x = _mm512_loadu_si512(src + ((int64_t)g * (D / 8) + j) * 64);
            for (int m = 0; m < 4; m++) {
                int sh = 16 * (m & 1) + 4 * (m >> 1); /* first byte's nibble */
                __m512 a = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(x, sh), nib));
                __m512 b = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(x, sh + 8), nib));
                __m512i pair = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(a), 16),
                                               _mm512_and_si512(_mm512_castps_si512(b), hi16));
                _mm512_store_si512(dst + (((int64_t)g * (D / 2) + 4 * j + m) * 16) * 2, pair);
            }
        }
}

/* V of tokens 0..n of a slice in token pairs [(n+1)/2][D] (bf16 values, or the codes of int8 /
 * uint4 in bf16); a missing second token of the last pair reads as 0 (bf16) or a code of
 * weight 0. */
static void v_pairs_bf16(const dn_kv_cache_t *c, int64_t slice, int n, uint32_t *vp) {
    const int D = c->head_dim, np = (n + 1) / 2;
    if (c->format == DN_KV_BF16) {
        const uint16_t *vr = (const uint16_t *)c->v + slice * D;
        for (int tp = 0; tp < np; tp++)
            for (int d = 0; d < D; d += 16) {
                __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(vr + (int64_t)2 * tp * D + d)));
                __m512i b = 2 * tp + 1 < n ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                                 (const __m256i *)(vr + (int64_t)(2 * tp + 1) * D + d)))
                                           : _mm512_setzero_si512();
                _mm512_store_si512(vp + (int64_t)tp * D + d, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
            }
    } else if (c->format == DN_KV_INT8) { /* [bs/2][D][2]: the pairs as they lie */
        const int8_t *src = (const int8_t *)c->v + slice * D;
        for (int64_t e = 0; e < (int64_t)np * 2 * D; e += 16)
            _mm256_store_si256((__m256i *)((uint16_t *)vp + e), (__m256i)_mm512_cvtneps_pbh(_mm512_cvtepi32_ps(
                                                                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + e))))));
    } else { /* quads [bs/4][D/16][8][4]: lane k of a 16-d chunk, byte r = token 4Q + r */
        const uint8_t *src = (const uint8_t *)c->v + slice * (D / 2);
        const __m512i nib = _mm512_set1_epi32(15), hi16 = _mm512_set1_epi32((int)0xffff0000u);
        for (int q = 0; q < (n + 3) / 4; q++)
            for (int ch = 0; ch < D / 16; ch++) {
                __m256i x8 = _mm256_loadu_si256((const __m256i *)(src + ((int64_t)q * (D / 16) + ch) * 32));
                __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(x8), x8, 1);
                for (int h = 0; h < 2; h++) { /* tokens 4q + 2h, 4q + 2h + 1 */
                    /* lanes 0..7: d = 16 ch + k (low nibble), lanes 8..15: 16 ch + 8 + k (high) */
                    __m512i sh = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
                    sh = _mm512_add_epi32(sh, _mm512_set1_epi32(16 * h));
                    __m512 a = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(x, sh), nib));
                    __m512 b = _mm512_cvtepi32_ps(_mm512_and_si512(
                        _mm512_srlv_epi32(x, _mm512_add_epi32(sh, _mm512_set1_epi32(8))), nib));
                    __m512i pair = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(a), 16),
                                                   _mm512_and_si512(_mm512_castps_si512(b), hi16));
                    _mm512_store_si512(vp + (int64_t)(2 * q + h) * D + 16 * ch, pair);
                }
            }
    }
}

/* The tile of bf16, int8 and uint4 caches. int8 / uint4 codes are exact in bf16: the products
 * run on the codes, the K scales (and zero points) correct the scores, the V scales go into the
 * weights before their rounding, and the uint4 V zero points come off at the end. Tiles start
 * at block boundaries (attention_tile.h), so a block's tokens are 0..n of its slice. */
void attn_tile_dpbf16_avx512(const attn_tile_t *t) {
    const dn_kv_cache_t *kv = t->kv;
    const dn_kv_format_t f = kv->format;
    const int D = kv->head_dim, bs = kv->block_size, nh = t->n_q_heads;
    const int M = nh * t->n_rows, mp = (M + 15) & ~15;
    char *w = t->work;
    uint32_t *qp = (uint32_t *)w; w += (size_t)D / 2 * mp * 4;  /* [D/2][mp] scaled q pairs */
    float *acc = (float *)w;      w += (size_t)mp * D * 4;      /* [mp][D] */
    uint32_t *pp = (uint32_t *)w; w += (size_t)bs / 2 * mp * 4; /* [bs/2][mp] weight pairs */
    uint32_t *vp = (uint32_t *)w; w += (size_t)bs / 2 * D * 4;  /* [bs/2][D] value pairs */
    uint16_t *kb = (uint16_t *)w; w += (size_t)bs * D * 2;      /* int formats: K codes in bf16 */
    float *s = (float *)w;        w += (size_t)bs * mp * 4;     /* [bs][mp] scores, then weights */
    float *mx = (float *)w, *sum = mx + mp, *alpha = sum + mp, *qsum = alpha + mp, *zt = qsum + mp;
    int32_t *limit = (int32_t *)(zt + mp), *low = limit + mp;
    const int quant = f == DN_KV_INT8 || f == DN_KV_UINT4;
    const __m512 zero = _mm512_setzero_ps();
    const __m512i hi16 = _mm512_set1_epi32((int)0xffff0000u);

    attn_seen_positions(t, mp, low, limit);
    for (int i = 0; i < mp; i++) {
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
        zt[i] = 0.0f;
    }
    /* q scaled and rounded to bf16 pairs, one row per vector (in acc, not yet in use), then
     * transposed 16 vectors at a time */
    uint32_t *qrows = (uint32_t *)acc; /* [mp][D/2] */
    const __m512 scale = _mm512_set1_ps(t->scale);
    for (int i = 0; i < mp; i++) {
        const float *src = i < M ? t->q + (i / nh) * t->q_stride + (int64_t)(i % nh) * D : NULL;
        for (int d = 0; d < D; d += 32) {
            __m512 a = src ? _mm512_mul_ps(_mm512_loadu_ps(src + d), scale) : zero;
            __m512 b = src ? _mm512_mul_ps(_mm512_loadu_ps(src + d + 16), scale) : zero;
            _mm512_store_si512(qrows + i * (D / 2) + d / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
    }
    const __m512i stride = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(D / 2));
    for (int c = 0; c < mp; c += 16) {
        __m512 qs = zero; /* the sum of the rounded q, for the uint4 K zero points */
        for (int j = 0; j < D / 2; j++) {
            __m512i pair = _mm512_i32gather_epi32(stride, qrows + c * (D / 2) + j, 4);
            _mm512_store_si512(qp + j * mp + c, pair);
            qs = _mm512_add_ps(qs, _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(pair, 16)),
                                                 _mm512_castsi512_ps(_mm512_and_si512(pair, hi16))));
        }
        _mm512_store_ps(qsum + c, qs);
    }
    memset(acc, 0, (size_t)mp * D * 4);

    for (int pos = t->kv_begin; pos < t->kv_end;) {
        const int n = bs < t->kv_end - pos ? bs : t->kv_end - pos, np = (n + 1) / 2;
        const int64_t slice = attn_cache_row(t, pos);
        const float *ks = quant ? kv->k_scale + slice : NULL, *kz = kv->k_zero ? kv->k_zero + slice : NULL;
        const float *vs = quant ? kv->v_scale + slice : NULL, *vz = kv->v_zero ? kv->v_zero + slice : NULL;
        const uint16_t *kp = (const uint16_t *)kv->k + slice * D;
        if (quant) {
            k_codes_bf16(kv, slice, n, kb);
            kp = kb;
        }
        qk_block_bf16(kp, 0, n, D, qp, mp, s);
        if (quant) /* scores of codes to scores: times the K scale, less the zero point's share */
            for (int j = 0; j < n; j++)
                for (int c = 0; c < mp; c += 16) {
                    __m512 x = _mm512_load_ps(s + j * mp + c);
                    if (kz) x = _mm512_fnmadd_ps(_mm512_set1_ps(kz[j]), _mm512_load_ps(qsum + c), x);
                    _mm512_store_ps(s + j * mp + c, _mm512_mul_ps(x, _mm512_set1_ps(ks[j])));
                }
        v_pairs_bf16(kv, slice, n, vp);
        softcap_scores(s, n * mp, t->softcap);
        attn_mask_block(t, pos, n, mp, low, limit, s);
        for (int c = 0; c < mp; c += 16) {
            __m512 bmax = _mm512_set1_ps(-INFINITY);
            for (int j = 0; j < n; j++) bmax = _mm512_max_ps(bmax, _mm512_load_ps(s + j * mp + c));
            __m512 mold = _mm512_load_ps(mx + c);
            __m512 mnew = _mm512_max_ps(mold, bmax);
            /* vectors that saw nothing yet subtract 0, keeping exp(-inf) = 0 and no NaN */
            __m512 muse = _mm512_mask_blend_ps(
                _mm512_cmp_ps_mask(mnew, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), mnew, zero);
            __m512 al = exp512_bf16(_mm512_sub_ps(mold, muse));
            __m512 ps = zero, zs = _mm512_mul_ps(_mm512_load_ps(zt + c), al);
            for (int j = 0; j < 2 * np; j += 2) {
                __m512 p0 = exp512_bf16(_mm512_sub_ps(_mm512_load_ps(s + j * mp + c), muse));
                __m512 p1 = j + 1 < n ? exp512_bf16(_mm512_sub_ps(_mm512_load_ps(s + (j + 1) * mp + c), muse)) : zero;
                ps = _mm512_add_ps(ps, _mm512_add_ps(p0, p1));
                if (vs) { /* the V scales into the weights */
                    p0 = _mm512_mul_ps(p0, _mm512_set1_ps(vs[j]));
                    p1 = j + 1 < n ? _mm512_mul_ps(p1, _mm512_set1_ps(vs[j + 1])) : zero;
                }
                __m512i pair = pair_bf16(p0, p1);
                _mm512_store_si512(pp + j / 2 * mp + c, pair);
                if (vz) { /* the V zero points' share, with the weights as rounded */
                    zs = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(pair, 16)), _mm512_set1_ps(vz[j]), zs);
                    if (j + 1 < n)
                        zs = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(pair, hi16)),
                                             _mm512_set1_ps(vz[j + 1]), zs);
                }
            }
            _mm512_store_ps(sum + c, _mm512_fmadd_ps(_mm512_load_ps(sum + c), al, ps));
            _mm512_store_ps(mx + c, mnew);
            _mm512_store_ps(alpha + c, al);
            _mm512_store_ps(zt + c, zs);
        }
        pv_block_bf16(pp, mp, np, vp, D, alpha, acc);
        pos += n;
    }
    if (kv->v_zero)
        for (int i = 0; i < M; i++)
            for (int d = 0; d < D; d++) acc[(int64_t)i * D + d] -= zt[i];
    attn_finish(t, acc, mx, sum);
}

#pragma GCC pop_options
