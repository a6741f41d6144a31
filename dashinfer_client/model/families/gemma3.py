"""Gemma 3 (text): Gemma 2's layer with RMSNorms over each head of q and k, five sliding-window
layers to one global, and a RoPE base of their own for the sliding layers."""
from ..rope_scaling import rope_of
from .base import Family
from .gemma2 import GEMMA_NORMS, gemma_common

# Gemma3TextConfig.default_theta: the bases of a config.json that names none
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0


def rope_parameters(hf):
    """config.json's RoPE per layer type, as transformers 5's Gemma3TextConfig reads either spelling
    (its convert_rope_params_to_dict): 5.x's rope_parameters per layer type, or 4.x's (every released
    Google checkpoint's) rope_theta and rope_scaling for the full layers and rope_local_base_freq,
    never scaled, for the sliding ones. A rope_scaling updates the full layers' dict even beside
    rope_parameters; a flat rope_parameters names no layer type, so transformers ignores it."""
    given = hf.get("rope_parameters") or {}
    full = dict(given.get("full_attention") or {"rope_type": "default"})
    full.update(hf.get("rope_scaling") or {})
    full.setdefault("rope_theta", hf.get("rope_theta") or GLOBAL_THETA)
    sliding = dict(given.get("sliding_attention") or {"rope_type": "default"})
    sliding.setdefault("rope_theta", hf.get("rope_local_base_freq") or LOCAL_THETA)
    return {"full_attention": full, "sliding_attention": sliding}


def _gemma3(hf, r):
    if r.get("use_bidirectional_attention", False):
        r.refuse("use_bidirectional_attention=true (an encoder)")
    pattern = r.get("sliding_window_pattern", 6)
    # a window wider than the context is kept: the sliding layers' RoPE base still differs
    fields = gemma_common(hf, r, lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention",
                          keep_wide_window=True)
    head_dim = r.get("head_dim") or r.need("hidden_size") // r.need("num_attention_heads")
    rope = dict(hf, rope_parameters=rope_parameters(hf))
    fields["rope_theta"], fields["rope_scaling"] = rope_of(rope, head_dim, "full_attention")
    fields["rope_local_theta"], scaling = rope_of(rope, head_dim, "sliding_attention")
    if scaling is not None:
        r.refuse(f"RoPE scaling on the sliding layers ({scaling})")
    # transformers' Gemma3Attention never passes attn_logit_softcapping to its attention function,
    # so the scores are not capped whatever config.json says (released configs set it null)
    fields["attn_logit_softcap"] = None
    return fields


GEMMA3 = Family("gemma3", ("Gemma3ForCausalLM",), ("gemma3_text",), _gemma3, gguf_arch="gemma3",
                norms=GEMMA_NORMS, norm_offset=1.0, qk_norm="head",
                # Gemma3TextConfig's, which the text_config of Gemma 3's released 4B-27B models leaves to it
                config_defaults={"sliding_window": 4096, "rms_norm_eps": 1e-6, "max_position_embeddings": 131072,
                                 "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                                 "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4,
                                 "head_dim": 256, "query_pre_attn_scalar": 256})
