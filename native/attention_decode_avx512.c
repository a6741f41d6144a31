/* AVX-512 decode tile: few query vectors per kv head (M <= 8: the GQA group times a few rows)
 * against a long context. Bound by the bytes of K/V streamed from memory.
 *
 * Streaming. A tile covers consecutive kv heads of one sequence and walks its context block by
 * block, every head of a block before the next block. A block's heads are contiguous in the
 * cache ([n_kv_heads, block_size, head_dim] per block, K and V each), so the tile reads two long
 * runs per block rather than a head's 2-16 KiB slice of every block, and while it computes one
 * (block, head) slice it prefetches the next one, row for row, K during the scores and V during
 * the weighted sum.
 *
 * Math, per format. Every query vector of the group is scored against a K row while that row is
 * in registers, and each V row is converted once for all of them.
 *   fp32: plain FMAs.
 *   bf16: exact fp32 math. A 64-byte load of 32 bf16 gives the even elements by a shift and the
 *         odd ones by a mask; q is stored in that even/odd order, and so is the accumulator.
 *   int8 / uint4: dot products on VNNI (vpdpwssd, int16 pairs into int32): q is quantized to
 *         int16 per vector (rel. error 2^-16, negligible next to the cache's own 8- or 4-bit
 *         error), and the softmax weights times the V scales to int16 per block. Scores, the
 *         running max and sum, and the output stay fp32. */
#include <math.h>
#include <string.h>

#include "attention_tile.h"
#include "common.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")

#include "attention_avx512.h"

#define MAX_M 8

/* Bytes of one cache row (a token of one kv head). */
static inline int64_t row_bytes(dn_kv_format_t f, int D) {
    return f == DN_KV_F32 ? 4 * D : f == DN_KV_BF16 ? 2 * D : f == DN_KV_INT8 ? D : D / 2;
}

/* Where accumulator lane `pos` of a chunk lives in head_dim (chunk: 32 values, uint4 64). */
static int acc_lane_d(dn_kv_format_t f, int pos) {
    switch (f) {
    case DN_KV_F32:
        return pos;
    case DN_KV_BF16: /* even d, then odd d */
        return pos < 16 ? 2 * pos : 2 * (pos - 16) + 1;
    case DN_KV_INT8: { /* unpacklo/hi of two rows' int16: 4 d of each 128-bit lane */
        int p = pos % 16, hi = pos / 16;
        return 8 * (p / 4) + 4 * hi + p % 4;
    }
    case DN_KV_UINT4: { /* even codes lo, hi, then odd codes lo, hi */
        int p = pos % 16, part = pos / 16;
        return 2 * (8 * (p / 4) + 4 * (part & 1) + p % 4) + (part >> 1);
    }
    }
    return pos;
}

/* out lane j = sum of the 16 lanes of v[j]: the dot products of 16 tokens at once. */
static inline __m512 reduce16_ps(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                         _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
}

static inline __m512i reduce16_epi32(const __m512i *v) {
    __m512i a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * i], a[2 * i + 1]),
                                _mm512_unpackhi_epi64(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(b[2 * i], b[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(b[2 * i], b[2 * i + 1], 0xdd));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], 0x88),
                            _mm512_shuffle_i32x4(c[0], c[1], 0xdd));
}

/* Quantize fp32 values to int16 with one scale: x ~= q * scale. Returns the scale (0 if all 0).
 * n is a multiple of 16. */
static float quantize_i16(const float *x, int n, int16_t *q) {
    __m512 amax = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    float m = _mm512_reduce_max_ps(amax);
    if (m == 0.0f) {
        memset(q, 0, (size_t)n * 2);
        return 0.0f;
    }
    __m512 inv = _mm512_set1_ps(32767.0f / m);
    for (int j = 0; j < n; j += 16)
        _mm256_storeu_si256((__m256i *)(q + j), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(
                                                    _mm512_mul_ps(_mm512_loadu_ps(x + j), inv))));
    return m / 32767.0f;
}

/* ---- scores of 16 cache rows against M query vectors: s[i * ld_s + 0..16) = q_i . k_row.
 * pf: the same 16 rows of the next slice, prefetched row by row (NULL: none). */

