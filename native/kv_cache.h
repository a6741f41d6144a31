/* The paged KV cache: its storage formats, one layer's cache, and the kernel that writes new K/V
 * into it (kv_cache.c).
 *
 * One layer's cache is a pair of arrays [num_blocks, n_kv_heads, block_size, head_dim] (uint4:
 * head_dim / 2 bytes); a token's slot is block_id * block_size + offset_in_block. Inside a
 * (block, kv head) slice the values are ordered for the decode kernels, not token by token:
 * see kv_cache_layout.h (K: 16 tokens side by side per d; V: rows, or token pairs / quads).
 * block_size is a multiple of 16 and head_dim of 16. Four storage formats:
 *   fp32 : float, for fp32 models (their logits must match an fp32 reference).
 *   bf16 : uint16 bits.
 *   int8 : codes q, x ~= q * scale, scale = max|x| / 127 per token per head.
 *   uint4: codes q in 0..15, x ~= (q - zero) * scale, scale = (max - min) / 15,
 *          zero = -min / scale per token per head.
 * Scales and zeros are [num_blocks, n_kv_heads, block_size], per token.
 * Callers validate every argument (py_kv_cache.c does); these functions trust them. */
#pragma once
#include <stdint.h>

typedef enum { DN_KV_BF16 = 0, DN_KV_INT8 = 1, DN_KV_UINT4 = 2, DN_KV_F32 = 3 } dn_kv_format_t;

typedef struct {
    dn_kv_format_t format;
    int num_blocks, n_kv_heads, block_size, head_dim;
    void *k, *v;              /* [num_blocks, n_kv_heads, block_size, head_dim] (uint4: head_dim/2 bytes) */
    float *k_scale, *v_scale; /* [num_blocks, n_kv_heads, block_size]; int8 and uint4 */
    float *k_zero, *v_zero;   /* [num_blocks, n_kv_heads, block_size]; uint4 only */
} dn_kv_cache_t;

/* Quantize T tokens into their slots; a negative slot skips the token (padding). */
void dn_kv_write(const dn_kv_cache_t *c,
                 const float *k,       /* [T, n_kv_heads, head_dim] */
                 const float *v,       /* [T, n_kv_heads, head_dim] */
                 const int32_t *slots, /* [T] */
                 int T);
