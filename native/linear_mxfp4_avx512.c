/* mxfp4 linear, AVX-512: the kernel of linear_mxfp4_kernel.h over 16 lanes; vpermps looks up all
 * 16 e2m1 values, sign included, by each lane's low nibble. Runs where dn_isa() is avx512. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include <immintrin.h>

#include "linear_kernels.h"

#define LANES 16
#define NV_FOR(mr) ((mr) <= 2 ? 4 : 2) /* 32 zmm: up to 16 accumulators + codes, scales, weights */
typedef __m512 vf;
typedef __m512i vi;
#define vf_zero _mm512_setzero_ps
#define vf_bcast(p) _mm512_set1_ps(*(p))
#define vf_fma _mm512_fmadd_ps
#define vf_load _mm512_loadu_ps
#define vf_save _mm512_storeu_ps
#define vf_mul _mm512_mul_ps

static inline vi vi_load(const uint32_t *p) { return _mm512_loadu_si512(p); }
static inline vi vi_next(vi v) { return _mm512_srli_epi32(v, 4); }
static inline vf vf_e2m1(vi v) { return _mm512_permutexvar_ps(v, _mm512_loadu_ps(dn_e2m1_twice)); }

/* dn_e8m0_half of 16 bytes */
static inline vf vf_scales(const uint8_t *p) {
    __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    __mmask16 is_tiny = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(normal, is_tiny, tiny));
}

#include "linear_mxfp4_kernel.h"

const dn_linear_kernels dn_linear_mxfp4_avx512 = {scratch_bytes, run_tiles, NULL, units};

#pragma GCC pop_options