static inline __attribute__((always_inline)) void scores_f32(const float *k, int D, const float *qf,
                                                           const int M, __m512 *tmp, float *s,
                                                           int ld_s, const char *pf) {
    for (int tt = 0; tt < 16; tt++) {
        if (pf) prefetch_bytes(pf + (int64_t)tt * 4 * D, 4 * D);
        __m512 a[MAX_M];
        for (int i = 0; i < M; i++) a[i] = _mm512_setzero_ps();
        for (int c = 0; c < D; c += 16) {
            __m512 x = _mm512_loadu_ps(k + (int64_t)tt * D + c);
            for (int i = 0; i < M; i++) a[i] = _mm512_fmadd_ps(x, _mm512_load_ps(qf + i * D + c), a[i]);
        }
        for (int i = 0; i < M; i++) tmp[i * 16 + tt] = a[i];
    }
    for (int i = 0; i < M; i++) _mm512_storeu_ps(s + i * ld_s, reduce16_ps(tmp + i * 16));
}

/* qf in even/odd order per 32 values */
static inline __attribute__((always_inline)) void scores_bf16(const uint16_t *k, int D,
                                                            const float *qf, const int M,
                                                            __m512 *tmp, float *s, int ld_s,
                                                            const char *pf) {
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    for (int tt = 0; tt < 16; tt++) {
        if (pf) prefetch_bytes(pf + (int64_t)tt * 2 * D, 2 * D);
        __m512 a0[MAX_M], a1[MAX_M];
        for (int i = 0; i < M; i++) a0[i] = a1[i] = _mm512_setzero_ps();
        for (int c = 0; c < D; c += 32) {
            __m512i x = _mm512_loadu_si512(k + (int64_t)tt * D + c);
            __m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            __m512 od = _mm512_castsi512_ps(_mm512_and_si512(x, hi_mask));
            for (int i = 0; i < M; i++) {
                a0[i] = _mm512_fmadd_ps(ev, _mm512_load_ps(qf + i * D + c), a0[i]);
                a1[i] = _mm512_fmadd_ps(od, _mm512_load_ps(qf + i * D + c + 16), a1[i]);
            }
        }
        for (int i = 0; i < M; i++) tmp[i * 16 + tt] = _mm512_add_ps(a0[i], a1[i]);
    }
    for (int i = 0; i < M; i++) _mm512_storeu_ps(s + i * ld_s, reduce16_ps(tmp + i * 16));
}

/* int8 / uint4: qi int16 (uint4: per 64 values, even d then odd d). The integer dot times
 * qscale_i * kscale_t, minus (uint4) qsum_i * kzero_t * kscale_t * qscale_i. */
static inline __attribute__((always_inline)) void scores_int(dn_kv_format_t f, const void *k, int D,
                                                           const int16_t *qi, const int M,
                                                           __m512i *tmp, float *s, int ld_s,
                                                           const float *kscale, const float *kzero,
                                                           const float *qscale, const float *qsum,
                                                           const char *pf) {
    const int64_t rb = row_bytes(f, D);
    for (int tt = 0; tt < 16; tt++) {
        if (pf) prefetch_bytes(pf + tt * rb, rb);
        __m512i a[MAX_M];
        for (int i = 0; i < M; i++) a[i] = _mm512_setzero_si512();
        if (f == DN_KV_INT8) {
            const int8_t *kr = (const int8_t *)k + (int64_t)tt * D;
            for (int c = 0; c < D; c += 32) {
                __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(kr + c)));
                for (int i = 0; i < M; i++)
                    a[i] = _mm512_dpwssd_epi32(a[i], x, _mm512_load_si512(qi + i * D + c));
            }
        } else {
            const uint8_t *kr = (const uint8_t *)k + (int64_t)tt * (D / 2);
            for (int c = 0; c < D; c += 64) {
                __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(kr + c / 2)));
                __m512i ev = _mm512_and_si512(w, _mm512_set1_epi16(15));
                __m512i od = _mm512_srli_epi16(w, 4);
                for (int i = 0; i < M; i++) {
                    a[i] = _mm512_dpwssd_epi32(a[i], ev, _mm512_load_si512(qi + i * D + c));
                    a[i] = _mm512_dpwssd_epi32(a[i], od, _mm512_load_si512(qi + i * D + c + 32));
                }
            }
        }
        for (int i = 0; i < M; i++) tmp[i * 16 + tt] = a[i];
    }
    __m512 ks = _mm512_loadu_ps(kscale);
    for (int i = 0; i < M; i++) {
        __m512 dot = _mm512_cvtepi32_ps(reduce16_epi32(tmp + i * 16));
        if (f == DN_KV_UINT4)
            dot = _mm512_fnmadd_ps(_mm512_loadu_ps(kzero), _mm512_set1_ps(qsum[i]), dot);
        _mm512_storeu_ps(s + i * ld_s, _mm512_mul_ps(dot, _mm512_mul_ps(ks, _mm512_set1_ps(qscale[i]))));
    }
}

