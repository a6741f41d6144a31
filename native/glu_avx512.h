/* AVX-512 act(g) * u for 16 lanes (glu.h): shared by the GLU kernel (elementwise.c) and the GEMM
 * that applies it as its store (linear_avx512.c), so both give the very same floats. */
#pragma once
#include <immintrin.h>

#include "common.h"
#include "glu.h"

/* exp(x) as 2^k * p(r), x = k ln2 + r, |r| <= ln2/2, with Cephes' degree-6 polynomial for p
 * (relative error ~1e-7 with FMA). x is clamped to where 2^k stays a normal float; the GLU then
 * zeroes the lanes whose exp(-z) was clamped at the top, where |act(g)| < 4e-37 anyway. */
#define EXP_HI 88.3762626647949f
#define EXP_LO -87.3365447504019f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f /* ln 2 split in two: k * LN2_HI is exact */
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

DN_TARGET_AVX512 static inline __m512 exp_avx512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, k); /* p * 2^k in one instruction */
}

/* act(g) * u = g / (1 + exp(-z)) * u, z as glu.h says */
DN_TARGET_AVX512 static inline __m512 glu_mul_avx512(__m512 g, __m512 u, dn_act act) {
    if (act == DN_ACT_CLAMPED_SWIGLU) { /* vminps/vmaxps return the second operand on NaN: g, u */
        const __m512 limit = _mm512_set1_ps(SWIGLU_LIMIT);
        g = _mm512_min_ps(limit, g);
        u = _mm512_add_ps(_mm512_max_ps(_mm512_set1_ps(-SWIGLU_LIMIT), _mm512_min_ps(limit, u)),
                          _mm512_set1_ps(1.0f));
    }
    __m512 z = act == DN_ACT_CLAMPED_SWIGLU ? _mm512_mul_ps(g, _mm512_set1_ps(SWIGLU_ALPHA)) : g;
    if (act == DN_ACT_GELU_TANH)
        z = _mm512_mul_ps(g, _mm512_fmadd_ps(_mm512_mul_ps(g, g), _mm512_set1_ps(GELU_Z3),
                                             _mm512_set1_ps(GELU_Z1)));
    __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), z);
    __mmask16 keep = _mm512_cmp_ps_mask(neg, _mm512_set1_ps(EXP_HI), _CMP_NGT_UQ); /* NaN kept */
    __m512 s = _mm512_maskz_div_ps(keep, g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_avx512(neg)));
    return _mm512_mul_ps(s, u);
}
