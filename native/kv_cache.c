/* Writing new K/V into the paged cache: one vector per (token, kv head), quantized per the format.
 * Small next to attention (T * n_kv_heads * head_dim values per layer and step), so plain C. */
#include <math.h>
#include <string.h>

#include "attention.h"
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

static void write_one(const dn_kv_cache_t *c, const float *x, void *cache, float *scale,
                      float *zero, int64_t row) {
    int D = c->head_dim;
    switch (c->format) {
    case DN_KV_F32:
        memcpy((float *)cache + row * D, x, (size_t)D * sizeof *x);
        break;
    case DN_KV_BF16: {
        uint16_t *dst = (uint16_t *)cache + row * D;
        for (int d = 0; d < D; d++) dst[d] = dn_f32_to_bf16(x[d]);
        break;
    }
    case DN_KV_INT8:
        quantize_int8(x, D, (int8_t *)cache + row * D, &scale[row]);
        break;
    case DN_KV_UINT4:
        quantize_uint4(x, D, (uint8_t *)cache + row * (D / 2), &scale[row], &zero[row]);
        break;
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
        /* cache row of (block, head, offset): the per-token scale arrays share this index */
        int64_t row = ((int64_t)(slots[t] / bs) * H + h) * bs + slots[t] % bs;
        write_one(c, k + i * D, c->k, c->k_scale, c->k_zero, row);
        write_one(c, v + i * D, c->v, c->v_scale, c->v_zero, row);
    }
}
