/* AVX-512 attention tiles.
 *
 * Decode-shaped tiles (few query vectors) are bound by the bytes of K/V streamed from memory, so
 * the work per cache byte must stay small: every query head of the GQA group is scored against a
 * K row while it is in registers, and each V row is converted once for all of them.
 *   bf16: exact fp32 math. A 64-byte load of 32 bf16 gives the even elements by a shift and the
 *         odd ones by a mask; q is stored in that even/odd order, and so is the accumulator.
 *   int8 / uint4: fp32 FMAs cannot keep up with 1-byte and half-byte elements on two cores, so
 *         dot products run on VNNI (vpdpwssd, int16 pairs into int32): q is quantized to int16
 *         per vector (rel. error 2^-16, negligible next to the cache's own 8- or 4-bit error), and
 *         the softmax weights times the V scales are quantized to int16 per block. Scores, the
 *         running max and sum, and the output stay fp32.
 * Prefill tiles (many query vectors per K/V block) are compute bound: the block is converted to
 * fp32 once and both products run as register-blocked FMA kernels (see prefill_tile). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attention_tile.h"
#include "common.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")

#define DECODE_MAX_M 8

/* e^x for x <= 88, with e^x = 0 below -87 (the callers mask those lanes anyway). */
static inline __m512 exp512(__m512 x) {
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps((__mmask16)~tiny, p, n);
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

/* Where the accumulator lane `pos` of a chunk lives in head_dim (chunk: 32 values, uint4 V 64). */
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

/* asm, because gcc 12 drops _mm_prefetch in these loops as if it had no effect */
static inline void prefetch_rows(const char *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __asm__ volatile("prefetcht0 %0" : : "m"(p[o]));
}

/* ---- decode: scores of 16 tokens against M query vectors */

/* bf16: qf [M][D] fp32 in even/odd order; scores[i] = 16 lanes of q_i . k_t */
static inline __attribute__((always_inline)) void scores_bf16(const uint16_t *k, int D, const float *qf, int M, __m512 *tmp,
                               float *s, int ld_s) {
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    for (int tt = 0; tt < 16; tt++) {
        __m512 a0[DECODE_MAX_M], a1[DECODE_MAX_M];
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

/* fp32: qf [M][D] in head_dim order */
static inline __attribute__((always_inline)) void scores_f32(const float *k, int D, const float *qf, int M, __m512 *tmp,
                              float *s, int ld_s) {
    for (int tt = 0; tt < 16; tt++) {
        __m512 a[DECODE_MAX_M];
        for (int i = 0; i < M; i++) a[i] = _mm512_setzero_ps();
        for (int c = 0; c < D; c += 16) {
            __m512 x = _mm512_loadu_ps(k + (int64_t)tt * D + c);
            for (int i = 0; i < M; i++) a[i] = _mm512_fmadd_ps(x, _mm512_load_ps(qf + i * D + c), a[i]);
        }
        for (int i = 0; i < M; i++) tmp[i * 16 + tt] = a[i];
    }
    for (int i = 0; i < M; i++) _mm512_storeu_ps(s + i * ld_s, reduce16_ps(tmp + i * 16));
}

/* int8 / uint4: qi [M][D] int16 (uint4: per 64 values, even d then odd d); integer dots */
static inline __attribute__((always_inline)) void scores_int(dn_kv_format_t f, const void *k, int D, const int16_t *qi, int M,
                              __m512i *tmp, float *s, int ld_s, const float *kscale,
                              const float *kzero, const float *qscale, const float *qsum) {
    for (int tt = 0; tt < 16; tt++) {
        __m512i a[DECODE_MAX_M];
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

/* ---- decode: acc[i] += sum_t p[i][t] v_t over rows [t0, t1) of one block */

static inline __attribute__((always_inline)) void pv_bf16(const uint16_t *v, int D, const float *p, int ld_p, int M, int t0,
                           int t1, float *acc) {
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    for (int c = 0; c < D; c += 32) {
        __m512 a0[DECODE_MAX_M], a1[DECODE_MAX_M];
        for (int i = 0; i < M; i++) {
            a0[i] = _mm512_load_ps(acc + i * D + c);
            a1[i] = _mm512_load_ps(acc + i * D + c + 16);
        }
        for (int t = t0; t < t1; t++) {
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

static inline __attribute__((always_inline)) void pv_f32(const float *v, int D, const float *p, int ld_p, int M, int t0,
                          int t1, float *acc) {
    for (int c = 0; c < D; c += 32) {
        __m512 a0[DECODE_MAX_M], a1[DECODE_MAX_M];
        for (int i = 0; i < M; i++) {
            a0[i] = _mm512_load_ps(acc + i * D + c);
            a1[i] = _mm512_load_ps(acc + i * D + c + 16);
        }
        for (int t = t0; t < t1; t++) {
            __m512 x0 = _mm512_loadu_ps(v + (int64_t)t * D + c), x1 = _mm512_loadu_ps(v + (int64_t)t * D + c + 16);
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

/* pq [M][ld] int16 weights, t0 even, zero at padding rows; acc += wscale[i] * integer sums */
static inline __attribute__((always_inline)) void pv_int(dn_kv_format_t f, const void *v, int D, const int16_t *pq, int ld,
                          int M, int t0, int t1, const float *wscale, float *acc) {
    if (f == DN_KV_INT8) {
        const int8_t *vr = v;
        for (int c = 0; c < D; c += 32) {
            __m512i lo[DECODE_MAX_M], hi[DECODE_MAX_M];
            for (int i = 0; i < M; i++) lo[i] = hi[i] = _mm512_setzero_si512();
            for (int t = t0; t < t1; t += 2) {
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
        __m512i a[DECODE_MAX_M][4];
        for (int i = 0; i < M; i++)
            for (int j = 0; j < 4; j++) a[i][j] = _mm512_setzero_si512();
        for (int t = t0; t < t1; t += 2) {
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

/* Quantize fp32 values to int16 with one scale: x ~= q * scale. Returns the scale (0 if all 0). */
static float quantize_i16(const float *x, int n, int16_t *q) {
    __m512 amax = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= n; j += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    float m = _mm512_reduce_max_ps(amax);
    for (; j < n; j++) m = fmaxf(m, fabsf(x[j]));
    if (m == 0.0f) {
        memset(q, 0, (size_t)n * 2);
        return 0.0f;
    }
    float inv = 32767.0f / m;
    for (j = 0; j + 16 <= n; j += 16) {
        __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + j), _mm512_set1_ps(inv)));
        _mm256_storeu_si256((__m256i *)(q + j), _mm512_cvtsepi32_epi16(r));
    }
    for (; j < n; j++) q[j] = (int16_t)lrintf(x[j] * inv);
    return m / 32767.0f;
}

/* M is a constant in each instantiation, so the per-vector accumulators live in registers */
static inline __attribute__((always_inline)) void decode_tile_m(const attn_tile_t *t,
                                                                const int M) {
    const dn_kv_cache_t *kv = t->kv;
    const dn_kv_format_t f = kv->format;
    const int D = kv->head_dim, bs = kv->block_size, nh = t->n_q_heads;
    const int64_t kbytes = f == DN_KV_F32 ? 4 * D : f == DN_KV_BF16 ? 2 * D : f == DN_KV_INT8 ? D : D / 2; /* per row */
    /* scratch, 64-byte aligned pieces */
    char *w = t->work;
    float *qf = (float *)w;                 w += (size_t)M * D * 4;  /* [M][D] bf16 path */
    int16_t *qi = (int16_t *)qf;                                      /* [M][D] int path */
    float *acc = (float *)w;                w += (size_t)M * D * 4;  /* [M][D] lane order */
    __m512 *tmp = (__m512 *)w;              w += (size_t)M * 16 * 64;
    float *s = (float *)w;                  w += (size_t)M * bs * 4; /* [M][bs] scores, weights */
    int16_t *pq = (int16_t *)w;             w += ((size_t)M * (bs + 32) * 2 + 63) & ~(size_t)63;
    float *stage = (float *)w;              w += (size_t)D * 2 * 4;  /* [2][D] */
    float *mx = (float *)w, *sum = mx + M, *zt = sum + M, *qscale = zt + M, *qsum = qscale + M,
          *wscale = qsum + M;
    const int ldp = bs + 32;

    /* queries, scaled by the softmax scale, in the lane order of the K rows */
    for (int i = 0; i < M; i++) {
        const float *src = t->q + (i / nh) * t->q_stride + (int64_t)(i % nh) * D;
        float *dst = stage;
        for (int d = 0; d < D; d++) dst[d] = src[d] * t->scale;
        if (f == DN_KV_F32 || f == DN_KV_BF16) {
            for (int c = 0; c < D; c += 32)
                for (int p = 0; p < 32; p++) qf[i * D + c + p] = dst[c + acc_lane_d(f, p)];
        } else if (f == DN_KV_INT8) {
            qscale[i] = quantize_i16(dst, D, qi + i * D);
        } else {
            float *perm = stage + D;
            for (int c = 0; c < D; c += 64)
                for (int p = 0; p < 64; p++) perm[c + p] = dst[c + (p < 32 ? 2 * p : 2 * (p - 32) + 1)];
            qscale[i] = quantize_i16(perm, D, qi + i * D);
            int32_t qs = 0;
            for (int d = 0; d < D; d++) qs += qi[i * D + d];
            qsum[i] = (float)qs;
        }
    }
    for (int i = 0; i < M * D; i++) acc[i] = 0.0f;
    for (int i = 0; i < M; i++) {
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
        zt[i] = 0.0f;
    }

    for (int pos = t->kv_begin; pos < t->kv_end;) {
        const int off = pos % bs;
        const int n = bs - off < t->kv_end - pos ? bs - off : t->kv_end - pos;
        const int64_t row = attn_cache_row(t, pos) - off; /* the block's first row */
        /* the next block is fetched while this one computes, a slice per 16 tokens: a burst
         * of a whole block would stall on the core's miss buffers */
        const char *next_k = NULL, *next_v = NULL;
        if (pos + n < t->kv_end) {
            int64_t next = attn_cache_row(t, pos + n);
            next_k = (const char *)kv->k + next * kbytes;
            next_v = (const char *)kv->v + next * kbytes;
        }
        const int g0 = off & ~15, g1 = (off + n + 15) & ~15;
        /* scores of all M vectors for tokens g0..g1 of the block */
        for (int g = g0; g < g1; g += 16) {
            if (next_k) {
                int slice = bs * kbytes / ((g1 - g0) / 16);
                int from = (g - g0) / 16 * slice;
                prefetch_rows(next_k + from, slice);
                prefetch_rows(next_v + from, slice);
            }
            if (f == DN_KV_F32)
                scores_f32((const float *)kv->k + (row + g) * D, D, qf, M, tmp, s + g, bs);
            else if (f == DN_KV_BF16)
                scores_bf16((const uint16_t *)kv->k + (row + g) * D, D, qf, M, tmp, s + g, bs);
            else
                scores_int(f, (const char *)kv->k + (row + g) * kbytes, D, qi, M,
                           (__m512i *)tmp, s + g, bs, kv->k_scale + row + g,
                           f == DN_KV_UINT4 ? kv->k_zero + row + g : NULL, qscale, qsum);
        }
        /* online softmax per vector over the tokens it sees */
        int tmax = off;
        for (int i = 0; i < M; i++) {
            int nv = t->first_pos + i / nh - pos + 1;
            if (nv > n) nv = n;
            int te = off + (nv > 0 ? nv : 0);
            if (te > tmax) tmax = te;
            if (nv <= 0) {
                for (int g = g0; g < g1; g += 16) _mm512_storeu_ps(s + i * bs + g, _mm512_setzero_ps());
                continue;
            }
            __m512 vmax = _mm512_set1_ps(-INFINITY);
            __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            for (int g = g0; g < g1; g += 16) {
                __m512i tok = _mm512_add_epi32(lane, _mm512_set1_epi32(g));
                __mmask16 ok = _mm512_cmpge_epi32_mask(tok, _mm512_set1_epi32(off)) &
                               _mm512_cmplt_epi32_mask(tok, _mm512_set1_epi32(te));
                vmax = _mm512_mask_max_ps(vmax, ok, vmax, _mm512_loadu_ps(s + i * bs + g));
            }
            float mnew = fmaxf(mx[i], _mm512_reduce_max_ps(vmax));
            float alpha = expf(mx[i] - mnew);
            __m512 vsum = _mm512_setzero_ps(), m = _mm512_set1_ps(mnew);
            for (int g = g0; g < g1; g += 16) {
                __m512i tok = _mm512_add_epi32(lane, _mm512_set1_epi32(g));
                __mmask16 ok = _mm512_cmpge_epi32_mask(tok, _mm512_set1_epi32(off)) &
                               _mm512_cmplt_epi32_mask(tok, _mm512_set1_epi32(te));
                __m512 p = _mm512_maskz_mov_ps(ok, exp512(_mm512_sub_ps(
                                                       _mm512_maskz_loadu_ps(ok, s + i * bs + g), m)));
                vsum = _mm512_add_ps(vsum, p);
                _mm512_storeu_ps(s + i * bs + g, p);
            }
            sum[i] = sum[i] * alpha + _mm512_reduce_add_ps(vsum);
            mx[i] = mnew;
            if (alpha != 1.0f) {
                __m512 a = _mm512_set1_ps(alpha);
                for (int d = 0; d < D; d += 16)
                    _mm512_store_ps(acc + i * D + d, _mm512_mul_ps(a, _mm512_load_ps(acc + i * D + d)));
                zt[i] *= alpha;
            }
        }
        if (f == DN_KV_F32) {
            pv_f32((const float *)kv->v + row * D, D, s, bs, M, off, tmax, acc);
        } else if (f == DN_KV_BF16) {
            pv_bf16((const uint16_t *)kv->v + row * D, D, s, bs, M, off, tmax, acc);
        } else {
            /* weights times the V scales, quantized per vector for this block */
            const float *vs = kv->v_scale + row;
            const float *vz = f == DN_KV_UINT4 ? kv->v_zero + row : NULL;
            int t0 = off & ~1, t1 = (tmax + 1) & ~1;
            for (int i = 0; i < M; i++) {
                float *wi = s + i * bs;
                for (int tk = off; tk < tmax; tk++) wi[tk] *= vs[tk];
                if (t0 < off) wi[t0] = 0.0f;
                if (t1 > tmax) wi[tmax] = 0.0f; /* tmax < bs here: the row exists, weight 0 */
                wscale[i] = quantize_i16(wi + t0, t1 - t0, pq + i * ldp + t0);
                if (vz) {
                    float zs = 0.0f;
                    for (int tk = off; tk < tmax; tk++) zs += pq[i * ldp + tk] * vz[tk];
                    zt[i] += zs * wscale[i];
                }
            }
            pv_int(f, (const char *)kv->v + row * kbytes, D, pq, ldp, M, t0, t1, wscale, acc);
        }
        pos += n;
    }

    /* back to head_dim order (and the uint4 zero term) before writing out */
    float *nat = (float *)tmp; /* M * 16 * 16 floats >= M * D when D <= 256 */
    int chunk = f == DN_KV_UINT4 ? 64 : 32; /* fp32: the identity */
    for (int i = 0; i < M; i++)
        for (int c = 0; c < D; c += chunk)
            for (int p = 0; p < chunk; p++)
                nat[i * D + c + acc_lane_d(f, p)] = acc[i * D + c + p] - zt[i];
    attn_finish(t, nat, mx, sum);
}

static void decode_tile(const attn_tile_t *t) {
    switch (t->n_q_heads * t->n_rows) {
    case 1: decode_tile_m(t, 1); break;
    case 2: decode_tile_m(t, 2); break;
    case 3: decode_tile_m(t, 3); break;
    case 4: decode_tile_m(t, 4); break;
    case 5: decode_tile_m(t, 5); break;
    case 6: decode_tile_m(t, 6); break;
    case 7: decode_tile_m(t, 7); break;
    default: decode_tile_m(t, 8); break;
    }
}


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

void attn_tile_avx512(const attn_tile_t *t) {
    int M = t->n_q_heads * t->n_rows, D = t->kv->head_dim;
    if (M <= DECODE_MAX_M && D <= 256 && (t->kv->format != DN_KV_UINT4 || D % 64 == 0))
        decode_tile(t);
    else
        prefill_tile(t);
}

#pragma GCC pop_options
