/* The attention tile in plain C over 8-float vectors (gcc vector extensions), shaped for the
 * auto-vectorizer: any tile, prefill or decode. A template, built twice with its own TILE_FN /
 * DEQUANT_FN names: attention_vec8_portable.c (attn_tile_portable, baseline x86-64) and
 * attention_vec8_avx2.c (attn_tile_avx2, compiled for AVX2 + FMA).
 *
 * Same plan as the AVX-512 prefill tile: the cache block is dequantized to fp32 rows, scores are
 * kept transposed (S[t][i], query vectors along the lanes), so QK^T is a broadcast FMA over the
 * GQA group without horizontal sums, and PV a broadcast FMA over head_dim. */
#include <math.h>
#include <string.h>

#include "attention_tile.h"
#include "common.h"
#include "kv_cache_layout.h"
#include "vec8.h"

#define GL 8 /* query vectors per lane group */

typedef int8_t v8c __attribute__((vector_size(8)));
typedef uint8_t v8u __attribute__((vector_size(8)));

/* softcap * tanh(x / softcap), tanh(y) = (1 - e^-2|y|) / (1 + e^-2|y|) with the sign of y */
static inline __attribute__((always_inline)) v8f softcap8(v8f x, float softcap) {
    v8f y = x * (1.0f / softcap);
    v8i neg = y < 0;
    v8f e = exp8(select8(neg, y, -y) * 2.0f);
    v8f c = (1.0f - e) / (1.0f + e) * softcap;
    return select8(neg, -c, c);
}

/* n cached tokens of K (which = 0) or V (which = 1) from cache row `row` on (within one block),
 * to fp32 rows [n][head_dim]: V rows of fp32 / bf16 are read as they lie, the rest gathered
 * through the slice layout (kv_cache_layout.h). */
static void DEQUANT_FN(const dn_kv_cache_t *c, int which, int64_t row, int n,
                       float *restrict dst) {
    const int D = c->head_dim, off = (int)(row % c->block_size);
    const int64_t slice = row - off;
    const dn_kv_format_t f = c->format;
    const void *base = which ? c->v : c->k;
    if (which && f == DN_KV_F32) {
        memcpy(dst, (const float *)base + row * D, (size_t)n * D * sizeof *dst);
        return;
    }
    if (which && f == DN_KV_BF16) {
        const uint16_t *restrict src = (const uint16_t *)base + row * D;
        for (int i = 0; i < n * D; i++) {
            uint32_t u = (uint32_t)src[i] << 16;
            memcpy(&dst[i], &u, 4);
        }
        return;
    }
    const float *sc = which ? c->v_scale : c->k_scale, *zr = which ? c->v_zero : c->k_zero;
    for (int j = 0; j < n; j++) {
        const int t = off + j;
        const float s = sc ? sc[row + j] : 1.0f, z = zr ? zr[row + j] : 0.0f;
        for (int d = 0; d < D; d++) {
            int64_t i = which ? kv_v_index(f, D, t, d) : kv_k_index(f, D, t, d);
            float x;
            switch (f) {
            case DN_KV_F32:
                x = ((const float *)base)[slice * D + i];
                break;
            case DN_KV_BF16:
                x = dn_bf16_to_f32(((const uint16_t *)base)[slice * D + i]);
                break;
            case DN_KV_INT8:
                x = ((const int8_t *)base)[slice * D + i] * s;
                break;
            default: {
                int code = ((const uint8_t *)base)[slice * (D / 2) + (i >> 1)] >> (i & 1) * 4 & 15;
                x = (code - z) * s;
            }
            }
            dst[(int64_t)j * D + d] = x;
        }
    }
}

/* s[j][c..c+8) = sum_d kf[j][d] * qt[d][c..c+8) for R tokens from j */
static inline __attribute__((always_inline)) void qk_rows(const float *restrict kf, int D,
                                                        const float *restrict qt, int mp, int c,
                                                        float *restrict s, const int R) {
    v8f a[4] = {{0}};
    for (int d = 0; d < D; d++) {
        v8f q = load8(qt + d * mp + c);
        for (int r = 0; r < R; r++) a[r] += kf[r * D + d] * q;
    }
    for (int r = 0; r < R; r++) store8(s + r * mp + c, a[r]);
}

