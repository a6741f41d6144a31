/* A decoder's every layer in one call: what dashinfer_server/model.py's per-op loop does, with
 * no Python between the kernels (a decode step is ~400 kernel calls). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "attention.h"
#include "comm.h"
#include "linear.h"

typedef struct {
    const float *input_norm, *post_norm;   /* [hidden] */
    dn_linear_w q, k, v, o, gate_up, down; /* gate_up: gate rows, then up rows */
    const float *q_bias, *k_bias, *v_bias; /* or NULL */
    dn_kv_cache_t kv;
} dn_layer_t;

typedef struct {
    int n_layers, hidden, n_heads, n_kv_heads, head_dim, inter, max_tokens, max_pos;
    int rotary_dim; /* the rope table's width: the first rotary_dim dims of a head rotate */
    int group, q_head0; /* query head h reads kv head (h + q_head0) / group (attention.h) */
    float eps, scale;
    const float *cos_sin; /* [max_pos, rotary_dim] */
    dn_layer_t *layers;
    /* workspace, max_tokens rows each: res, h, o [hidden]; q, attn [n_heads * head_dim];
     * k, v [n_kv_heads * head_dim]; gate_up [2 * inter]; act [inter] */
    float *res, *h, *o, *q, *k, *v, *attn, *gate_up, *act;
} dn_decoder_t;

/* Every layer over the T tokens whose embeddings are in res: leaves the last layer's output in
 * o and the residual stream before it in res. comm (or NULL on one rank) sums o_proj's and
 * down_proj's partial outputs over the ranks. Returns 0, or -1 with a message in err. */
int dn_decoder_run(const dn_decoder_t *d, dn_comm *comm, double timeout, int T,
                   const int32_t *positions, const int32_t *slots, const int32_t *block_tables,
                   int max_blocks, const int32_t *q_offsets, const int32_t *context_lens, int B,
                   char *err, size_t errlen);
