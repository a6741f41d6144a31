/* 8-float vectors in plain C (gcc vector extensions): AVX2 registers where the including file is
 * built for AVX2, SSE pairs in a baseline build. Shared by the attention tile and the sampler. */
#pragma once
/* Every function here is inlined: no vector crosses a call, whatever gcc says of the ABI. */
#pragma GCC diagnostic ignored "-Wpsabi"
#include <stdint.h>
#include <string.h>

/* Loads and stores go through memcpy, so any alignment is fine. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void store8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

static inline __attribute__((always_inline)) v8f select8(v8i mask, v8f yes, v8f no) {
    return (v8f)(((v8i)yes & mask) | ((v8i)no & ~mask));
}

static inline __attribute__((always_inline)) v8f max8(v8f a, v8f b) { return select8(a > b, a, b); }

/* e^x, 0 below -87 (masked scores are -inf) */
static inline __attribute__((always_inline)) v8f exp8(v8f x) {
    const v8f lo = (v8f){0} - 87.0f;
    v8i tiny = x < lo;
    x = select8(tiny, lo, x);
    v8f t = x * 1.44269504f;
    v8i n = __builtin_convertvector(t + 128.5f, v8i) - 128; /* round: t + 128.5 > 0 */
    v8f nf = __builtin_convertvector(n, v8f);
    v8f r = x - nf * 0.693145752f - nf * 1.42860677e-6f;
    v8f p = (v8f){0} + 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    v8f pow2n = (v8f)((n + 127) << 23);
    return (v8f)((v8i)(p * pow2n) & ~tiny);
}
