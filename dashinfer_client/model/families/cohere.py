"""Cohere's Command R, R7B and A, and Aya Expanse (CohereForCausalLM, Cohere2ForCausalLM): a
parallel block (attention and the gated MLP both read one LayerNorm without a bias of the residual,
and their sum joins it), RoPE over interleaved pairs of dims (glm4.py's view), tied embeddings,
logits times logit_scale. Cohere2 (Command R7B, Command A) slides a window over three layers of
four (layer_types) and gives the fourth no positional encoding at all. Command R+'s per-head
LayerNorms of q and k (use_qk_norm) are refused by name."""
from .base import Family
from .glm4 import HalvedRope

_NORMS = {"attn_in": "input_layernorm"}  # the one norm of a layer


def _cohere(hf, r):
    if r.get("use_qk_norm", False):
        r.refuse("use_qk_norm=true (LayerNorms of q and k per head, Command R+'s)")
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias, attention_out_bias=bias,
                logits_multiplier=float(r.get("logit_scale", 0.0625)))


def _cohere2(hf, r):
    layers = r.need("num_hidden_layers")
    pattern = r.get("sliding_window_pattern", 4)
    types, window = r.window(r.layer_types(layers, lambda i: "sliding_attention" if (i + 1) % pattern else
                                           "full_attention"), keep_wide=True)
    full = [i for i in range(layers) if (types or ["full_attention"] * layers)[i] == "full_attention"]
    return dict(_cohere(hf, r), layer_types=types, sliding_window=window, nope_layers=full or None)


_COMMON = dict(norms=_NORMS, layer_norm=True, parallel_block=True, checkpoint_views=(HalvedRope,),
               norm_eps_key="layer_norm_eps")
COHERE = Family("cohere", ("CohereForCausalLM",), ("cohere",), _cohere, **_COMMON, gguf_arch="command-r",
                config_defaults={"tie_word_embeddings": True, "rope_theta": 500000.0})  # CohereConfig's
COHERE2 = Family("cohere2", ("Cohere2ForCausalLM",), ("cohere2",), _cohere2, **_COMMON,
                 config_defaults={"tie_word_embeddings": True, "sliding_window": 4096})  # Cohere2Config's
