/* i8q and u4q weights for AMX's bf16 tiles: a k range of a panel dequantized into bf16 pairs, the
 * layout of a packed bf16 panel (linear.h), so linear_amx.c runs quantized weights on the same
 * tile blocks. A pass of up to 256 rows reuses each dequantized chunk for all its rows; the
 * tiles then multiply bf16 x bf16 in fp32 (the weights' float values rounded once to bf16,
 * activations as for bf16 weights), where the VNNI path would round the activations to int8. */
#include <math.h>

#include "linear_kernels.h"

/* Column c's weight at k of an i8q/u4q panel, as the kernels' fix-up computes it. */
static float weight_at(const dn_linear_w *w, const uint8_t *panel, int width, int64_t k, int c) {
    const int64_t g = k / w->group, kk = k % w->group;
    const uint8_t *blk = dn_linear_group_at(w->wtype, w->group, panel, width, g);
    const uint8_t *codes = blk + dn_linear_group_head(w->wtype, width);
    if (w->wtype == DN_W_I8Q) {
        const uint16_t *h = (const uint16_t *)blk;
        float q = codes[(kk / 4) * width * 4 + c * 4 + kk % 4];
        return fmaf(q, dn_f16_to_f32(h[c]) * w->unscale, -dn_f16_to_f32(h[width + c]) * w->unscale);
    }
    const uint8_t byte = codes[(kk / 8) * width * 4 + c * 4 + kk % 4];
    const float s = dn_u4_scale(panel, blk, c), sz = dn_u4_zero(blk, width, c) * s;
    return fmaf((float)(kk % 8 < 4 ? byte & 15 : byte >> 4), s, -sz);
}

static void pairs_portable(const dn_linear_w *w, const uint8_t *panel, int width, int64_t p0, int64_t p1,
                           uint32_t *out) {
    for (int64_t p = p0; p < p1; p++)
        for (int c = 0; c < width; c++)
            out[(p - p0) * width + c] = (uint32_t)dn_f32_to_bf16(weight_at(w, panel, width, 2 * p + 1, c)) << 16 |
                                        dn_f32_to_bf16(weight_at(w, panel, width, 2 * p, c));
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include <immintrin.h>

#include "q8_params_avx512.h"

/* Codes of 4 consecutive k for 16 columns (a byte each, column-major in 32-bit lanes) as the two
 * pair rows row[0 .. 16) and row[width .. width + 16): w = q * s - sz, rounded to bf16. */
static inline __attribute__((always_inline)) void quad_pairs(__m512i quad, __m512 s, __m512 sz, uint32_t *row,
                                                              int width, __m512i interleave) {
    const __m512i byte = _mm512_set1_epi32(0xff);
    __m512 w[4];
    for (int i = 0; i < 4; i++)
        w[i] = _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(quad, 8 * i), byte)), s, sz);
    /* cvtne2ps_pbh puts the 16 even k below the 16 odd k; vpermw interleaves them into pairs */
    _mm512_storeu_si512(row, _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(w[1], w[0])));
    _mm512_storeu_si512(row + width,
                        _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(w[3], w[2])));
}

static void pairs_avx512(const dn_linear_w *w, const uint8_t *panel, int width, int64_t p0, int64_t p1,
                         uint32_t *out) {
    const int u4 = w->wtype == DN_W_U4Q, nv = width / 16, kstep = u4 ? 8 : 4;
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i nibble = _mm512_set1_epi8(15);
    const __m512 unscale = _mm512_set1_ps(w->unscale);
    __m512 s[4], sz[4];
    for (int64_t k = 2 * p0, g = -1; k < 2 * p1; k += kstep) {
        const uint8_t *blk = dn_linear_group_at(w->wtype, w->group, panel, width, k / w->group);
        if (k / w->group != g) {
            g = k / w->group;
            for (int v = 0; v < nv; v++) {
                if (u4) {
                    u4_params16(panel, blk, width, 16 * v, &s[v], &sz[v]);
                } else {
                    s[v] = _mm512_mul_ps(half16((const uint16_t *)blk + 16 * v), unscale);
                    sz[v] = _mm512_mul_ps(half16((const uint16_t *)blk + width + 16 * v), unscale);
                }
            }
        }
        const uint8_t *codes = blk + dn_linear_group_head(w->wtype, width) + (k % w->group) / kstep * width * 4;
        uint32_t *row = out + (k / 2 - p0) * width;
        for (int v = 0; v < nv; v++) {
            __m512i raw = _mm512_loadu_si512(codes + 64 * v);
            if (u4) { /* low nibbles: k .. k + 3, high: k + 4 .. k + 7 */
                quad_pairs(_mm512_and_si512(raw, nibble), s[v], sz[v], row + 16 * v, width, interleave);
                quad_pairs(_mm512_and_si512(_mm512_srli_epi32(raw, 4), nibble), s[v], sz[v], row + 2 * width + 16 * v,
                           width, interleave);
            } else {
                quad_pairs(raw, s[v], sz[v], row + 16 * v, width, interleave);
            }
        }
    }
}
#pragma GCC pop_options

void dn_amx_panel_pairs(const dn_linear_w *w, const uint8_t *panel, int width, int64_t p0, int64_t p1,
                        uint32_t *out, int avx512) {
    (avx512 ? pairs_avx512 : pairs_portable)(w, panel, width, p0, p1, out);
}
