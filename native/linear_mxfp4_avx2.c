/* mxfp4 linear, AVX2 + FMA: the kernel of linear_mxfp4_kernel.h over 8 lanes. vpermps looks up 8
 * entries, so the e2m1 table holds the magnitudes and the sign (bit 3) comes from an xor. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "linear_kernels.h"

#define LANES 8
#define NV_FOR(mr) ((mr) <= 4 ? 2 : 1) /* 16 ymm: up to 8 accumulators + codes, scales, weights */
typedef __m256 vf;
typedef __m256i vi;
#define vf_zero _mm256_setzero_ps
#define vf_bcast _mm256_broadcast_ss
#define vf_fma _mm256_fmadd_ps
#define vf_load _mm256_loadu_ps
#define vf_save _mm256_storeu_ps
#define vf_mul _mm256_mul_ps

static inline vi vi_load(const uint32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vi vi_next(vi v) { return _mm256_srli_epi32(v, 4); }

/* 2 e2m1 of each lane's low nibble (linear_kernels.h): v << 28 puts the nibble in bits 28-31,
 * sign on top; xored onto table[nibble & 7], which holds magnitude ^ (index << 28), it leaves
 * magnitude ^ sign. */
#define E2M1_ENTRY(bits, i) (int)((bits) ^ ((uint32_t)(i) << 28))
static inline vf vf_e2m1(vi v) {
    const __m256i table = _mm256_setr_epi32(
        E2M1_ENTRY(0x00000000u, 0), E2M1_ENTRY(0x3f800000u, 1), E2M1_ENTRY(0x40000000u, 2),
        E2M1_ENTRY(0x40400000u, 3), E2M1_ENTRY(0x40800000u, 4), E2M1_ENTRY(0x40c00000u, 5),
        E2M1_ENTRY(0x41000000u, 6), E2M1_ENTRY(0x41400000u, 7)); /* 0 1 2 3 4 6 8 12 */
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_permutevar8x32_epi32(table, v), _mm256_slli_epi32(v, 28)));
}

/* dn_e8m0_half of 8 bytes */
static inline vf vf_scales(const uint8_t *p) {
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    __m256i is_tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, is_tiny));
}

#define KERNELS dn_linear_mxfp4_avx2
#include "linear_mxfp4_kernel.h"

#pragma GCC pop_options
