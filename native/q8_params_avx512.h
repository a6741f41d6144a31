/* Group parameters of i8q/u4q panels (linear.h) 16 columns at a time, for the AVX-512 files that
 * read them (linear_q8_vnni.c, linear_amx_panels.c); include after a `#pragma GCC target` with
 * avx512f and f16c. */
#pragma once
#include <immintrin.h>

#include "linear.h"

/* 16 fp16 scales -> fp32 (vcvtph2ps) */
static inline __attribute__((always_inline)) __m512 half16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Columns [c, c + 16) of u4q group block blk: dn_u4_params' scale and its product with the zero,
 * the same float products (the scalar loop ran a third of a one-row tile's instructions). */
static inline __attribute__((always_inline)) void u4_params16(const uint8_t *panel, const uint8_t *blk, int width,
                                                               int c, __m512 *s, __m512 *sz) {
    __m512 code = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + c))));
    __m512 zero = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + width + c))));
    *s = _mm512_mul_ps(_mm512_loadu_ps((const float *)panel + c), code);
    *sz = _mm512_mul_ps(_mm512_mul_ps(zero, _mm512_set1_ps(0.0625f)), *s);
}