/* ---- acc[i] += sum_t p[i][t] v_t over rows [t0, t1) of one slice; pf: the next slice's rows */

static inline __attribute__((always_inline)) void pv_f32(const float *v, int D, const float *p,
                                                       int ld_p, const int M, int t0, int t1,
                                                       float *acc, const char *pf) {
    for (int c = 0; c < D; c += 32) {
        __m512 a0[MAX_M], a1[MAX_M];
        for (int i = 0; i < M; i++) {
            a0[i] = _mm512_load_ps(acc + i * D + c);
            a1[i] = _mm512_load_ps(acc + i * D + c + 16);
        }
        for (int t = t0; t < t1; t++) {
            if (pf && c == 0) prefetch_bytes(pf + (int64_t)t * 4 * D, 4 * D);
            __m512 x0 = _mm512_loadu_ps(v + (int64_t)t * D + c);
            __m512 x1 = _mm512_loadu_ps(v + (int64_t)t * D + c + 16);
            for (int i = 0; i < M; i++) {
                __m512 w = _mm512_set1_ps(p[i * ld_p + t]);
                a0[i] = _mm512_fmadd_ps(w, x0, a0[i]);
                a1[i] = _mm512_fmadd_ps(w, x1, a1[i]);
            }
        }
        for (int i = 0; i < M; i++) {
            _mm512_store_ps(acc + i * D + c, a0[i]);
            _mm512_store_ps(acc + i * D + c + 16, a1[i]);
        }
    }
}

static inline __attribute__((always_inline)) void pv_bf16(const uint16_t *v, int D, const float *p,
                                                        int ld_p, const int M, int t0, int t1,
                                                        float *acc, const char *pf) {
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    for (int c = 0; c < D; c += 32) {
        __m512 a0[MAX_M], a1[MAX_M];
        for (int i = 0; i < M; i++) {
            a0[i] = _mm512_load_ps(acc + i * D + c);
            a1[i] = _mm512_load_ps(acc + i * D + c + 16);
        }
        for (int t = t0; t < t1; t++) {
            if (pf && c == 0) prefetch_bytes(pf + (int64_t)t * 2 * D, 2 * D);
            __m512i x = _mm512_loadu_si512(v + (int64_t)t * D + c);
            __m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            __m512 od = _mm512_castsi512_ps(_mm512_and_si512(x, hi_mask));
            for (int i = 0; i < M; i++) {
                __m512 w = _mm512_set1_ps(p[i * ld_p + t]);
                a0[i] = _mm512_fmadd_ps(w, ev, a0[i]);
                a1[i] = _mm512_fmadd_ps(w, od, a1[i]);
            }
        }
        for (int i = 0; i < M; i++) {
            _mm512_store_ps(acc + i * D + c, a0[i]);
            _mm512_store_ps(acc + i * D + c + 16, a1[i]);
        }
    }
}

/* pq [M][ld] int16 weights, t0 and t1 even, zero weights at padding rows; acc += wscale[i] *
 * the integer sums */
