/* The gate activations of a gated MLP (GLU): out = act(gate) * up, with act SiLU (LLaMA, Qwen,
 * Phi) or GELU with the tanh approximation (Gemma's GeGLU, "gelu_pytorch_tanh").
 *
 * Both are g * sigmoid(z): SiLU with z = g, and GELU-tanh, 0.5 g (1 + tanh(y)) with
 * y = sqrt(2/pi) (g + 0.044715 g^3), is g * sigmoid(2y) since 0.5 (1 + tanh(y)) = sigmoid(2y).
 * So every path computes z, then g / (1 + exp(-z)), and writes the exp once. */
#pragma once
#include <math.h>

typedef enum { DN_ACT_SILU = 0, DN_ACT_GELU_TANH = 1 } dn_act;

/* z = g * (GELU_Z1 + GELU_Z3 * g^2) = 2 sqrt(2/pi) (g + 0.044715 g^3) */
#define GELU_Z1 1.5957691216057308f  /* 2 sqrt(2/pi) */
#define GELU_Z3 0.07135481627260025f /* 2 sqrt(2/pi) * 0.044715 */

static inline float dn_glu_scalar(float g, float u, dn_act act) {
    float z = act == DN_ACT_GELU_TANH ? g * (GELU_Z1 + GELU_Z3 * g * g) : g;
    return g / (1.0f + expf(-z)) * u;
}