/* acc[i0..i0+4)[d0..d0+16) = acc * alpha + sum_j p[j][i] * vf[j][..] */
static inline __attribute__((always_inline)) void pv_rows(const float *restrict p, int mp, int i0,
                                                        int n, const float *restrict vf, int D,
                                                        int d0, const float *restrict alpha,
                                                        float *restrict acc) {
    v8f a[4][2];
    for (int r = 0; r < 4; r++)
        for (int h = 0; h < 2; h++) a[r][h] = load8(acc + (i0 + r) * D + d0 + 8 * h) * alpha[i0 + r];
    for (int j = 0; j < n; j++) {
        v8f v0 = load8(vf + j * D + d0), v1 = load8(vf + j * D + d0 + 8);
        for (int r = 0; r < 4; r++) {
            float w = p[j * mp + i0 + r];
            a[r][0] += w * v0;
            a[r][1] += w * v1;
        }
    }
    for (int r = 0; r < 4; r++)
        for (int h = 0; h < 2; h++) store8(acc + (i0 + r) * D + d0 + 8 * h, a[r][h]);
}

void TILE_FN(const attn_tile_t *t) {
    const dn_kv_cache_t *kv = t->kv;
    const int D = kv->head_dim, bs = kv->block_size, nh = t->n_q_heads;
    const int M = nh * t->n_rows, mp = (M + GL - 1) / GL * GL;
    float *qt = t->work;            /* [D][mp] scaled queries, transposed */
    float *acc = qt + D * mp;       /* [mp][D] */
    float *kf = acc + mp * D;       /* [bs][D] */
    float *vf = kf + bs * D;        /* [bs][D] */
    float *s = vf + bs * D;         /* [bs][mp] scores, then weights */
    float *mx = s + bs * mp, *sum = mx + mp, *alpha = sum + mp;
    int32_t *limit = (int32_t *)(alpha + mp), *low = limit + mp;

    attn_tile_start(t, mp, qt, low, limit, mx, sum, acc);

    for (int pos = t->kv_begin; pos < t->kv_end;) {
        const int n = bs - pos % bs < t->kv_end - pos ? bs - pos % bs : t->kv_end - pos;
        const int64_t row = attn_cache_row(t, pos);
        DEQUANT_FN(kv, 0, row, n, kf);
        DEQUANT_FN(kv, 1, row, n, vf);
        for (int c = 0; c < mp; c += GL) {
            int j = 0;
            for (; j + 4 <= n; j += 4) qk_rows(kf + j * D, D, qt, mp, c, s + j * mp, 4);
            for (; j < n; j++) qk_rows(kf + j * D, D, qt, mp, c, s + j * mp, 1);
        }
        if (t->softcap > 0.0f)
            for (int j = 0; j < n * mp; j += GL) store8(s + j, softcap8(load8(s + j), t->softcap));
        attn_mask_block(t, pos, n, mp, low, limit, s);
        for (int c = 0; c < mp; c += GL) {
            v8f bmax = (v8f){0} - INFINITY;
            for (int j = 0; j < n; j++) bmax = max8(bmax, load8(s + j * mp + c));
            v8f mold = load8(mx + c), mnew = max8(mold, bmax);
            v8f muse = select8(mnew == -INFINITY, (v8f){0}, mnew); /* nothing seen yet: no NaN */
            v8f ps = {0};
            for (int j = 0; j < n; j++) {
                v8f p = exp8(load8(s + j * mp + c) - muse);
                store8(s + j * mp + c, p);
                ps += p;
            }
            v8f al = exp8(mold - muse);
            store8(alpha + c, al);
            store8(sum + c, load8(sum + c) * al + ps);
            store8(mx + c, mnew);
        }
        for (int i0 = 0; i0 < M; i0 += 4) /* mp is a multiple of 4: rows past M are padding */
            for (int d0 = 0; d0 < D; d0 += 16) pv_rows(s, mp, i0, n, vf, D, d0, alpha, acc);
        pos += n;
    }
    attn_finish(t, acc, mx, sum);
}

#undef GL