static inline __attribute__((always_inline)) void pv_int(dn_kv_format_t f, const void *v, int D,
                                                       const int16_t *pq, int ld, const int M,
                                                       int t0, int t1, const float *wscale,
                                                       float *acc, const char *pf) {
    const int64_t rb = row_bytes(f, D);
    if (f == DN_KV_INT8) {
        const int8_t *vr = v;
        for (int c = 0; c < D; c += 32) {
            __m512i lo[MAX_M], hi[MAX_M];
            for (int i = 0; i < M; i++) lo[i] = hi[i] = _mm512_setzero_si512();
            for (int t = t0; t < t1; t += 2) {
                if (pf && c == 0) prefetch_bytes(pf + t * rb, 2 * rb);
                __m512i x0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(vr + (int64_t)t * D + c)));
                __m512i x1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(vr + (int64_t)(t + 1) * D + c)));
                __m512i l = _mm512_unpacklo_epi16(x0, x1), h = _mm512_unpackhi_epi16(x0, x1);
                for (int i = 0; i < M; i++) {
                    int32_t pair;
                    memcpy(&pair, pq + i * ld + t, 4);
                    __m512i w = _mm512_set1_epi32(pair);
                    lo[i] = _mm512_dpwssd_epi32(lo[i], l, w);
                    hi[i] = _mm512_dpwssd_epi32(hi[i], h, w);
                }
            }
            for (int i = 0; i < M; i++) {
                __m512 ws = _mm512_set1_ps(wscale[i]);
                float *a = acc + i * D + c;
                _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[i]), ws, _mm512_load_ps(a)));
                _mm512_store_ps(a + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[i]), ws, _mm512_load_ps(a + 16)));
            }
        }
        return;
    }
    const uint8_t *vr = v;
    const __m512i nib = _mm512_set1_epi16(15);
    for (int c = 0; c < D; c += 64) {
        __m512i a[MAX_M][4];
        for (int i = 0; i < M; i++)
            for (int j = 0; j < 4; j++) a[i][j] = _mm512_setzero_si512();
        for (int t = t0; t < t1; t += 2) {
            if (pf && c == 0) prefetch_bytes(pf + t * rb, 2 * rb);
            __m512i w0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(vr + (int64_t)t * (D / 2) + c / 2)));
            __m512i w1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(vr + (int64_t)(t + 1) * (D / 2) + c / 2)));
            __m512i e0 = _mm512_and_si512(w0, nib), e1 = _mm512_and_si512(w1, nib);
            __m512i o0 = _mm512_srli_epi16(w0, 4), o1 = _mm512_srli_epi16(w1, 4);
            __m512i x[4] = {_mm512_unpacklo_epi16(e0, e1), _mm512_unpackhi_epi16(e0, e1),
                            _mm512_unpacklo_epi16(o0, o1), _mm512_unpackhi_epi16(o0, o1)};
            for (int i = 0; i < M; i++) {
                int32_t pair;
                memcpy(&pair, pq + i * ld + t, 4);
                __m512i w = _mm512_set1_epi32(pair);
                for (int j = 0; j < 4; j++) a[i][j] = _mm512_dpwssd_epi32(a[i][j], x[j], w);
            }
        }
        for (int i = 0; i < M; i++) {
            __m512 ws = _mm512_set1_ps(wscale[i]);
            for (int j = 0; j < 4; j++) {
                float *p = acc + i * D + c + 16 * j;
                _mm512_store_ps(p, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[i][j]), ws, _mm512_load_ps(p)));
            }
        }
    }
}

/* ---- the tile */

/* Per-vector state of a tile, H heads x M vectors, in the scratch. Sums are kept as 16 lanes
 * and added up at the end: no horizontal sum per slice. */
typedef struct {
    float *q;      /* [H][M][D] scaled queries in the lane order of K (int formats: int16) */
    float *acc;    /* [H][M][D] weighted V sums in the lane order of V */
    float *sumv;   /* [H * M][16] lanes of the running sum of exp(score - max) */
    float *ztv;    /* [H * M][16] uint4: lanes of sum weight * v_zero * v_scale, subtracted at the end */
    float *mx;     /* [H * M] running max of the scores */
    float *qscale; /* [H * M] int formats: q ~= qi * qscale */
    float *qsum;   /* [H * M] uint4: sum of qi, for the K zero points */
} state_t;

/* Scaled queries of one kv head in the form the scores want. */
static void load_queries(const attn_tile_t *t, int head, const int M, const state_t *st,
                         float *stage /* [2][D] */) {
    const dn_kv_format_t f = t->kv->format;
    const int D = t->kv->head_dim, nh = t->n_q_heads;
    for (int i = 0; i < M; i++) {
        const int v = head * M + i;
        const float *src = t->q + (i / nh) * t->q_stride + (int64_t)(head * nh + i % nh) * D;
        for (int d = 0; d < D; d++) stage[d] = src[d] * t->scale;
        float *qf = st->q + (int64_t)v * D;
        int16_t *qi = (int16_t *)st->q + (int64_t)v * D;
        if (f == DN_KV_F32 || f == DN_KV_BF16) {
            for (int c = 0; c < D; c += 32)
                for (int p = 0; p < 32; p++) qf[c + p] = stage[c + acc_lane_d(f, p)];
        } else if (f == DN_KV_INT8) {
            st->qscale[v] = quantize_i16(stage, D, qi);
        } else {
            float *perm = stage + D;
            for (int c = 0; c < D; c += 64)
                for (int p = 0; p < 64; p++) perm[c + p] = stage[c + (p < 32 ? 2 * p : 2 * (p - 32) + 1)];
            st->qscale[v] = quantize_i16(perm, D, qi);
            int32_t qs = 0;
            for (int d = 0; d < D; d++) qs += qi[d];
            st->qsum[v] = (float)qs;
        }
    }
}

