"""Qwen3 (dense): Qwen2's decoder without q/k/v biases, with an RMSNorm over each head of q and k
(one [head_dim] weight each) before RoPE."""
from .base import Family
from .qwen2 import qwen_window


def _qwen3(hf, r):
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias, **qwen_window(hf, r))


# Qwen3-VL's language model (multimodal.py) is Qwen3's
QWEN3 = Family("qwen3", ("Qwen3ForCausalLM",), ("qwen3", "qwen3_vl_text"), _qwen3, gguf_arch="qwen3", qk_norm="head")
