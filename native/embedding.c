/* The embedding lookup (elementwise.h): rows of an fp32 or bf16 table copied out as fp32. */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "elementwise.h"

#define EMBED_SERIAL_FLOATS 65536 /* below it one thread copies the rows */

long dn_embedding_first_bad(const int32_t *ids, long T, long V) {
    for (long t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= V) return t;
    return -1;
}

void dn_embedding_f32(const int32_t *ids, const float *table, float *out, int T, int D) {
    int nt = dn_team_for((int64_t)T * D, EMBED_SERIAL_FLOATS);
    if (nt == 1 || T == 1) {
        for (int t = 0; t < T; t++)
            memcpy(out + (size_t)t * D, table + (size_t)ids[t] * D, (size_t)D * sizeof(float));
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < T; t++)
        memcpy(out + (size_t)t * D, table + (size_t)ids[t] * D, (size_t)D * sizeof(float));
}

typedef void (*bf16_row_fn)(const uint16_t *src, float *dst, int n);

static void bf16_row_portable(const uint16_t *src, float *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = dn_bf16_to_f32(src[i]);
}

DN_TARGET_AVX2 static void bf16_row_avx2(const uint16_t *src, float *dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) dst[i] = dn_bf16_to_f32(src[i]);
}

DN_TARGET_AVX512 static void bf16_row_avx512(const uint16_t *src, float *dst, int n) {
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
}

void dn_embedding_bf16(const int32_t *ids, const uint16_t *table, float *out, int T, int D) {
    dn_isa_t isa = dn_isa();
    bf16_row_fn row = isa == DN_ISA_AVX512 ? bf16_row_avx512
                      : isa == DN_ISA_AVX2 ? bf16_row_avx2
                                           : bf16_row_portable;
    int nt = dn_team_for((int64_t)T * D, EMBED_SERIAL_FLOATS);
    if (nt == 1 || T == 1) {
        for (int t = 0; t < T; t++) row(table + (size_t)ids[t] * D, out + (size_t)t * D, D);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < T; t++) row(table + (size_t)ids[t] * D, out + (size_t)t * D, D);
}