/* Mask of the tokens g..g+16 of a slice that lie in [lo, hi). */
static inline __mmask16 tokens_in(int g, int lo, int hi) {
    __m512i tok = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                   _mm512_set1_epi32(g));
    return _mm512_cmpge_epi32_mask(tok, _mm512_set1_epi32(lo)) &
           _mm512_cmplt_epi32_mask(tok, _mm512_set1_epi32(hi));
}

/* Rows off..off+n of one (block, head) slice whose first row is `row`; the M vectors of `head`.
 * next: first row of the slice to prefetch, or -1. Scratch: tmp [M * 16] vectors, s [M][bs],
 * pq [M][bs + 32]. */
static inline __attribute__((always_inline)) void slice_step(const attn_tile_t *t, const state_t *st,
                                                            int head, int pos, int64_t row,
                                                            int off, int n, int64_t next,
                                                            const int M, const int D, __m512 *tmp,
                                                            float *s, int16_t *pq) {
    const dn_kv_cache_t *kv = t->kv;
    const dn_kv_format_t f = kv->format;
    const int bs = kv->block_size, nh = t->n_q_heads;
    const int64_t rb = row_bytes(f, D);
    const int ldp = bs + 32;
    const int v0 = head * M; /* the head's first vector */
    float *qf = st->q + (int64_t)v0 * D, *acc = st->acc + (int64_t)v0 * D;
    const int16_t *qi = (const int16_t *)st->q + (int64_t)v0 * D;
    const char *kn = next >= 0 ? (const char *)kv->k + next * rb : NULL;
    const char *vn = next >= 0 ? (const char *)kv->v + next * rb : NULL;
    const float *vs = kv->v_scale ? kv->v_scale + row : NULL; /* int formats */
    const float *vz = kv->v_zero ? kv->v_zero + row : NULL;   /* uint4 */
    if (kn && vs) { /* the per-token scales of the next slice */
        prefetch_bytes((const char *)(kv->k_scale + next), 4 * bs);
        prefetch_bytes((const char *)(kv->v_scale + next), 4 * bs);
        if (vz) {
            prefetch_bytes((const char *)(kv->k_zero + next), 4 * bs);
            prefetch_bytes((const char *)(kv->v_zero + next), 4 * bs);
        }
    }

    /* scores of all M vectors for tokens g0..g1 of the slice */
    const int g0 = off & ~15, g1 = (off + n + 15) & ~15;
    for (int g = g0; g < g1; g += 16) {
        const char *pf = kn ? kn + g * rb : NULL;
        if (f == DN_KV_F32)
            scores_f32((const float *)kv->k + (row + g) * D, D, qf, M, tmp, s + g, bs, pf);
        else if (f == DN_KV_BF16)
            scores_bf16((const uint16_t *)kv->k + (row + g) * D, D, qf, M, tmp, s + g, bs, pf);
        else
            scores_int(f, (const char *)kv->k + (row + g) * rb, D, qi, M, (__m512i *)tmp, s + g,
                       bs, kv->k_scale + row + g, vz ? kv->k_zero + row + g : NULL,
                       st->qscale + v0, st->qsum + v0, pf);
    }

    /* online softmax: vector i sees the tokens [off, te[i]) of the slice, weights 0 elsewhere */
    int tmax = off, te[MAX_M];
    float bmax[16];
    for (int i = 0; i < M; i++) {
        int nv = t->first_pos + i / nh - pos + 1; /* positions from pos on that it sees */
        te[i] = off + (nv < 0 ? 0 : nv > n ? n : nv);
        if (te[i] > tmax) tmax = te[i];
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int g = g0; g < g1; g += 16)
            m = _mm512_mask_max_ps(m, tokens_in(g, off, te[i]), m, _mm512_loadu_ps(s + i * bs + g));
        bmax[i] = _mm512_reduce_max_ps(m);
    }
    /* the M vectors side by side in the lanes */
    const __mmask16 lanes = (__mmask16)((1u << M) - 1);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 mo = _mm512_mask_loadu_ps(ninf, lanes, st->mx + v0);
    __m512 mb = _mm512_mask_loadu_ps(ninf, lanes, bmax);
    __m512 mn = _mm512_max_ps(mo, mb);
    /* vectors that saw nothing yet subtract 0, keeping exp(-inf) = 0 and no NaN */
    __m512 muse = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), mn, _mm512_setzero_ps());
    float alpha[16], mu[16], wsc[MAX_M];
    _mm512_storeu_ps(alpha, exp512(_mm512_sub_ps(mo, muse)));
    _mm512_storeu_ps(mu, muse);
    _mm512_mask_storeu_ps(st->mx + v0, lanes, mn);
    const __mmask16 had = _mm512_cmp_ps_mask(mo, ninf, _CMP_NEQ_OQ); /* acc holds something */
    for (int i = 0; i < M; i++) {
        const __m512 m = _mm512_set1_ps(mu[i]), al = _mm512_set1_ps(alpha[i]);
        float *sumv = st->sumv + (v0 + i) * 16, *ztv = st->ztv + (v0 + i) * 16;
        __m512 psum = _mm512_mul_ps(_mm512_load_ps(sumv), al), wmax = _mm512_setzero_ps();
        float *wi = s + i * bs;
        for (int g = g0; g < g1; g += 16) {
            __mmask16 ok = tokens_in(g, off, te[i]);
            __m512 p = _mm512_maskz_mov_ps(ok, exp512(_mm512_sub_ps(_mm512_loadu_ps(wi + g), m)));
            psum = _mm512_add_ps(psum, p);
            if (vs) { /* int formats: the weights times the V scales */
                p = _mm512_maskz_mul_ps(ok, p, _mm512_maskz_loadu_ps(ok, vs + g));
                wmax = _mm512_max_ps(wmax, p);
            }
            _mm512_storeu_ps(wi + g, p);
        }
        if (vs) { /* to int16 with one scale for the slice */
            float top = _mm512_reduce_max_ps(wmax);
            wsc[i] = top / 32767;
            const __m512 inv = _mm512_set1_ps(top > 0.0f ? 32767 / top : 0.0f);
            __m512 zsum = _mm512_setzero_ps();
            int16_t *pi = pq + i * ldp;
            for (int g = g0; g < g1; g += 16) {
                __m512i wq = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(wi + g), inv));
                _mm256_storeu_si256((__m256i *)(pi + g), _mm512_cvtepi32_epi16(wq));
                if (vz) /* the zero points' share, with the weights as quantized */
                    zsum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(wq),
                                           _mm512_maskz_loadu_ps(tokens_in(g, off, te[i]), vz + g), zsum);
            }
            if (vz)
                _mm512_store_ps(ztv, _mm512_fmadd_ps(zsum, _mm512_set1_ps(wsc[i]),
                                                     _mm512_mul_ps(_mm512_load_ps(ztv), al)));
        }
        _mm512_store_ps(sumv, psum);
        if (alpha[i] != 1.0f && (had >> i & 1))
            for (int d = 0; d < D; d += 16)
                _mm512_store_ps(acc + i * D + d, _mm512_mul_ps(al, _mm512_load_ps(acc + i * D + d)));
    }

    if (f == DN_KV_F32)
        pv_f32((const float *)kv->v + row * D, D, s, bs, M, off, tmax, acc, vn);
    else if (f == DN_KV_BF16)
        pv_bf16((const uint16_t *)kv->v + row * D, D, s, bs, M, off, tmax, acc, vn);
    else
        pv_int(f, (const char *)kv->v + row * rb, D, pq, ldp, M, off & ~1, (tmax + 1) & ~1, wsc,
               acc, vn);
}

