"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head q/k norms) over a
sparse MLP: a softmax router over num_experts, the top num_experts_per_tok, renormalised when
norm_topk_prob; layers in mlp_only_layers, or off the decoder_sparse_step, keep a dense MLP."""
from .base import Family
from .experts import ExpertLayout, read_experts
from .fused_experts import stacked_experts


def qwen_moe_window(hf, r):
    """Qwen3-MoE slides every layer's window when use_sliding_window (transformers' one mask)."""
    if not r.get("use_sliding_window", False):
        return dict(layer_types=None, sliding_window=None)
    types, window = r.window(r.layer_types(r.need("num_hidden_layers"), lambda i: "sliding_attention"))
    return dict(layer_types=types, sliding_window=window)


def _qwen3_moe(hf, r):
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias, **qwen_moe_window(hf, r), **read_experts(r, sparse_steps=True))


# Qwen3-VL-MoE's language model (multimodal.py) is Qwen3-MoE's
QWEN3_MOE = Family("qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3_moe", "qwen3_vl_moe_text"), _qwen3_moe, qk_norm="head",
                   experts=ExpertLayout(), gguf_arch="qwen3moe", checkpoint_views=(stacked_experts(ExpertLayout()),))
