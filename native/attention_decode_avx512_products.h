/* The products of one (block, head) slice of the AVX-512 decode tile, per KV cache format:
 * scores of 16 tokens of K against M query vectors, and the weighted sum of V (the method is in
 * attention_decode_avx512.c's opening comment). Included once, by that file, after its target
 * pragma and MAX_M. */
#pragma once
#include <string.h>

static inline __m512i bcast32(const void *p) {
    int32_t x;
    memcpy(&x, p, 4);
    return _mm512_set1_epi32(x);
}

static inline void prefetch_line(const char *p) { __asm__ volatile("prefetcht1 %0" : : "m"(*p)); }

/* ---- scores of the 16 tokens of a K group: s[i * ld_s + 0..16) = q_i . k_t.
 * pf: the same group of the next slice, prefetched as this one is read (NULL: none). U
 * independent sums per vector keep enough multiply-adds in flight to cover their latency. */

static inline __attribute__((always_inline)) void scores_f32(const float *kg, const int D,
                                                           const float *qf, const int M, float *s,
                                                           int ld_s, const char *pf) {
    enum { U = 4 };
    __m512 a[MAX_M][U];
    for (int i = 0; i < M; i++)
        for (int u = 0; u < U; u++) a[i][u] = _mm512_setzero_ps();
    for (int d0 = 0; d0 < D; d0 += U)
        for (int u = 0; u < U; u++) { /* u constant after unrolling: a[][] stays in registers */
            const int d = d0 + u;
            if (pf) prefetch_line(pf + 64 * d);
            __m512 x = _mm512_loadu_ps(kg + 16 * d);
            for (int i = 0; i < M; i++)
                a[i][u] = _mm512_fmadd_ps(x, _mm512_set1_ps(qf[i * D + d]), a[i][u]);
        }
    for (int i = 0; i < M; i++)
        _mm512_storeu_ps(s + i * ld_s, _mm512_add_ps(_mm512_add_ps(a[i][0], a[i][1]),
                                                     _mm512_add_ps(a[i][2], a[i][3])));
}

static inline __attribute__((always_inline)) void scores_bf16(const uint16_t *kg, const int D,
                                                            const float *qf, const int M,
                                                            float *s, int ld_s, const char *pf) {
    enum { U = 2 };
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    __m512 a[MAX_M][U];
    for (int i = 0; i < M; i++)
        for (int u = 0; u < U; u++) a[i][u] = _mm512_setzero_ps();
    for (int j0 = 0; j0 < D / 2; j0 += U)
        for (int u = 0; u < U; u++) {
            const int j = j0 + u;
            if (pf) prefetch_line(pf + 64 * j);
            __m512i x = _mm512_loadu_si512(kg + 32 * j);
            __m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            __m512 od = _mm512_castsi512_ps(_mm512_and_si512(x, hi_mask));
            for (int i = 0; i < M; i++) {
                a[i][u] = _mm512_fmadd_ps(ev, _mm512_set1_ps(qf[i * D + 2 * j]), a[i][u]);
                a[i][u] = _mm512_fmadd_ps(od, _mm512_set1_ps(qf[i * D + 2 * j + 1]), a[i][u]);
            }
        }
    for (int i = 0; i < M; i++) _mm512_storeu_ps(s + i * ld_s, _mm512_add_ps(a[i][0], a[i][1]));
}

/* int8: qi [M][2 * D] int16 (the first D used); s = dot * qscale_i * kscale_t */
static inline __attribute__((always_inline)) void scores_int8(const int8_t *kg, const int D,
                                                            const int16_t *qi, const int M,
                                                            float *s, int ld_s, const float *kscale,
                                                            const float *qscale, const char *pf) {
    enum { U = 2 };
    __m512i a[MAX_M][U];
    for (int i = 0; i < M; i++)
        for (int u = 0; u < U; u++) a[i][u] = _mm512_setzero_si512();
    for (int j0 = 0; j0 < D / 2; j0 += U) { /* U = 2 pairs: one line */
        if (pf) prefetch_line(pf + 32 * j0);
        for (int u = 0; u < U; u++) {
            const int j = j0 + u;
            __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(kg + 32 * j)));
            for (int i = 0; i < M; i++)
                a[i][u] = _mm512_dpwssd_epi32(a[i][u], x, bcast32(qi + i * 2 * D + 2 * j));
        }
    }
    const __m512 ks = _mm512_loadu_ps(kscale);
    for (int i = 0; i < M; i++) {
        __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(a[i][0], a[i][1]));
        _mm512_storeu_ps(s + i * ld_s, _mm512_mul_ps(dot, _mm512_mul_ps(ks, _mm512_set1_ps(qscale[i]))));
    }
}

/* uint4: q8 int8 q, 4 * D bytes from one vector to the next;
 * s = (dot - kzero_t * qsum_i) * qscale_i * kscale_t */
