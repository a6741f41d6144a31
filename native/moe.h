/* A sparse mixture-of-experts MLP (Qwen-MoE, Mixtral, OLMoE, gpt-oss; dashinfer_client/model/
 * families/experts.py), for the tokens x [T, hidden]:
 *   p = softmax(x Wr^T + br)            fp32 scores over all n_experts (br: gpt-oss's router bias),
 *       or sigmoid(x Wr^T)              each expert's own (GLM-4.5, DeepSeek-V3's router)
 *   e_i = the top_k of p + c            c: a choice bias that picks the experts but weighs none
 *                                       (GLM-4.5's e_score_correction_bias; 0 when absent)
 *   w_i = p[e_i], renormalised to sum to 1 when norm_topk (which is gpt-oss's softmax over its
 *                                       top_k logits: exp is monotonic), times routed_scale
 *   out = sum_i w_i * ((glu(x We_gate^T + bg) * (x We_up^T + bu)) We_down^T + bd)
 *                                       (the expert biases bg, bu, bd: gpt-oss's)
 *       + g * (shared expert's gated MLP of x)    (when it has one; g = sigmoid(x . shared_gate),
 *                                       Qwen2-MoE's, or 1 where it has no gate: GLM-4.5's)
 * Tokens are grouped by expert: each expert some token chose runs over its tokens (one
 * dn_linear_glu and one dn_linear: a GEMM in prefill, where one thread runs each run of at most
 * DN_MOE_ITEM_ROWS of them); experts no token chose are not read,
 * so a decode step streams only the chosen experts' bytes. Experts are packed linears like any
 * other weight (linear.h), so every weight type serves them.
 *
 * Over tensor-parallel ranks each rank holds a share of every chosen expert's work and `out` is
 * its partial sum, which the decoder's allreduce completes: either every expert split by its
 * intermediate rows (expert_step 1: the rank holds [inter_r] of each), or whole experts spread
 * over the ranks (rank r of R holds experts r, r + R, ...: expert0 r, expert_step R). */
#pragma once
#include <stdint.h>

#include "glu.h"
#include "linear.h"

#define DN_MOE_MAX_LOCAL 256 /* a rank's experts that decode runs together (moe.c); more run as a prompt's */
#define DN_MOE_ITEM_ROWS 96  /* a prompt's expert rows one thread runs at a time (moe.c) */

typedef struct {
    int n_experts, top_k, norm_topk; /* the router: n_experts scored, top_k kept */
    int sigmoid;                       /* scores: 1 sigmoid of each logit, 0 the softmax over all */
    float routed_scale;                /* the routing weights' last factor (1 for most families) */
    int expert0, expert_step, n_local; /* this rank's experts: expert0 + j * expert_step, j < n_local */
    int hidden, inter, shared_inter;   /* this rank's rows of one expert / of the shared one (0: none) */
    dn_act act;
} dn_moe_shape;

typedef struct {
    dn_linear_w router;                /* [n_experts, hidden] */
    dn_linear_w *gate_up, *down;       /* [n_local]: [2 * inter, hidden] (gate rows, then up), [hidden, inter] */
    dn_linear_w shared_gate_up, shared_down; /* [2 * shared_inter, hidden], [hidden, shared_inter] */
    const float *shared_gate;          /* [hidden]: scales the shared expert's output by sigmoid(x . it);
                                          NULL: the shared expert's output added as it is */
    const float *router_bias;          /* [n_experts] or NULL */
    const float *choice_bias;          /* [n_experts] or NULL: added to the scores to pick experts only */
    const float *gate_up_bias;         /* [n_local][2 * inter] (gate, then up) or NULL */
    const float *down_bias;            /* [n_local][hidden] or NULL; of the rows-split experts, one rank's */
} dn_moe_weights;

/* Buffers for up to max_tokens tokens, allocated once (dn_moe_scratch_new). */
typedef struct {
    int max_tokens;
    float *probs;      /* [T, n_experts] */
    int32_t *choice;   /* [T, top_k] expert ids, best first */
    float *weight;     /* [T, top_k] their routing weights */
    int32_t *offsets;  /* [n_local + 1]: local expert j's slots are rows[offsets[j] .. offsets[j + 1]) */
    int32_t *rows;     /* [T * top_k] the token of each slot, grouped by expert, tokens ascending */
    float *row_weight; /* [T * top_k] */
    float *x;          /* [T, hidden]: the chosen experts' gathered tokens (decode) */
    int y_rows;        /* max(T, DN_MOE_ITEM_ROWS) */
    float *y;          /* [y_rows, hidden]: the experts' outputs, a slot a row, before the scatter */
    int32_t *items;    /* [max_items][3]: a prompt's work items (moe.c): local expert, first slot, rows */
    int32_t *order;    /* [max_items]: the items in the order threads take them */
    float *gate_up, *act; /* [T, 2 * max(inter, shared_inter)], [T, max(inter, shared_inter)] */
} dn_moe_scratch;

dn_moe_scratch *dn_moe_scratch_new(const dn_moe_shape *s, int max_tokens); /* NULL: no memory */
void dn_moe_scratch_free(dn_moe_scratch *sc);

/* The routing of T tokens from their router logits [T, n_experts] (overwritten by the scores):
 * choice and weight [T, top_k]; choice_bias as dn_moe_weights' (NULL: none). */
void dn_moe_route(const dn_moe_shape *s, float *logits, int T, const float *choice_bias, int32_t *choice,
                  float *weight);

/* out [T, hidden] = this rank's part of the block over x [T, hidden] (out must not overlap x).
 * Returns 0, or -1 when a kernel's scratch memory cannot be allocated. */
int dn_moe(const dn_moe_shape *s, const dn_moe_weights *w, dn_moe_scratch *sc, const float *x, int T,
           float *out);
