/* Where each value of a (block, kv head) slice of the cache lives: the layouts of kv_cache.h.
 * Shared by kv_write (scatter), the portable tile (gather) and the tests' numpy mirror.
 *
 * Decode reads every cached byte once per step and does a few multiply-adds with it, so the
 * layout serves the vector units:
 *   K: the 16 tokens of a group side by side for each d (fp32), d pair (bf16, int8: the pairs of
 *      vpdpwssd and of the bf16 even/odd split) or d quad (uint4, vpdpbusd): q . k of 16 tokens
 *      accumulates in the 16 lanes with no horizontal sums.
 *   V: rows (fp32, bf16: a broadcast weight times a row), token pairs (int8) or quads (uint4)
 *      side by side for each d, the products vpdpwssd / vpdpbusd sum over. */
#pragma once
#include <stdint.h>

#include "kv_cache.h"

/* Index of K value (t, d) in its slice: element index; uint4: nibble index (byte = i / 2,
 * high nibble when i is odd). t < block_size (a multiple of 16), d < head_dim. */
static inline int64_t kv_k_index(dn_kv_format_t f, int D, int t, int d) {
    int64_t g = t >> 4, l = t & 15;
    switch (f) {
    case DN_KV_F32: /* [bs/16][D][16] */
        return (g * D + d) * 16 + l;
    case DN_KV_BF16:
    case DN_KV_INT8: /* [bs/16][D/2][16][2] */
        return ((g * (D >> 1) + (d >> 1)) * 16 + l) * 2 + (d & 1);
    case DN_KV_UINT4: /* bytes [bs/16][D/8][16][4]: d = 8j + b low nibble, 8j + 4 + b high */
        return ((((g * (D >> 3) + (d >> 3)) * 16 + l) * 4 + (d & 3)) << 1) | ((d >> 2) & 1);
    }
    return 0;
}

/* Index of V value (t, d) in its slice, as kv_k_index. */
static inline int64_t kv_v_index(dn_kv_format_t f, int D, int t, int d) {
    switch (f) {
    case DN_KV_F32:
    case DN_KV_BF16: /* [bs][D] */
        return (int64_t)t * D + d;
    case DN_KV_INT8: /* [bs/2][D][2] */
        return ((int64_t)(t >> 1) * D + d) * 2 + (t & 1);
    case DN_KV_UINT4: /* bytes [bs/4][D/16][8][4]: d = 16c + k low nibble, 16c + 8 + k high */
        return (((((int64_t)(t >> 2) * (D >> 4) + (d >> 4)) * 8 + (d & 7)) * 4 + (t & 3)) << 1) |
               ((d >> 3) & 1);
    }
    return 0;
}
