"""Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention (q/k/v biases under qkv_bias) over Qwen3-MoE's
sparse MLP plus a shared expert every token runs, scaled by sigmoid(x . shared_expert_gate)."""
from .base import Family
from .experts import ExpertLayout, read_experts, without_empty_shared
from .fused_experts import stacked_experts

_LAYOUT = ExpertLayout()


def _qwen2_moe(hf, r):
    if r.get("use_sliding_window", False):
        r.refuse("use_sliding_window=true (Qwen2-MoE's alternating window layers)")
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}),
                attention_bias=bool(r.get("qkv_bias", True)),
                **read_experts(r, shared=True, sparse_steps=True))


QWEN2_MOE = Family("qwen2_moe", ("Qwen2MoeForCausalLM",), ("qwen2_moe",), _qwen2_moe, experts=_LAYOUT, gguf_arch="qwen2moe",
                   checkpoint_views=(without_empty_shared(_LAYOUT), stacked_experts(_LAYOUT)))
