"""Gemma 2: norms before and after both attention and MLP (RMSNorm weights stored as w - 1), a
GELU-tanh gated MLP, embeddings times sqrt(hidden), scores scaled by query_pre_attn_scalar ** -0.5
and soft-capped, soft-capped logits, and sliding-window attention on every other layer."""
from .base import Family

GEMMA_NORMS = {"attn_in": "input_layernorm", "attn_out": "post_attention_layernorm",
               "mlp_in": "pre_feedforward_layernorm", "mlp_out": "post_feedforward_layernorm"}
GELU_TANH = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def gemma_common(hf, r, pattern, keep_wide_window=False):
    """What Gemma 2 and 3 read alike; pattern(i): layer i's type when config.json lists none;
    keep_wide_window: see ConfigReader.window."""
    bias = bool(r.get("attention_bias", False))
    types, window = r.window(r.layer_types(r.need("num_hidden_layers"), pattern), keep_wide_window)
    return dict(hidden_act=r.activation("hidden_activation", GELU_TANH), attention_bias=bias,
                attention_out_bias=bias, layer_types=types, sliding_window=window,
                embedding_multiplier=float(r.need("hidden_size")) ** 0.5,
                attention_scale=float(r.need("query_pre_attn_scalar")) ** -0.5,
                attn_logit_softcap=r.get("attn_logit_softcapping"),
                final_logit_softcap=r.get("final_logit_softcapping"),
                tie_word_embeddings=bool(r.get("tie_word_embeddings", True)))


def _gemma2(hf, r):
    return gemma_common(hf, r, lambda i: "sliding_attention" if (i + 1) % 2 else "full_attention")


GEMMA2 = Family("gemma2", ("Gemma2ForCausalLM",), ("gemma2",), _gemma2, gguf_arch="gemma2",
                norms=GEMMA_NORMS, norm_offset=1.0)
