/* AVX-512 prefill tiles: many query vectors (up to 64: GQA group x query rows) against one block
 * at a time. Compute bound: both products run as register-blocked kernels, FMA on an fp32 cache
 * (read as it lies, here), vpdpbf16ps on the others (attention_prefill_dpbf16_avx512.c). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attention_tile.h"
#include "common.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")

#include "exp_prefetch_avx512.h"

/* ---- fp32 cache: Mp (<= 64, a multiple of 16) query vectors against one block at a time.
 * Scores are kept transposed, S[t][i], so the per-vector softmax statistics are lane-wise and
 * both products are broadcast-FMA kernels over fp32 K groups and V rows. */

/* S[j][0..16*IC) = sum_d k[t][d] * qt[d][..] for R tokens t = t0 + j of fp32 K groups kt */
static inline __attribute__((always_inline)) void qk_kernel(const float *kt, int t0, int D,
                                                          const float *qt, int ld_q, float *s,
                                                          int ld_s, const int R, const int IC) {
    const float *kr[6]; /* token r's value of d at kr[r][16 * d] */
    for (int r = 0; r < R; r++) kr[r] = kt + (int64_t)((t0 + r) >> 4) * D * 16 + ((t0 + r) & 15);
    __m512 a[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < IC; c++) a[r][c] = _mm512_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m512 q[4];
        for (int c = 0; c < IC; c++) q[c] = _mm512_load_ps(qt + d * ld_q + 16 * c);
        for (int r = 0; r < R; r++) {
            __m512 k = _mm512_set1_ps(kr[r][16 * d]);
            for (int c = 0; c < IC; c++) a[r][c] = _mm512_fmadd_ps(k, q[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < IC; c++) _mm512_store_ps(s + r * ld_s + 16 * c, a[r][c]);
}

/* scores of tokens t0..t0 + n of the K groups kt */
static void qk_block(const float *kt, int t0, int n, int D, const float *qt, int mp, float *s) {
    const int ic = mp / 16;
    int j = 0;
#define QK(R, IC) qk_kernel(kt, t0 + j, D, qt, mp, s + j * mp, mp, R, IC)
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

static void prefill_tile_f32(const attn_tile_t *t) {
    const dn_kv_cache_t *kv = t->kv;
    const int D = kv->head_dim, bs = kv->block_size, nh = t->n_q_heads;
    const int M = nh * t->n_rows, mp = (M + 15) & ~15;
    char *w = t->work;
    float *qt = (float *)w;    w += (size_t)D * mp * 4;      /* [D][mp] scaled q, transposed */
    float *acc = (float *)w;   w += (size_t)mp * D * 4;      /* [mp][D] */
    float *s = (float *)w;     w += (size_t)bs * mp * 4;     /* [bs][mp] scores, then weights */
    float *mx = (float *)w, *sum = mx + mp, *alpha = sum + mp;
    int32_t *limit = (int32_t *)(alpha + mp), *low = limit + mp;

    attn_tile_start(t, mp, qt, low, limit, mx, sum, acc);

    for (int pos = t->kv_begin; pos < t->kv_end;) {
        const int off = pos % bs;
        const int n = bs - off < t->kv_end - pos ? bs - off : t->kv_end - pos;
        const int64_t slice = attn_cache_row(t, pos) - off;
        const float *kt = (const float *)kv->k + slice * D; /* fp32 K groups [bs/16][D][16] */
        const float *vr = (const float *)kv->v + (slice + off) * D;
        qk_block(kt, off, n, D, qt, mp, s);
        softcap_scores(s, n * mp, t->softcap);
        attn_mask_block(t, pos, n, mp, low, limit, s);
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

void attn_tile_avx512(const attn_tile_t *t) {
    if (t->kv->format == DN_KV_F32) prefill_tile_f32(t);
    else attn_tile_dpbf16_avx512(t);
}

#pragma GCC pop_options
