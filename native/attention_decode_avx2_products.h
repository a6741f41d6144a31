/* The products of one (block, head) slice of the AVX2 decode tile, per KV cache format: scores of
 * 8 tokens of K against M query vectors, and the weighted sum of V (the method is in
 * attention_decode_avx2.c's opening comment). Included once, by that file, after its target pragma,
 * MAX_M and the helpers these use. */
#pragma once

/* ---- scores of 8 tokens (half h of a K group): s[i * ld_s + 0..8) = q_i . k_t; pf: the same
 * group of the next slice, prefetched as this half is read (first halves only) */

static inline __attribute__((always_inline)) void scores_f32(const float *kg, const int D,
                                                           const float *qf, const int M, float *s,
                                                           int ld_s, const char *pf) {
    const int U = M <= 4 ? 2 : 1; /* independent sums per vector: the FMA latency */
    __m256 a[MAX_M][2];
    for (int i = 0; i < M; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
    for (int d0 = 0; d0 < D; d0 += U)
        for (int u = 0; u < U; u++) {
            const int d = d0 + u;
            if (pf) prefetch_bytes(pf + 64 * d, 64);
            __m256 x = _mm256_loadu_ps(kg + 16 * d);
            for (int i = 0; i < M; i++)
                a[i][u] = _mm256_fmadd_ps(x, _mm256_broadcast_ss(qf + i * D + d), a[i][u]);
        }
    for (int i = 0; i < M; i++)
        _mm256_storeu_ps(s + i * ld_s, U == 2 ? _mm256_add_ps(a[i][0], a[i][1]) : a[i][0]);
}

static inline __attribute__((always_inline)) void scores_bf16(const uint16_t *kg, const int D,
                                                            const float *qf, const int M,
                                                            float *s, int ld_s, const char *pf) {
    const __m256i hi_mask = _mm256_set1_epi32((int)0xffff0000u);
    __m256 a[MAX_M];
    for (int i = 0; i < M; i++) a[i] = _mm256_setzero_ps();
    for (int j = 0; j < D / 2; j++) {
        if (pf) prefetch_bytes(pf + 64 * j, 64);
        __m256i x = _mm256_loadu_si256((const __m256i *)(kg + 32 * j));
        __m256 ev = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
        __m256 od = _mm256_castsi256_ps(_mm256_and_si256(x, hi_mask));
        for (int i = 0; i < M; i++) {
            a[i] = _mm256_fmadd_ps(ev, _mm256_broadcast_ss(qf + i * D + 2 * j), a[i]);
            a[i] = _mm256_fmadd_ps(od, _mm256_broadcast_ss(qf + i * D + 2 * j + 1), a[i]);
        }
    }
    for (int i = 0; i < M; i++) _mm256_storeu_ps(s + i * ld_s, a[i]);
}

/* int8: qi int16, 2 * D elements from one vector to the next */
static inline __attribute__((always_inline)) void scores_int8(const int8_t *kg, const int D,
                                                            const int16_t *qi, const int M,
                                                            float *s, int ld_s, const float *kscale,
                                                            const float *qscale, const char *pf) {
    __m256i a[MAX_M];
    for (int i = 0; i < M; i++) a[i] = _mm256_setzero_si256();
    for (int j = 0; j < D / 2; j++) {
        if (pf && j % 2 == 0) prefetch_bytes(pf + 32 * j, 64);
        __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(kg + 32 * j)));
        for (int i = 0; i < M; i++)
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(x, bcast32(qi + i * 2 * D + 2 * j)));
    }
    const __m256 ks = _mm256_loadu_ps(kscale);
    for (int i = 0; i < M; i++)
        _mm256_storeu_ps(s + i * ld_s, _mm256_mul_ps(_mm256_cvtepi32_ps(a[i]),
                                                     _mm256_mul_ps(ks, _mm256_set1_ps(qscale[i]))));
}

