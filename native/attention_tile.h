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
    int window;            /* > 0: row r sees only positions past first_pos + r - window */
    int kv_begin, kv_end;  /* kv_end <= first_pos + n_rows; kv_begin a multiple of block_size,
                            * seen by row 0 unless a window starts inside its block */
    float scale;           /* softmax scale */
    float softcap;         /* > 0: scores become softcap * tanh(score / softcap) */
    const float *sinks;    /* NULL, or the sink logit of each query head of the tile (vector i's
                            * head i % n_q_heads), added to a complete unit's denominator */
    float *out;            /* complete unit: output of vector 0, same strides as q; else NULL */
    float *part;           /* split unit, per kv head: [M][head_dim] unnormalized acc, [M] max,
                            * [M] sum */
    void *work;            /* attn_work_bytes() of per-thread scratch, 64-byte aligned */
} attn_tile_t;

/* Scratch one thread needs for any tile of this cache shape. */
size_t attn_work_bytes(int block_size, int head_dim);

/* Write a one-head tile's result: out = acc / (sum + exp(sink - max)) (complete; no sink term
 * without sinks) or the partial triple (split: dn_attention adds the sink when it merges). */
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

/* The positions [low[i], limit[i]] that vector i of a one-head tile sees, for mp >= M vectors
 * (padding: every position). */
static inline void attn_seen_positions(const attn_tile_t *t, int mp, int32_t *low, int32_t *limit) {
    const int nh = t->n_q_heads, M = nh * t->n_rows;
    for (int i = 0; i < mp; i++) {
        limit[i] = i < M ? t->first_pos + i / nh : INT32_MAX;
        low[i] = i < M && t->window ? limit[i] - t->window + 1 : INT32_MIN;
    }
}

/* Start a one-head tile of M = n_q_heads * n_rows query vectors padded to mp: qt [head_dim][mp]
 * the scaled queries transposed (padding 0), the positions each vector sees, running max -inf,
 * sum 0 and acc [mp][head_dim] 0. */
static inline void attn_tile_start(const attn_tile_t *t, int mp, float *qt, int32_t *low,
                                   int32_t *limit, float *mx, float *sum, float *acc) {
    const int D = t->kv->head_dim, nh = t->n_q_heads, M = nh * t->n_rows;
    attn_seen_positions(t, mp, low, limit);
    for (int i = 0; i < mp; i++) {
        const float *src = i < M ? t->q + (i / nh) * t->q_stride + (int64_t)(i % nh) * D : NULL;
        for (int d = 0; d < D; d++) qt[d * mp + i] = src ? src[d] * t->scale : 0.0f;
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
    }
    memset(acc, 0, (size_t)mp * D * sizeof *acc);
}

/* Hide the tokens of a block (n tokens from position pos; scores s [n][mp]) that a vector does
 * not see: score -inf. Only the tokens before the last row's window start and those past the
 * first row's position can be hidden from anyone; the rows between are left alone. */
static inline void attn_mask_block(const attn_tile_t *t, int pos, int n, int mp,
                                   const int32_t *low, const int32_t *limit, float *s) {
    const int last = t->first_pos + t->n_rows - 1;
    int before = t->window ? last - t->window + 1 - pos : 0; /* tokens j < before */
    int past = t->first_pos + 1 - pos;                         /* tokens j >= past */
    before = before < 0 ? 0 : before;
    past = past < before ? before : past;
    for (int j = 0; j < n; j++) {
        if (j == before) j = past;
        if (j >= n) break;
        const int p = pos + j;
        for (int i = 0; i < mp; i++)
            if (p > limit[i] || p < low[i]) s[j * mp + i] = -INFINITY;
    }
}

/* The tokens of a decode tile's slice (n tokens from index off of a block, the first at position
 * pos) that each of its M vectors of one kv head sees, as slice indices [ts[i], te[i]): from its
 * window's start to its own position. [*tmin, *tmax) spans every non-empty range (none: tmin >
 * tmax). */
static inline void attn_slice_seen(const attn_tile_t *t, int pos, int off, int n, int M, int *ts,
                                   int *te, int *tmin, int *tmax) {
    *tmin = off + n;
    *tmax = off;
    for (int i = 0; i < M; i++) {
        const int p = t->first_pos + i / t->n_q_heads - pos; /* its position, counted from pos */
        int a = t->window ? p - t->window + 1 : 0, b = p + 1;
        a = a < 0 ? 0 : a > n ? n : a;
        b = b < 0 ? 0 : b > n ? n : b;
        ts[i] = off + a;
        te[i] = off + b;
        if (a < b && ts[i] < *tmin) *tmin = ts[i];
        if (a < b && te[i] > *tmax) *tmax = te[i];
    }
}

/* Tiles of one kv head (n_kv = 1). */
void attn_tile_portable(const attn_tile_t *t);
void attn_tile_avx2(const attn_tile_t *t);
void attn_tile_avx512(const attn_tile_t *t);
void attn_tile_dpbf16_avx512(const attn_tile_t *t);  /* its bf16, int8 and uint4 caches */

/* Decode tiles over several kv heads, for M query vectors per head when _fits says so. */
int attn_decode_avx512_fits(const dn_kv_cache_t *c, int M);
void attn_decode_avx512(const attn_tile_t *t);
int attn_decode_avx2_fits(const dn_kv_cache_t *c, int M);
void attn_decode_avx2(const attn_tile_t *t);
