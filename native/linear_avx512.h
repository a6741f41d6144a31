/* Shared by the AVX-512 linear files, which include it after their `#pragma GCC target`:
 * register helpers over the packed layout (linear.h) and the GEMV half of the path. */
#pragma once
#include <immintrin.h>

#include "linear_kernels.h"

#define NR DN_LINEAR_NR
#ifndef GEMV_MAX_M
#define GEMV_MAX_M 4 /* rows the fp32 GEMV handles; above, the bf16 microkernel is faster */
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

#define NV_CASES(F, ...) \
    case 1: F(__VA_ARGS__, 1); break; \
    case 2: F(__VA_ARGS__, 2); break; \
    case 3: F(__VA_ARGS__, 3); break; \
    default: F(__VA_ARGS__, 4); break;

/* linear_avx512_gemv.c: M <= GEMV_MAX_M, fp32 activations. */
size_t dn_avx512_gemv_scratch(const dn_linear_w *w, int64_t m);
void dn_avx512_gemv(const dn_linear_call *c, int t, int nt);