/* uint4: q8 int8, 4 * D bytes from one vector to the next */
static inline __attribute__((always_inline)) void scores_uint4(const uint8_t *kg, const int D,
                                                             const int8_t *q8, const int M,
                                                             float *s, int ld_s,
                                                             const float *kscale,
                                                             const float *kzero,
                                                             const float *qscale,
                                                             const float *qsum, const char *pf) {
    const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256i a[MAX_M];
    for (int i = 0; i < M; i++) a[i] = _mm256_setzero_si256();
    for (int j = 0; j < D / 8; j++) {
        if (pf) prefetch_bytes(pf + 64 * j, 64);
        __m256i x = _mm256_loadu_si256((const __m256i *)(kg + 64 * j));
        __m256i lo = _mm256_and_si256(x, nib), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
        for (int i = 0; i < M; i++) {
            __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast32(q8 + i * 4 * D + 8 * j)),
                                         _mm256_maddubs_epi16(hi, bcast32(q8 + i * 4 * D + 8 * j + 4)));
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(p, ones));
        }
    }
    const __m256 ks = _mm256_loadu_ps(kscale), kz = _mm256_loadu_ps(kzero);
    for (int i = 0; i < M; i++) {
        __m256 dot = _mm256_fnmadd_ps(kz, _mm256_set1_ps(qsum[i]), _mm256_cvtepi32_ps(a[i]));
        _mm256_storeu_ps(s + i * ld_s, _mm256_mul_ps(dot, _mm256_mul_ps(ks, _mm256_set1_ps(qscale[i]))));
    }
}

/* ---- acc[i] += sum_t w[i][t] v_t over tokens [t0, t1), vectors i0..i0 + MM (MM <= 4) */

static inline __attribute__((always_inline)) void pv_f32(const float *v, const int D, const float *p,
                                                       int ld_p, const int i0, const int MM,
                                                       int t0, int t1, float *acc, const char *pf) {
    for (int c = 0; c < D; c += 16) {
        __m256 a0[4], a1[4];
        for (int i = 0; i < MM; i++) {
            a0[i] = _mm256_loadu_ps(acc + (i0 + i) * D + c);
            a1[i] = _mm256_loadu_ps(acc + (i0 + i) * D + c + 8);
        }
        for (int t = t0; t < t1; t++) {
            if (pf && c == 0 && i0 == 0) prefetch_bytes(pf + (int64_t)t * 4 * D, 4 * D);
            __m256 x0 = _mm256_loadu_ps(v + (int64_t)t * D + c), x1 = _mm256_loadu_ps(v + (int64_t)t * D + c + 8);
            for (int i = 0; i < MM; i++) {
                __m256 w = _mm256_broadcast_ss(p + (i0 + i) * ld_p + t);
                a0[i] = _mm256_fmadd_ps(w, x0, a0[i]);
                a1[i] = _mm256_fmadd_ps(w, x1, a1[i]);
            }
        }
        for (int i = 0; i < MM; i++) {
            _mm256_storeu_ps(acc + (i0 + i) * D + c, a0[i]);
            _mm256_storeu_ps(acc + (i0 + i) * D + c + 8, a1[i]);
        }
    }
}

static inline __attribute__((always_inline)) void pv_bf16(const uint16_t *v, const int D,
                                                        const float *p, int ld_p, const int i0,
                                                        const int MM, int t0, int t1, float *acc,
                                                        const char *pf) {
    const __m256i hi_mask = _mm256_set1_epi32((int)0xffff0000u);
    for (int c = 0; c < D; c += 16) {
        __m256 a0[4], a1[4];
        for (int i = 0; i < MM; i++) {
            a0[i] = _mm256_loadu_ps(acc + (i0 + i) * D + c);
            a1[i] = _mm256_loadu_ps(acc + (i0 + i) * D + c + 8);
        }
        for (int t = t0; t < t1; t++) {
            if (pf && c == 0 && i0 == 0) prefetch_bytes(pf + (int64_t)t * 2 * D, 2 * D);
            __m256i x = _mm256_loadu_si256((const __m256i *)(v + (int64_t)t * D + c));
            __m256 ev = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
            __m256 od = _mm256_castsi256_ps(_mm256_and_si256(x, hi_mask));
            for (int i = 0; i < MM; i++) {
                __m256 w = _mm256_broadcast_ss(p + (i0 + i) * ld_p + t);
                a0[i] = _mm256_fmadd_ps(w, ev, a0[i]);
                a1[i] = _mm256_fmadd_ps(w, od, a1[i]);
            }
        }
        for (int i = 0; i < MM; i++) {
            _mm256_storeu_ps(acc + (i0 + i) * D + c, a0[i]);
            _mm256_storeu_ps(acc + (i0 + i) * D + c + 8, a1[i]);
        }
    }
}

