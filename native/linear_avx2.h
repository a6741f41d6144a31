/* Shared by the AVX2 linear files, which include it after their `#pragma GCC target`:
 * register helpers and the GEMV half of the path. */
#pragma once
#include <immintrin.h>

#include "linear_kernels.h"

#define NR DN_LINEAR_NR
#define GEMV_MAX_M 4 /* rows mxfp4's GEMV handles; above, the GEMM's weight reuse wins */
#define GEMV_ROWS 8  /* rows bf16/i8/u4's GEMV handles, 4 at a time over each block from L1: up to
                      * here that beat the GEMM's widened fp32 strips (75 GFLOP/s at 8 rows, 2 cores) */
#define INLINE static inline __attribute__((always_inline))

/* Lanes [0, valid) of 8 set, for maskload / maskstore. */
INLINE __m256i lane_mask(int valid) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Columns [c, c + 8) of dn_u4_params (linear.h), the same products, in registers. */
INLINE void u4_params8(const uint8_t *panel, const uint8_t *blk, int width, int c, __m256 *scale, __m256 *zero) {
    __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + c))));
    __m256 zc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + width + c))));
    *scale = _mm256_mul_ps(_mm256_loadu_ps((const float *)panel + c), sc);
    *zero = _mm256_mul_ps(zc, _mm256_set1_ps(0.0625f));
}

/* dn_u4_params, 8 columns a step: gcc leaves the scalar loop's zeros unvectorized (the outputs
 * may alias the codes), which cost a u4 GEMV a quarter of its time. */
INLINE void u4_params(const uint8_t *panel, const uint8_t *blk, int width, float *scale, float *zero) {
    for (int c = 0; c < width; c += 8) {
        __m256 s, z;
        u4_params8(panel, blk, width, c, &s, &z);
        _mm256_storeu_ps(scale + c, s);
        _mm256_storeu_ps(zero + c, z);
    }
}

/* y[r][col0 + j] = tot[r][j] + bias[j] for the valid columns of a panel `width` wide, mr rows:
 * the GEMVs' store (y [mr][n] at the panel's first column, bias NULL or at it). */
INLINE void gemv_store(const float *tot, int mr, int width, int valid, const float *bias, float *y, int64_t n) {
    for (int j = 0; j < width; j += 8) {
        __m256i m = lane_mask(valid - j);
        __m256 b = bias ? _mm256_maskload_ps(bias + j, m) : _mm256_setzero_ps();
        for (int r = 0; r < mr; r++) {
            __m256 out = _mm256_add_ps(_mm256_loadu_ps(tot + r * NR + j), b);
            if (valid - j >= 8) _mm256_storeu_ps(y + r * n + j, out); /* vmaskmovps stores are slow on AMD */
            else _mm256_maskstore_ps(y + r * n + j, m, out);
        }
    }
}

/* linear_avx2_gemv.c: M <= GEMV_ROWS, bf16/i8/u4 weights converted in registers. */
size_t dn_avx2_gemv_scratch(const dn_linear_w *w, int64_t m, int nthreads);
void dn_avx2_gemv(const dn_linear_call *c, int t, int nt);
