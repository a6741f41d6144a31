"""Hunyuan MoE (Hunyuan-A13B; HunYuanMoEV1ForCausalLM): Hunyuan dense's attention (hunyuan.py: q/k
norms after RoPE, NTK-alpha RoPE) over a mixture in every layer, as transformers computes it:
num_experts experts of intermediate_size, each token's moe_topk of the softmax renormalised, plus
an ungated shared MLP of intermediate_size (shared_mlp). The router is mlp.gate.wg. A released
config may give num_experts and moe_topk per layer: the same in every layer is served."""
from .base import Family
from .experts import ExpertLayout
from .fused_experts import stacked_experts
from .hunyuan import HUNYUAN

_LAYOUT = ExpertLayout(router="gate.wg", shared="shared_mlp", shared_gate=None)


def _per_layer(r, key):
    """A count the config gives once or per layer; a list that differs between layers is refused."""
    value = r.need(key)
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            r.refuse(f"{key}={value!r} (a count that differs between layers)")
        value = value[0]
    return value


def _hunyuan_moe(hf, r):
    inter = r.need("intermediate_size")
    return dict(HUNYUAN.read_config(hf, r), num_experts=_per_layer(r, "num_experts"),
                num_experts_per_tok=_per_layer(r, "moe_topk"), moe_intermediate_size=inter, norm_topk_prob=True,
                shared_expert_intermediate_size=inter)


HUNYUAN_MOE = Family("hunyuan_moe", ("HunYuanMoEV1ForCausalLM",), ("hunyuan_v1_moe",), _hunyuan_moe, experts=_LAYOUT,
                     qk_norm="head", qk_norm_after_rope=True, own_rope=True,
                     checkpoint_views=(*HUNYUAN.checkpoint_views, stacked_experts(_LAYOUT)))