/* int8 token pairs: wq int16 weights, t0 and t1 even */
static inline __attribute__((always_inline)) void pv_int8(const int8_t *v, const int D,
                                                        const int16_t *wq, int ld, const int i0,
                                                        const int MM, int t0, int t1,
                                                        const float *wscale, float *acc,
                                                        const char *pf) {
    for (int c = 0; c < D; c += 16) {
        __m256i a0[4], a1[4];
        for (int i = 0; i < MM; i++) a0[i] = a1[i] = _mm256_setzero_si256();
        for (int t = t0; t < t1; t += 2) {
            if (pf && c == 0 && i0 == 0) prefetch_bytes(pf + (int64_t)t * D, 2 * D);
            const int8_t *x = v + ((int64_t)(t / 2) * D + c) * 2; /* 16 d of the pair */
            __m256i x0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x));
            __m256i x1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + 16)));
            for (int i = 0; i < MM; i++) {
                __m256i w = bcast32(wq + (i0 + i) * ld + t);
                a0[i] = _mm256_add_epi32(a0[i], _mm256_madd_epi16(x0, w));
                a1[i] = _mm256_add_epi32(a1[i], _mm256_madd_epi16(x1, w));
            }
        }
        for (int i = 0; i < MM; i++) {
            __m256 ws = _mm256_set1_ps(wscale[i0 + i]);
            float *a = acc + (i0 + i) * D + c;
            _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0[i]), ws, _mm256_loadu_ps(a)));
            _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1[i]), ws, _mm256_loadu_ps(a + 8)));
        }
    }
}

/* uint4 token quads: w8 uint8 weights, t0 and t1 multiples of 4 */
static inline __attribute__((always_inline)) void pv_uint4(const uint8_t *v, const int D,
                                                         const uint8_t *w8, int ld, const int i0,
                                                         const int MM, int t0, int t1,
                                                         const float *wscale, float *acc,
                                                         const char *pf) {
    const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    for (int c = 0; c < D; c += 16) {
        __m256i a0[4], a1[4];
        for (int i = 0; i < MM; i++) a0[i] = a1[i] = _mm256_setzero_si256();
        for (int t = t0; t < t1; t += 4) {
            if (pf && c == 0 && i0 == 0) prefetch_bytes(pf + (int64_t)t * (D / 2), 2 * D);
            __m256i x = _mm256_loadu_si256((const __m256i *)(v + ((int64_t)(t / 4) * (D / 16) + c / 16) * 32));
            __m256i lo = _mm256_and_si256(x, nib), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
            for (int i = 0; i < MM; i++) { /* the weights as uint8, codes 0..15 as int8 */
                __m256i w = bcast32(w8 + (i0 + i) * ld + t);
                a0[i] = _mm256_add_epi32(a0[i], _mm256_madd_epi16(_mm256_maddubs_epi16(w, lo), ones));
                a1[i] = _mm256_add_epi32(a1[i], _mm256_madd_epi16(_mm256_maddubs_epi16(w, hi), ones));
            }
        }
        for (int i = 0; i < MM; i++) {
            __m256 ws = _mm256_set1_ps(wscale[i0 + i]);
            float *a = acc + (i0 + i) * D + c;
            _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0[i]), ws, _mm256_loadu_ps(a)));
            _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1[i]), ws, _mm256_loadu_ps(a + 8)));
        }
    }
}