static inline __attribute__((always_inline)) void scores_uint4(const uint8_t *kg, const int D,
                                                             const int8_t *q8, const int M,
                                                             float *s, int ld_s,
                                                             const float *kscale,
                                                             const float *kzero,
                                                             const float *qscale,
                                                             const float *qsum, const char *pf) {
    const __m512i nib = _mm512_set1_epi8(15);
    __m512i a[MAX_M][2];
    for (int i = 0; i < M; i++) a[i][0] = a[i][1] = _mm512_setzero_si512();
    for (int j = 0; j < D / 8; j++) {
        if (pf) prefetch_line(pf + 64 * j);
        __m512i x = _mm512_loadu_si512(kg + 64 * j);
        __m512i lo = _mm512_and_si512(x, nib), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), nib);
        for (int i = 0; i < M; i++) {
            a[i][0] = _mm512_dpbusd_epi32(a[i][0], lo, bcast32(q8 + i * 4 * D + 8 * j));
            a[i][1] = _mm512_dpbusd_epi32(a[i][1], hi, bcast32(q8 + i * 4 * D + 8 * j + 4));
        }
    }
    const __m512 ks = _mm512_loadu_ps(kscale), kz = _mm512_loadu_ps(kzero);
    for (int i = 0; i < M; i++) {
        __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(a[i][0], a[i][1]));
        dot = _mm512_fnmadd_ps(kz, _mm512_set1_ps(qsum[i]), dot);
        _mm512_storeu_ps(s + i * ld_s, _mm512_mul_ps(dot, _mm512_mul_ps(ks, _mm512_set1_ps(qscale[i]))));
    }
}

/* ---- acc[i] += sum_t w[i][t] v_t over tokens [t0, t1) of one slice; pf: the next slice,
 * prefetched row for row as this one is read */

static inline __attribute__((always_inline)) void pv_f32(const float *v, const int D, const float *p,
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

static inline __attribute__((always_inline)) void pv_bf16(const uint16_t *v, const int D,
                                                        const float *p, int ld_p, const int M,
                                                        int t0, int t1, float *acc,
                                                        const char *pf) {
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

/* int8, token pairs: wq [M][ld] int16 weights, t0 and t1 even; acc += wscale_i * the sums */
static inline __attribute__((always_inline)) void pv_int8(const int8_t *v, const int D,
                                                        const int16_t *wq, int ld, const int M,
                                                        int t0, int t1, const float *wscale,
                                                        float *acc, const char *pf) {
    for (int c = 0; c < D; c += 32) {
        __m512i a0[MAX_M], a1[MAX_M];
        for (int i = 0; i < M; i++) a0[i] = a1[i] = _mm512_setzero_si512();
        for (int t = t0; t < t1; t += 2) {
            if (pf && c == 0) prefetch_bytes(pf + (int64_t)t * D, 2 * D);
            const int8_t *x = v + ((int64_t)(t / 2) * D + c) * 2; /* 32 d of the pair */
            __m512i x0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)x));
            __m512i x1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(x + 32)));
            for (int i = 0; i < M; i++) {
                __m512i w = bcast32(wq + i * ld + t);
                a0[i] = _mm512_dpwssd_epi32(a0[i], x0, w);
                a1[i] = _mm512_dpwssd_epi32(a1[i], x1, w);
            }
        }
        for (int i = 0; i < M; i++) {
            __m512 ws = _mm512_set1_ps(wscale[i]);
            float *a = acc + i * D + c;
            _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[i]), ws, _mm512_load_ps(a)));
            _mm512_store_ps(a + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[i]), ws, _mm512_load_ps(a + 16)));
        }
    }
}

/* uint4, token quads: w8 [M][ld] uint8 weights, t0 and t1 multiples of 4; acc += wscale_i *
 * the sums */
static inline __attribute__((always_inline)) void pv_uint4(const uint8_t *v, const int D,
                                                         const uint8_t *w8, int ld, const int M,
                                                         int t0, int t1, const float *wscale,
                                                         float *acc, const char *pf) {
    const __m512i nib = _mm512_set1_epi8(15);
    for (int c = 0; c < D; c += 32) {
        __m512i a0[MAX_M], a1[MAX_M];
        for (int i = 0; i < M; i++) a0[i] = a1[i] = _mm512_setzero_si512();
        for (int t = t0; t < t1; t += 4) {
            if (pf && c == 0) prefetch_bytes(pf + (int64_t)t * (D / 2), 2 * D);
            __m512i x = _mm512_loadu_si512(v + ((int64_t)(t / 4) * (D / 16) + c / 16) * 32);
            __m512i lo = _mm512_and_si512(x, nib), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), nib);
            for (int i = 0; i < M; i++) { /* codes 0..15 pass as int8, the weights as uint8 */
                __m512i w = bcast32(w8 + i * ld + t);
                a0[i] = _mm512_dpbusd_epi32(a0[i], w, lo);
                a1[i] = _mm512_dpbusd_epi32(a1[i], w, hi);
            }
        }
        for (int i = 0; i < M; i++) {
            __m512 ws = _mm512_set1_ps(wscale[i]);
            float *a = acc + i * D + c;
            _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[i]), ws, _mm512_load_ps(a)));
            _mm512_store_ps(a + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[i]), ws, _mm512_load_ps(a + 16)));
        }
    }
}
