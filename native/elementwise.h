/* The small per-token kernels of a decoder: RMSNorm (with the fused residual add), rotary
 * position embedding, a gated MLP's act(gate) * up (glu.h), and the embedding lookup.
 * fp32 activations.
 * Each picks the ISA path (dn_isa) and threads over rows when the work pays for it. */
#pragma once
#include <stdint.h>

#include "glu.h"

/* out = x / sqrt(mean(x^2) + eps) * weight, row by row.
 * With residual (non-NULL): residual += x first, and the norm is taken of the new residual
 * (the pre-norm decoder's "add then norm"). out may be x itself; it must not overlap residual. */
void dn_rms_norm(const float *x,   /* [M, N] */
                 const float *weight, /* [N] */
                 float *residual,  /* [M, N] or NULL */
                 float *out,       /* [M, N] */
                 int M, int N, float eps);

/* The same with the row's mean taken out first (LayerNorm: Cohere's, without a bias; StarCoder2's and
 * Nemotron's with one): out = (x - mean) / sqrt(mean((x - mean)^2) + eps) * weight + bias (bias NULL: 0). */
void dn_layer_norm(const float *x, const float *weight, const float *bias, float *residual, float *out, int M, int N,
                   float eps);

/* Rotary embedding in place, half-rotation (neox) layout as transformers' rotate_half, over the
 * first R dims of each head of D (partial rotary when R < D; the rest pass through): with
 * h = R/2, x[j] <- x[j]*cos - x[j+h]*sin and x[j+h] <- x[j+h]*cos + x[j]*sin for j < h.
 * Token t of q starts at q + t*ldq (ldq >= n_heads*D, so q and k may be slices of a fused
 * qkv row); cos_sin row p holds cos of frequency j at column j and its sin at h+j.
 * R is even and at most D; positions must already be checked to lie in [0, rows of cos_sin). */
void dn_rope(float *q, int n_heads, long ldq,        /* [T, ldq], heads of D at the start */
             float *k, int n_kv_heads, long ldk,     /* [T, ldk], or NULL */
             const int32_t *positions,               /* [T] */
             const float *cos_sin,                   /* [max_pos, R] */
             int T, int D, int R);

/* out = act(gate) * up (glu.h); gate_up rows hold gate then up. */
void dn_glu_mul(const float *gate_up, /* [M, 2I] */
                float *out,           /* [M, I] */
                int M, int I, dn_act act);

/* out = act(x) for n floats of a plain (ungated) MLP: relu2 (Arcee's), xielu (Apertus': with params
 * {alpha_p, alpha_n, beta, eps} as the activation uses them, softplus'd: x > 0 ? alpha_p x^2 + beta x
 * : (expm1(min(x, eps)) - x) alpha_n + beta x), or silu / gelu_tanh. */
void dn_act_rows(const float *x, float *out, long n, dn_act act, const float *params);

/* out[i] = act(gate[i]) * up[i] for n floats, on the calling thread (a GEMM's store). */
void dn_glu_row(const float *gate, const float *up, float *out, int n, dn_act act);

/* embedding.c: the index of the first id outside [0, V), or -1 when all are valid. */
long dn_embedding_first_bad(const int32_t *ids, long T, long V);

/* out[t] = table[ids[t]]; ids must already be valid (dn_embedding_first_bad). */
void dn_embedding_f32(const int32_t *ids, const float *table, /* [T], [V, D] */
                      float *out, int T, int D);             /* [T, D] */
void dn_embedding_bf16(const int32_t *ids, const uint16_t *table, /* [T], [V, D] bf16 bits */
                       float *out, int T, int D);                /* [T, D] */
