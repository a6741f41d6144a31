/* A decoder's every layer in one call: what dashinfer_server/model.py's per-op loop does, with
 * no Python between the kernels (a decode step is ~400 kernel calls).
 *
 * One layer, each optional piece NULL / 0 when the model's family lacks it
 * (dashinfer_client/model/families/base.py):
 *   x = attn_norm ? norm(res) : res      (norm: RMSNorm, or LayerNorm (+ bias) where layer_norm)
 *   q, k, v = x Wq + bq, x Wk + bk, x Wv + bv;  q, k = qk_norm(q), qk_norm(k);  RoPE(q, k)
 *   (qk_after_rope: RoPE(q, k) first, then the norms);  q *= q_scale[position] where set
 *   a = attention(q, cache; window, softcap, sinks) Wo + bo   (allreduced);  a = attn_out_norm(a)
 *   res += a;  x = mlp_norm ? norm(res) : res
 *   m = (glu(x Wgate + bgate) * (x Wup + bup)) Wdown + bdown   (allreduced);  m = mlp_out_norm(m)
 *       or, where !gated, m = act(x Wup + bup) Wdown + bdown
 *       or, in a sparse layer, m = the mixture of experts of x (moe.h)  (allreduced)
 *   res += m
 * (parallel: attention and the MLP both read the first x, and res += a + m once.)
 * The residual adds are fused into the next norm where there is one. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "attention.h"
#include "comm.h"
#include "glu.h"
#include "linear.h"
#include "moe.h"

typedef struct {
    const float *attn_norm, *attn_out_norm, *mlp_norm, *mlp_out_norm; /* [hidden] or NULL */
    const float *attn_norm_bias, *mlp_norm_bias; /* [hidden]: a LayerNorm's biases (StarCoder2), or NULL */
    const float *q_norm, *k_norm; /* [head_dim] per head, or [n_heads * head_dim] / [n_kv_heads *
                                     head_dim] of a whole-projection norm; or NULL */
    dn_linear_w q, k, v, o, gate_up, down; /* gate_up: gate rows, then up rows; unset when moe */
    const dn_moe_weights *moe;             /* a sparse layer's experts, or NULL: the dense MLP */
    const float *q_bias, *k_bias, *v_bias, *o_bias, *gate_up_bias, *down_bias; /* or NULL */
    const float *cos_sin; /* this layer's rope table [max_pos, rot_dim] */
    const float *sinks;   /* [n_heads] attention sink logits of this rank's query heads, or NULL */
    const float *act_params; /* [4]: the plain MLP's xielu parameters (dn_act_rows), or NULL */
    int window;           /* keys a query sees at most, itself included; 0: the whole context */
    dn_kv_cache_t kv;
} dn_layer_t;

typedef struct {
    int n_layers, hidden, n_heads, n_kv_heads, head_dim, inter, max_tokens, max_pos, rot_dim;
    int group, q_head0; /* query head h reads kv head (h + q_head0) / group (attention.h) */
    float eps, scale, softcap; /* softcap 0: none */
    dn_act glu;                /* the MLP's activation (glu.h) */
    /* whole-projection q/k norms over tensor-parallel ranks: the widths of the whole q and k rows,
     * and whether this rank's first kv head is cached by the rank before (it then leaves that
     * head out of its sum of squares, so the allreduce counts every head once) */
    int qk_whole, q_total, k_total, k_shared_first;
    int qk_after_rope; /* the q/k norms follow RoPE (Hunyuan) instead of preceding it */
    int layer_norm;    /* the sub-layers' norms are LayerNorms (Cohere, StarCoder2, Nemotron), not RMSNorms */
    int gated;         /* the dense MLP is gated (gate_up: gate rows then up rows), else plain: act(x up) down
                          (Arcee: gate_up holds up's rows alone) */
    int parallel;      /* attention and MLP both read the layer's one norm and their sum joins the
                          residual (Cohere): o2 holds the MLP's output meanwhile */
    const float *q_scale; /* [max_pos]: each query row times its position's factor after RoPE (Ministral
                             3's llama-4 scaling), or NULL */
    dn_moe_shape moe;           /* the sparse layers' routing and expert widths */
    dn_moe_scratch *moe_scratch; /* NULL when every layer is dense */
    dn_layer_t *layers;
    /* workspace, max_tokens rows each: res, h, o [hidden]; q, attn [n_heads * head_dim];
     * k, v [n_kv_heads * head_dim]; gate_up [2 * inter]; act [inter]; norm_ss [2]; o2 [hidden]
     * (parallel only, else NULL) */
    float *res, *h, *o, *q, *k, *v, *attn, *gate_up, *act, *norm_ss, *o2;
} dn_decoder_t;

/* Every layer over the T tokens whose embeddings are in res: leaves the last layer's output in
 * o and the residual stream before it in res. comm (or NULL on one rank) sums o_proj's and
 * down_proj's partial outputs over the ranks. Returns 0, or -1 with a message in err. */
int dn_decoder_run(const dn_decoder_t *d, dn_comm *comm, double timeout, int T,
                   const int32_t *positions, const int32_t *slots, const int32_t *block_tables,
                   int max_blocks, const int32_t *q_offsets, const int32_t *context_lens, int B,
                   char *err, size_t errlen);
