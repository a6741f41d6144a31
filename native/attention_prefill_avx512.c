/* AVX-512 prefill tile: many query vectors (up to 64: GQA group x query rows) against one block
 * at a time. Compute bound: the block is converted to fp32 once and both products run as
 * register-blocked FMA kernels. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attention_tile.h"
#include "common.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")

#include "attention_avx512.h"

/* ---- prefill: Mp (<= 64, a multiple of 16) query vectors against one block at a time.
 * Scores are kept transposed, S[t][i], so the per-vector softmax statistics are lane-wise and
 * both products are broadcast-FMA kernels over contiguous fp32 rows. */

/* n cache rows of K or V as fp32 [n][D] in head_dim order: the cache itself (fp32), or
 * dequantized into dst */
static const float *rows_to_f32(const dn_kv_cache_t *c, int which, int64_t row, int n, float *dst) {
    const int D = c->head_dim;
    const void *base = which ? c->v : c->k;
    if (c->format == DN_KV_F32) return (const float *)base + row * D;
    const float *sc = c->format == DN_KV_BF16 ? NULL : (which ? c->v_scale : c->k_scale) + row;
    const float *zr = c->format == DN_KV_UINT4 ? (which ? c->v_zero : c->k_zero) + row : NULL;
    for (int j = 0; j < n; j++) {
        float *o = dst + (int64_t)j * D;
        if (c->format == DN_KV_BF16) {
            const uint16_t *src = (const uint16_t *)base + (row + j) * D;
            for (int d = 0; d < D; d += 16)
                _mm512_store_ps(o + d, _mm512_castsi512_ps(_mm512_slli_epi32(
                                           _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + d))), 16)));
        } else if (c->format == DN_KV_INT8) {
            const int8_t *src = (const int8_t *)base + (row + j) * D;
            __m512 s = _mm512_set1_ps(sc[j]);
            for (int d = 0; d < D; d += 16)
                _mm512_store_ps(o + d, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                            _mm_loadu_si128((const __m128i *)(src + d))))));
        } else {
            const uint8_t *src = (const uint8_t *)base + (row + j) * (D / 2);
            __m512 s = _mm512_set1_ps(sc[j]), zs = _mm512_set1_ps(zr[j] * sc[j]);
            const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            const __m512i hi_idx = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
            for (int d = 0; d < D; d += 32) {
                __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + d / 2)));
                __m512 ev = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
                __m512 od = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
                _mm512_store_ps(o + d, _mm512_fmsub_ps(_mm512_permutex2var_ps(ev, lo_idx, od), s, zs));
                _mm512_store_ps(o + d + 16, _mm512_fmsub_ps(_mm512_permutex2var_ps(ev, hi_idx, od), s, zs));
            }
        }
    }
    return dst;
}

