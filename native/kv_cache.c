/* Writing new K/V into the paged cache: one vector per (token, kv head), quantized per the format
 * and scattered into the slice layout (attention_layout.h). Small next to attention
 * (T * n_kv_heads * head_dim values per layer and step), so plain C. */
#include <math.h>
#include <string.h>

#include "attention_layout.h"
#include "common.h"

/* x ~= q * scale with q in -127..127; an all-zero vector gets scale 0. */
static void quantize_int8(const float *x, int n, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = amax / 127.0f;
    *scale = s;
    for (int i = 0; i < n; i++) {
        float r = s > 0.0f ? nearbyintf(x[i] / s) : 0.0f;
        q[i] = (int8_t)fminf(fmaxf(r, -127.0f), 127.0f);
    }
}

/* x ~= (q - zero) * scale with q in 0..15, two codes per byte, low nibble first. */
static void quantize_uint4(const float *x, int n, uint8_t *q, float *scale, float *zero) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    float s = (hi - lo) / 15.0f;
    /* A constant vector c has no range: scale |c| and zero -sign(c) decode code 0 to c exactly. */
    if (!(s > 0.0f)) s = lo != 0.0f ? fabsf(lo) : 1.0f;
    float z = -lo / s;
    *scale = s;
    *zero = z;
    for (int i = 0; i < n; i += 2) {
        float a = fminf(fmaxf(nearbyintf(x[i] / s + z), 0.0f), 15.0f);
        float b = fminf(fmaxf(nearbyintf(x[i + 1] / s + z), 0.0f), 15.0f);
        q[i / 2] = (uint8_t)((int)a | ((int)b << 4));
    }
}

/* One token's K (is_k) or V vector of one head into the slice at `slice`, token t of it. */
static void write_one(const dn_kv_cache_t *c, int is_k, const float *x, int64_t slice, int t) {
    const int D = c->head_dim;
    const dn_kv_format_t f = c->format;
    void *cache = is_k ? c->k : c->v;
    int64_t row = slice + t; /* index of the token's scale */
    float *scale = is_k ? c->k_scale : c->v_scale, *zero = is_k ? c->k_zero : c->v_zero;
    int8_t q8[512];  /* head_dim <= 512 */
    uint8_t q4[256]; /* two codes per byte, d = 2i low nibble */
    if (f == DN_KV_INT8) quantize_int8(x, D, q8, &scale[row]);
    if (f == DN_KV_UINT4) quantize_uint4(x, D, q4, &scale[row], &zero[row]);
    for (int d = 0; d < D; d++) {
        int64_t i = is_k ? kv_k_index(f, D, t, d) : kv_v_index(f, D, t, d);
        switch (f) {
        case DN_KV_F32:
            ((float *)cache)[slice * D + i] = x[d];
            break;
        case DN_KV_BF16:
            ((uint16_t *)cache)[slice * D + i] = dn_f32_to_bf16(x[d]);
            break;
        case DN_KV_INT8:
            ((int8_t *)cache)[slice * D + i] = q8[d];
            break;
        case DN_KV_UINT4: {
            uint8_t *b = (uint8_t *)cache + slice * (D / 2) + (i >> 1);
            int code = (q4[d / 2] >> (d & 1) * 4) & 15, shift = (int)(i & 1) * 4;
            *b = (uint8_t)((*b & ~(15 << shift)) | code << shift);
            break;
        }
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
