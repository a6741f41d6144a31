/* AVX-512 e^x (16 lanes), the soft-cap's tanh on it, and software prefetch into L2: helpers of
 * the AVX-512 attention tiles (attention_decode_avx512.c, attention_prefill*_avx512.c). Include
 * inside a `#pragma GCC target` region that enables AVX-512 F/BW/VL/DQ. */
#pragma once
#include <immintrin.h>
#include <stdint.h>

/* e^x for x <= 88, with e^x = 0 below -87 (-inf gives 0: masked scores), e^r on the reduced
 * argument as its Taylor polynomial of `degree` (<= 7; 7: relative error ~1e-7). */
static inline __attribute__((always_inline)) __m512 exp512_degree(__m512 x, const int degree) {
    static const float inv_factorial[8] = {1.0f, 1.0f, 0.5f, 1.0f / 6, 1.0f / 24, 1.0f / 120,
                                           1.0f / 720, 1.0f / 5040};
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(inv_factorial[degree]);
#pragma GCC unroll 8
    for (int i = degree - 1; i >= 0; i--) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(inv_factorial[i]));
    return _mm512_maskz_scalef_ps((__mmask16)~tiny, p, n);
}

static inline __m512 exp512(__m512 x) { return exp512_degree(x, 7); }

/* Attention's logit soft-cap, softcap * tanh(x / softcap) for softcap > 0, on exp512:
 * tanh(y) = (1 - e^-2|y|) / (1 + e^-2|y|) with the sign of y (no overflow at any |y|). */
static inline __m512 softcap512(__m512 x, float softcap) {
    const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(1.0f / softcap));
    const __m512 e = exp512(_mm512_mul_ps(_mm512_abs_ps(y), _mm512_set1_ps(-2.0f)));
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 c = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    c = _mm512_mul_ps(c, _mm512_set1_ps(softcap));
    return _mm512_mask_sub_ps(c, _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LT_OQ),
                              _mm512_setzero_ps(), c);
}

/* n scores at s (a multiple of 16, 64-byte aligned) through the soft-cap, when there is one */
static inline void softcap_scores(float *s, int n, float softcap) {
    if (softcap > 0.0f)
        for (int j = 0; j < n; j += 16) _mm512_store_ps(s + j, softcap512(_mm512_load_ps(s + j), softcap));
}

/* Software prefetch of `bytes` from p into L2. L2, not L1: a slice ahead does not fit next to
 * the working set in L1, and the L2 has more miss buffers (measured on random 4-16 KiB reads:
 * prefetcht1 a chunk ahead doubles the throughput, prefetcht0 gains nothing). asm, because
 * gcc 12 drops _mm_prefetch in these loops as if it had no effect. */
static inline void prefetch_bytes(const char *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __asm__ volatile("prefetcht1 %0" : : "m"(p[o]));
}
