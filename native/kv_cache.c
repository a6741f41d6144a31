/* Writing new K/V into the paged cache: one vector per (token, kv head), quantized per the format
 * and scattered into the slice layout (kv_cache_layout.h). Small next to attention
 * (T * n_kv_heads * head_dim values per layer and step), so plain C. */
#include <math.h>
#include <string.h>

#include "common.h"
#include "kv_cache.h"

/* Round to nearest even for |v| <= 2^22, as nearbyintf does, without a libm call: the loops
 * below vectorize. Also max / min written out: fmaxf / fminf are calls on baseline x86-64.
 * NaN clamps to the lower bound, as fmaxf / fminf would. */
static inline float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }
static inline float clamp(float v, float lo, float hi) {
    v = v > lo ? v : lo;
    return v < hi ? v : hi;
}

/* x ~= q * scale with q in -127..127; an all-zero vector gets scale 0. */
static void quantize_int8(const float *x, int n, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float s = amax / 127.0f;
    *scale = s;
    if (!(s > 0.0f)) {
        memset(q, 0, (size_t)n);
        return;
    }
    for (int i = 0; i < n; i++) q[i] = (int8_t)clamp(round_even(x[i] / s), -127.0f, 127.0f);
}

/* x ~= (q - zero) * scale with q in 0..15, two codes per byte, low nibble first. */
static void quantize_uint4(const float *x, int n, uint8_t *q, float *scale, float *zero) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    float s = (hi - lo) / 15.0f;
    /* A constant vector c has no range: scale |c| and zero -sign(c) decode code 0 to c exactly. */
    if (!(s > 0.0f)) s = lo != 0.0f ? fabsf(lo) : 1.0f;
    float z = -lo / s;
    *scale = s;
    *zero = z;
    for (int i = 0; i < n; i += 2) {
        int a = (int)clamp(round_even(x[i] / s + z), 0.0f, 15.0f);
        int b = (int)clamp(round_even(x[i + 1] / s + z), 0.0f, 15.0f);
        q[i / 2] = (uint8_t)(a | b << 4);
    }
}

/* One token's K (is_k) or V vector of one head into the slice whose first token is cache row
 * `slice`, as token t of it: quantized, then spread over the slice layout (kv_cache_layout.h;
 * each byte holds values of one token only, so tokens can be written concurrently). */
static void write_one(const dn_kv_cache_t *c, int is_k, const float *x, int64_t slice, int t) {
    const int D = c->head_dim;
    const int64_t g = t >> 4, l = t & 15;
    switch (c->format) {
    case DN_KV_F32: {
        float *dst = (float *)(is_k ? c->k : c->v) + slice * D;
        if (!is_k) {
            memcpy(dst + (int64_t)t * D, x, (size_t)D * sizeof *x);
            break;
        }
        dst += g * 16 * D + l; /* [bs/16][D][16] */
        for (int d = 0; d < D; d++) dst[16 * d] = x[d];
        break;
    }
    case DN_KV_BF16: {
        uint16_t *dst = (uint16_t *)(is_k ? c->k : c->v) + slice * D;
        if (!is_k) {
            dst += (int64_t)t * D;
            for (int d = 0; d < D; d++) dst[d] = dn_f32_to_bf16(x[d]);
            break;
        }
        dst += g * 16 * D + 2 * l; /* [bs/16][D/2][16][2] */
        for (int d = 0; d < D; d += 2) {
            dst[16 * d] = dn_f32_to_bf16(x[d]);
            dst[16 * d + 1] = dn_f32_to_bf16(x[d + 1]);
        }
        break;
    }
    case DN_KV_INT8: {
        int8_t q[512]; /* head_dim <= 512 */
        quantize_int8(x, D, q, (is_k ? c->k_scale : c->v_scale) + slice + t);
        int8_t *dst = (int8_t *)(is_k ? c->k : c->v) + slice * D;
        if (is_k) { /* [bs/16][D/2][16][2] */
            dst += g * 16 * D + 2 * l;
            for (int d = 0; d < D; d += 2) {
                dst[16 * d] = q[d];
                dst[16 * d + 1] = q[d + 1];
            }
        } else { /* [bs/2][D][2] */
            dst += (int64_t)(t >> 1) * 2 * D + (t & 1);
            for (int d = 0; d < D; d++) dst[2 * d] = q[d];
        }
        break;
    }
    case DN_KV_UINT4: {
        uint8_t q[256]; /* codes of d = 2i (low nibble) and 2i + 1 */
        quantize_uint4(x, D, q, (is_k ? c->k_scale : c->v_scale) + slice + t,
                       (is_k ? c->k_zero : c->v_zero) + slice + t);
#define CODE(d) ((q[(d) / 2] >> ((d) & 1) * 4) & 15)
        uint8_t *dst = (uint8_t *)(is_k ? c->k : c->v) + slice * (D / 2);
        if (is_k) { /* bytes [bs/16][D/8][16][4]: d = 8j + b low nibble, 8j + 4 + b high */
            dst += g * 8 * D + 4 * l;
            for (int j = 0; j < D / 8; j++)
                for (int b = 0; b < 4; b++) dst[64 * j + b] = (uint8_t)(CODE(8 * j + b) | CODE(8 * j + 4 + b) << 4);
        } else { /* bytes [bs/4][D/16][8][4]: d = 16c + k low nibble, 16c + 8 + k high */
            dst += (int64_t)(t >> 2) * 2 * D + (t & 3);
            for (int ch = 0; ch < D / 16; ch++)
                for (int k = 0; k < 8; k++)
                    dst[32 * ch + 4 * k] = (uint8_t)(CODE(16 * ch + k) | CODE(16 * ch + 8 + k) << 4);
        }
#undef CODE
        break;
    }
    }
}

void dn_kv_write(const dn_kv_cache_t *c, const float *k, const float *v, const int32_t *slots,
                 int T) {
    int H = c->n_kv_heads, D = c->head_dim, bs = c->block_size;
    int64_t n = (int64_t)T * H;
#pragma omp parallel for schedule(static) num_threads(dn_num_threads()) if (n * D >= 32768)
    for (int64_t i = 0; i < n; i++) {
        int t = (int)(i / H), h = (int)(i % H);
        if (slots[t] < 0) continue;
        /* first row of the (block, head) slice; the per-token scale arrays share this index */
        int64_t slice = ((int64_t)(slots[t] / bs) * H + h) * bs;
        write_one(c, 1, k + i * D, slice, slots[t] % bs);
        write_one(c, 0, v + i * D, slice, slots[t] % bs);
    }
}