/* M is a constant in each instantiation, so the per-vector accumulators live in registers */
static inline __attribute__((always_inline)) void decode_m(const attn_tile_t *t, const int M,
                                                           const int D) {
    const dn_kv_cache_t *kv = t->kv;
    const dn_kv_format_t f = kv->format;
    const int bs = kv->block_size, H = t->n_kv;
    const int V = H * M; /* vectors of the tile, <= ATTN_MAX_M */
    char *w = t->work;
    state_t st;
    st.q = (float *)w;                    w += (size_t)V * D * 4;
    st.acc = (float *)w;                  w += (size_t)V * D * 4;
    st.sumv = (float *)w;                 w += (size_t)V * 16 * 4;
    st.ztv = (float *)w;                  w += (size_t)V * 16 * 4;
    st.mx = (float *)w;                   w += (size_t)ATTN_MAX_M * 4;
    st.qscale = (float *)w;               w += (size_t)ATTN_MAX_M * 4;
    st.qsum = (float *)w;                 w += (size_t)ATTN_MAX_M * 4;
    __m512 *tmp = (__m512 *)w;            w += (size_t)MAX_M * 16 * 64;
    float *s = (float *)w;                w += (size_t)MAX_M * bs * 4;          /* [M][bs] */
    int16_t *pq = (int16_t *)w;           w += (size_t)MAX_M * (bs + 32) * 2;   /* [M][bs + 32] */
    float *stage = (float *)w;                                                   /* [2][D] */

    for (int h = 0; h < H; h++) load_queries(t, h, M, &st, stage);
    memset(st.acc, 0, (size_t)V * D * 4);
    memset(st.sumv, 0, (size_t)V * 16 * 4);
    memset(st.ztv, 0, (size_t)V * 16 * 4);
    for (int v = 0; v < V; v++) st.mx[v] = -INFINITY;

    const int nkv = kv->n_kv_heads;
    for (int pos = t->kv_begin; pos < t->kv_end;) {
        const int off = pos % bs;
        const int n = bs - off < t->kv_end - pos ? bs - off : t->kv_end - pos;
        const int64_t row0 = ((int64_t)t->blocks[pos / bs] * nkv + t->kv_head) * bs;
        const int64_t next0 = pos + n < t->kv_end
                                  ? ((int64_t)t->blocks[(pos + n) / bs] * nkv + t->kv_head) * bs
                                  : -1;
        for (int h = 0; h < H; h++)
            slice_step(t, &st, h, pos, row0 + (int64_t)h * bs, off, n,
                       h + 1 < H ? row0 + (int64_t)(h + 1) * bs : next0, M, D, tmp, s, pq);
        pos += n;
    }

    /* per head: back to head_dim order (and the uint4 zero term), then out or the partial */
    float *nat = (float *)tmp; /* MAX_M * 16 * 16 floats >= M * D when D <= 256 */
    const int chunk = f == DN_KV_UINT4 ? 64 : 32;
    for (int h = 0; h < H; h++) {
        float sum[MAX_M];
        for (int i = 0; i < M; i++) {
            const int v = h * M + i;
            const float *acc = st.acc + (int64_t)v * D;
            float zt = _mm512_reduce_add_ps(_mm512_load_ps(st.ztv + v * 16));
            sum[i] = _mm512_reduce_add_ps(_mm512_load_ps(st.sumv + v * 16));
            for (int c = 0; c < D; c += chunk)
                for (int p = 0; p < chunk; p++) nat[i * D + c + acc_lane_d(f, p)] = acc[c + p] - zt;
        }
        attn_tile_t one = *t;
        if (t->out) one.out = t->out + (int64_t)h * t->n_q_heads * D;
        if (t->part) one.part = t->part + (int64_t)h * M * (D + 2);
        attn_finish(&one, nat, st.mx + h * M, sum);
    }
}

int attn_decode_avx512_fits(const dn_kv_cache_t *c, int M) {
    return M <= MAX_M && c->head_dim % 32 == 0 && c->head_dim <= 256 &&
           (c->format != DN_KV_UINT4 || c->head_dim % 64 == 0);
}

/* M and the common head sizes are constants in each instantiation: the per-vector accumulators
 * live in registers and the loops over head_dim unroll. */
#define DECODE_D(M)                                                \
    switch (t->kv->head_dim) {                                     \
    case 64: decode_m(t, M, 64); break;                            \
    case 128: decode_m(t, M, 128); break;                          \
    default: decode_m(t, M, t->kv->head_dim); break;               \
    }

void attn_decode_avx512(const attn_tile_t *t) {
    switch (t->n_q_heads * t->n_rows) {
    case 1: DECODE_D(1); break;
    case 2: DECODE_D(2); break;
    case 3: DECODE_D(3); break;
    case 4: DECODE_D(4); break;
    case 5: DECODE_D(5); break;
    case 6: DECODE_D(6); break;
    case 7: DECODE_D(7); break;
    default: DECODE_D(8); break;
    }
}

#pragma GCC pop_options
