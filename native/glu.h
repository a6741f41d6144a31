/* The gate activations of a gated MLP (GLU): out = act(gate) * up, with act SiLU (LLaMA, Qwen,
 * Phi), GELU with the tanh approximation (Gemma's GeGLU, "gelu_pytorch_tanh"), or gpt-oss's
 * clamped SwiGLU: g = min(g, 7), u = clamp(u, -7, 7), out = g * sigmoid(1.702 g) * (u + 1).
 *
 * All are g * sigmoid(z) * u: SiLU with z = g, and GELU-tanh, 0.5 g (1 + tanh(y)) with
 * y = sqrt(2/pi) (g + 0.044715 g^3), is g * sigmoid(2y) since 0.5 (1 + tanh(y)) = sigmoid(2y);
 * the clamped SwiGLU with z = 1.702 g after clamping g, and u + 1 for u. So every path computes
 * z, then g / (1 + exp(-z)), and writes the exp once. The clamps let NaN through, as
 * torch.clamp does. */
#pragma once
#include <math.h>

/* DN_ACT_RELU2, max(x, 0)^2 (Arcee's), and DN_ACT_XIELU (Apertus': dn_act_rows) are a plain (ungated)
 * MLP's only, never a GLU's */
typedef enum {
    DN_ACT_SILU = 0, DN_ACT_GELU_TANH = 1, DN_ACT_CLAMPED_SWIGLU = 2, DN_ACT_RELU2 = 3, DN_ACT_XIELU = 4
} dn_act;

/* gpt-oss's swiglu_limit and swiglu_alpha (its config's defaults, which its checkpoints keep) */
#define SWIGLU_LIMIT 7.0f
#define SWIGLU_ALPHA 1.702f

/* z = g * (GELU_Z1 + GELU_Z3 * g^2) = 2 sqrt(2/pi) (g + 0.044715 g^3) */
#define GELU_Z1 1.5957691216057308f  /* 2 sqrt(2/pi) */
#define GELU_Z3 0.07135481627260025f /* 2 sqrt(2/pi) * 0.044715 */

static inline float dn_glu_scalar(float g, float u, dn_act act) {
    if (act == DN_ACT_CLAMPED_SWIGLU) {
        g = g > SWIGLU_LIMIT ? SWIGLU_LIMIT : g;
        u = (u > SWIGLU_LIMIT ? SWIGLU_LIMIT : u < -SWIGLU_LIMIT ? -SWIGLU_LIMIT : u) + 1.0f;
    }
    float z = act == DN_ACT_GELU_TANH        ? g * (GELU_Z1 + GELU_Z3 * g * g)
              : act == DN_ACT_CLAMPED_SWIGLU ? SWIGLU_ALPHA * g
                                             : g;
    return g / (1.0f + expf(-z)) * u;
}
