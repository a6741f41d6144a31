"""Mixtral: Mistral's attention (a sliding window over every layer when the config names one) over
num_local_experts experts of intermediate_size, each token's top 2 renormalised to sum to 1;
experts stored as w1 (gate), w3 (up), w2 (down) under block_sparse_moe."""
from .base import Family
from .experts import ExpertLayout, read_experts
from .fused_experts import stacked_experts


def _mixtral(hf, r):
    types, window = r.window(r.layer_types(r.need("num_hidden_layers"), lambda i: "sliding_attention"))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=False,
                layer_types=types, sliding_window=window,
                **read_experts(r, inter_key="intermediate_size", norm_topk=True))


_LAYOUT = ExpertLayout(block="block_sparse_moe", gate="w1", up="w3", down="w2")
MIXTRAL = Family("mixtral", ("MixtralForCausalLM",), ("mixtral",), _mixtral, experts=_LAYOUT,
                 checkpoint_views=(stacked_experts(_LAYOUT),), config_defaults={"rope_theta": 1e6})
