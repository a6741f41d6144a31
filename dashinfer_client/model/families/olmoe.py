"""OLMoE: LLaMA's pre-norm layer with OLMo 2's q/k RMSNorms over the whole projection, and every
MLP sparse: experts of intermediate_size, the top-k softmax weights used as they are (norm_topk_prob
false in OLMoE's configs)."""
from .base import Family
from .experts import ExpertLayout, read_experts
from .fused_experts import stacked_experts


def _olmoe(hf, r):
    if r.get("clip_qkv") is not None:
        r.refuse(f"clip_qkv={r.get('clip_qkv')!r} (q, k, v clamped)")
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias, **read_experts(r, inter_key="intermediate_size"))


OLMOE = Family("olmoe", ("OlmoeForCausalLM",), ("olmoe",), _olmoe, qk_norm="whole", experts=ExpertLayout(), gguf_arch="olmoe",
               checkpoint_views=(stacked_experts(ExpertLayout()),))
