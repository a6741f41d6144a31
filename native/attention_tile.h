/* Inside attention: the unit of work every ISA path implements, and helpers they share. */
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"

/* Query vectors per tile: heads of one GQA group x query rows. Bounds the per-thread scratch. */
#define ATTN_MAX_M 64

/* Some query heads of one kv head (or, decode tiles, the whole GQA groups of n_kv consecutive kv
 * heads) and some query rows of one sequence, against the cached positions [kv_begin, kv_end).
 * Query vector i of a kv head is row i / n_q_heads, head i % n_q_heads. */
typedef struct {
    const dn_kv_cache_t *kv;
    const int32_t *blocks; /* [max_blocks] this sequence's block table */
    const float *q;        /* vector 0; rows q_stride floats apart, heads head_dim apart */
    int64_t q_stride;      /* n_heads * head_dim */
    int kv_head, n_kv;     /* kv heads kv_head..kv_head + n_kv - 1; n_kv > 1: whole groups */
    int n_q_heads, n_rows; /* M = n_q_heads * n_rows per kv head, n_kv * M <= ATTN_MAX_M */
    int first_pos;         /* position of row 0: row r sees positions 0..first_pos + r */
    int kv_begin, kv_end;  /* kv_end <= first_pos + n_rows; every row sees kv_begin, a
                            * multiple of block_size */
    float scale;           /* softmax scale */
    float *out;            /* complete unit: output of vector 0, same strides as q; else NULL */
    float *part;           /* split unit, per kv head: [M][head_dim] unnormalized acc, [M] max,
                            * [M] sum */
    void *work;            /* attn_work_bytes() of per-thread scratch, 64-byte aligned */
} attn_tile_t;

/* Scratch one thread needs for any tile of this cache shape. */
size_t attn_work_bytes(int block_size, int head_dim);

/* Write a one-head tile's result: out = acc / sum (complete) or the partial triple (split). */
void attn_finish(const attn_tile_t *t,
                 const float *acc,  /* [M][head_dim] */
                 const float *mx,   /* [M] running max of the scaled scores */
                 const float *sum); /* [M] running sum of exp(score - max) */

/* Cache row of (position, kv head): index into the per-token scale arrays; times head_dim (or
 * head_dim / 2 for uint4) is the element offset into the cache. */
static inline int64_t attn_cache_row(const attn_tile_t *t, int pos) {
    int bs = t->kv->block_size;
    return ((int64_t)t->blocks[pos / bs] * t->kv->n_kv_heads + t->kv_head) * bs + pos % bs;
}

/* Start a one-head tile of M = n_q_heads * n_rows query vectors padded to mp: qt [head_dim][mp]
 * the scaled queries transposed (padding 0), limit[i] the last position vector i sees (padding:
 * every one), running max -inf, sum 0 and acc [mp][head_dim] 0. */
static inline void attn_tile_start(const attn_tile_t *t, int mp, float *qt, int32_t *limit,
                                   float *mx, float *sum, float *acc) {
    const int D = t->kv->head_dim, nh = t->n_q_heads, M = nh * t->n_rows;
    for (int i = 0; i < mp; i++) {
        const float *src = i < M ? t->q + (i / nh) * t->q_stride + (int64_t)(i % nh) * D : NULL;
        for (int d = 0; d < D; d++) qt[d * mp + i] = src ? src[d] * t->scale : 0.0f;
        limit[i] = i < M ? t->first_pos + i / nh : INT32_MAX; /* padding sees everything */
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
    }
    memset(acc, 0, (size_t)mp * D * sizeof *acc);
}

/* Tiles of one kv head (n_kv = 1). */
void attn_tile_portable(const attn_tile_t *t);
void attn_tile_avx2(const attn_tile_t *t);
void attn_tile_avx512(const attn_tile_t *t);

/* Decode tiles over several kv heads, for M query vectors per head when _fits says so. */
int attn_decode_avx512_fits(const dn_kv_cache_t *c, int M);
void attn_decode_avx512(const attn_tile_t *t);
int attn_decode_avx2_fits(const dn_kv_cache_t *c, int M);
void attn_decode_avx2(const attn_tile_t *t);