/* S[t][0..16*IC) = sum_d kf[t][d] * qt[d][..] for R tokens */
static inline __attribute__((always_inline)) void qk_kernel(const float *kf, int D, const float *qt,
                                                          int ld_q, float *s, int ld_s,
                                                          const int R, const int IC) {
    __m512 a[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < IC; c++) a[r][c] = _mm512_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m512 q[4];
        for (int c = 0; c < IC; c++) q[c] = _mm512_load_ps(qt + d * ld_q + 16 * c);
        for (int r = 0; r < R; r++) {
            __m512 k = _mm512_set1_ps(kf[r * D + d]);
            for (int c = 0; c < IC; c++) a[r][c] = _mm512_fmadd_ps(k, q[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < IC; c++) _mm512_store_ps(s + r * ld_s + 16 * c, a[r][c]);
}

static void qk_block(const float *kf, int n, int D, const float *qt, int mp, float *s) {
    const int ic = mp / 16;
    int t = 0;
#define QK(R, IC) qk_kernel(kf + (int64_t)t * D, D, qt, mp, s + t * mp, mp, R, IC)
#define QK_IC(R)                        \
    switch (ic) {                       \
    case 1: QK(R, 1); break;            \
    case 2: QK(R, 2); break;            \
    case 3: QK(R, 3); break;            \
    default: QK(R, 4); break;           \
    }
    for (; t + 6 <= n; t += 6) QK_IC(6);
    for (; t < n; t++) QK_IC(1);
#undef QK_IC
#undef QK
}

/* acc[i][d0..d0+16*DC) = acc * alpha[i] + sum_t p[t][i] * vf[t][..] for R vectors from i0 */
static inline __attribute__((always_inline)) void pv_kernel(const float *p, int mp, int i0, int n,
                                                          const float *vf, int D, int d0,
                                                          const float *alpha, float *acc,
                                                          const int R, const int DC) {
    __m512 a[6][4];
    for (int r = 0; r < R; r++) {
        __m512 al = _mm512_set1_ps(alpha[i0 + r]);
        for (int c = 0; c < DC; c++)
            a[r][c] = _mm512_mul_ps(al, _mm512_load_ps(acc + (int64_t)(i0 + r) * D + d0 + 16 * c));
    }
    for (int t = 0; t < n; t++) {
        __m512 v[4];
        for (int c = 0; c < DC; c++) v[c] = _mm512_loadu_ps(vf + (int64_t)t * D + d0 + 16 * c);
        for (int r = 0; r < R; r++) {
            __m512 w = _mm512_set1_ps(p[t * mp + i0 + r]);
            for (int c = 0; c < DC; c++) a[r][c] = _mm512_fmadd_ps(w, v[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < DC; c++)
            _mm512_store_ps(acc + (int64_t)(i0 + r) * D + d0 + 16 * c, a[r][c]);
}

static void pv_block(const float *p, int mp, int n, const float *vf, int D, const float *alpha,
                     float *acc) {
    for (int d0 = 0; d0 < D; d0 += 64) {
        int dc = D - d0 >= 64 ? 4 : 2; /* D is a multiple of 32 */
        int i = 0;
#define PV(R)                                                                  \
    if (dc == 4) pv_kernel(p, mp, i, n, vf, D, d0, alpha, acc, R, 4);          \
    else pv_kernel(p, mp, i, n, vf, D, d0, alpha, acc, R, 2)
        for (; i + 6 <= mp; i += 6) PV(6);
        for (; i + 2 <= mp; i += 2) PV(2);
        for (; i < mp; i++) PV(1);
#undef PV
    }
}

static void prefill_tile(const attn_tile_t *t) {
    const dn_kv_cache_t *kv = t->kv;
    const int D = kv->head_dim, bs = kv->block_size, nh = t->n_q_heads;
    const int M = nh * t->n_rows, mp = (M + 15) & ~15;
    char *w = t->work;
    float *qt = (float *)w;    w += (size_t)D * mp * 4;      /* [D][mp] scaled q, transposed */
    float *acc = (float *)w;   w += (size_t)mp * D * 4;      /* [mp][D] */
    float *kf = (float *)w;    w += (size_t)bs * D * 4;      /* [bs][D] */
    float *vf = (float *)w;    w += (size_t)bs * D * 4;      /* [bs][D] */
    float *s = (float *)w;     w += (size_t)bs * mp * 4;     /* [bs][mp] scores, then weights */
    float *mx = (float *)w, *sum = mx + mp, *alpha = sum + mp;
    int32_t *limit = (int32_t *)(alpha + mp);

    for (int i = 0; i < mp; i++) {
        const float *src = i < M ? t->q + (i / nh) * t->q_stride + (int64_t)(i % nh) * D : NULL;
        for (int d = 0; d < D; d++) qt[d * mp + i] = src ? src[d] * t->scale : 0.0f;
        limit[i] = i < M ? t->first_pos + i / nh : INT32_MAX; /* padding sees everything */
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
    }
    memset(acc, 0, (size_t)mp * D * 4);
    const int first_limit = t->first_pos;

    for (int pos = t->kv_begin; pos < t->kv_end;) {
        const int off = pos % bs;
        const int n = bs - off < t->kv_end - pos ? bs - off : t->kv_end - pos;
        const int64_t row = attn_cache_row(t, pos);
        const float *kr = rows_to_f32(kv, 0, row, n, kf);
        const float *vr = rows_to_f32(kv, 1, row, n, vf);
        qk_block(kr, n, D, qt, mp, s);
        /* causal mask: only tokens past the first row's position can be hidden */
        for (int j = first_limit - pos + 1 > 0 ? first_limit - pos + 1 : 0; j < n; j++)
            for (int c = 0; c < mp; c += 16) {
                __mmask16 hide = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(pos + j),
                                                         _mm512_loadu_si512(limit + c));
                _mm512_mask_storeu_ps(s + j * mp + c, hide, _mm512_set1_ps(-INFINITY));
            }
        for (int c = 0; c < mp; c += 16) {
            __m512 bmax = _mm512_set1_ps(-INFINITY);
            for (int j = 0; j < n; j++) bmax = _mm512_max_ps(bmax, _mm512_load_ps(s + j * mp + c));
            __m512 mold = _mm512_load_ps(mx + c);
            __m512 mnew = _mm512_max_ps(mold, bmax);
            /* vectors that saw nothing yet subtract 0, keeping exp(-inf) = 0 and no NaN */
            __m512 muse = _mm512_mask_blend_ps(
                _mm512_cmp_ps_mask(mnew, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), mnew,
                _mm512_setzero_ps());
            __m512 al = exp512(_mm512_sub_ps(mold, muse));
            __m512 ps = _mm512_setzero_ps();
            for (int j = 0; j < n; j++) {
                __m512 p = exp512(_mm512_sub_ps(_mm512_load_ps(s + j * mp + c), muse));
                _mm512_store_ps(s + j * mp + c, p);
                ps = _mm512_add_ps(ps, p);
            }
            _mm512_store_ps(sum + c, _mm512_fmadd_ps(_mm512_load_ps(sum + c), al, ps));
            _mm512_store_ps(mx + c, mnew);
            _mm512_store_ps(alpha + c, al);
        }
        pv_block(s, mp, n, vr, D, alpha, acc);
        pos += n;
    }
    attn_finish(t, acc, mx, sum);
}

void attn_tile_avx512(const attn_tile_t *t) { prefill_tile(t); }

#pragma GCC pop_options
