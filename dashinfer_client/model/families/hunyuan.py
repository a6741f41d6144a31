"""Hunyuan dense (Hunyuan-0.5B ... 7B, HunYuanDenseV1ForCausalLM): LLaMA's layer with biases on every
attention projection (attention_bias) and per-head q/k RMSNorms applied after RoPE, not before
(query_layernorm / key_layernorm); its RoPE "dynamic" with a fixed `alpha` is NTK-aware scaling
that only stretches the base: theta * alpha ** (head_dim / (head_dim - 2)), as transformers'
ntk_alpha reads it."""
import numpy as np

from ..rope_scaling import rope_of
from .base import Family
from .renamed import Renamed

_RENAMES = {r"(model\.layers\.\d+\.self_attn\.)query_layernorm\.weight": r"\1q_norm.weight",
            r"(model\.layers\.\d+\.self_attn\.)key_layernorm\.weight": r"\1k_norm.weight"}


def _hunyuan(hf, r):
    head_dim = r.get("head_dim") or r.need("hidden_size") // r.need("num_attention_heads")
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if params.get("rope_type", params.get("type")) == "dynamic" and params.get("alpha"):
        theta = float(params.get("rope_theta", hf.get("rope_theta") or 10000.0))
        # the stretched base meets a float32 tensor in transformers' pow: rounded to float32
        theta, scaling = float(np.float32(theta * float(params["alpha"]) ** (head_dim / (head_dim - 2)))), None
    else:
        theta, scaling = rope_of(hf, head_dim)
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias, rope_theta=theta, rope_scaling=scaling)


HUNYUAN = Family("hunyuan_dense", ("HunYuanDenseV1ForCausalLM",), ("hunyuan_v1_dense",), _hunyuan,
                 qk_norm="head", qk_norm_after_rope=True, own_rope=True,
                 checkpoint_views=(lambda tensors, config: Renamed(tensors, _RENAMES),))
