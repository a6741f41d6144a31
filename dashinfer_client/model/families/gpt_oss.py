"""gpt-oss (gpt-oss-20b, gpt-oss-120b): attention with q/k/v/o biases and a learned sink logit per
head, a 128-key sliding window on alternate layers (layer_types), YaRN; every layer's MLP a mixture
of experts: a router with a bias, the top num_experts_per_tok of its logits softmaxed (the
renormalised top-k of the softmax: the same numbers), experts with biases whose activation is the
clamped SwiGLU (gate <= 7, up in [-7, 7], (up + 1) * gate * sigmoid(1.702 gate)) whatever
hidden_act says. The experts are stored fused, and in the released checkpoints as MXFP4:

    mlp.experts.gate_up_proj          [E, hidden, 2 * inter]  gate and up columns alternating
    mlp.experts.gate_up_proj_bias     [E, 2 * inter]          alternating the same way
    mlp.experts.down_proj             [E, inter, hidden]
    mlp.experts.down_proj_bias        [E, hidden]
    mlp.experts.{gate_up|down}_proj_blocks  [E, out, in / 32, 16] uint8: e2m1 pairs, low nibble first
    mlp.experts.{gate_up|down}_proj_scales  [E, out, in / 32] uint8: e8m0 scales

fused_experts.FusedExperts shows them under experts.py's per-expert names ([out, in] weights, as
the other families store them); MXFP4 ones as {name}.mxfp4_blocks [out, in / 2] and
{name}.mxfp4_scales [out, in / 32], which the serialized model keeps as they are
(ModelConfig.mxfp4_experts).
"""
from .base import Family
from .experts import ExpertLayout, read_experts
from .fused_experts import FusedExperts

SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}  # native/glu.h's constants


def _gpt_oss(hf, r):
    for key, value in SWIGLU.items():
        got = r.get(key, value)
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got != value:
            r.refuse(f"{key}={got!r} (the clamped SwiGLU has {key} {value})")
    r.get("hidden_act")  # transformers' gpt-oss experts never read it
    bias = bool(r.get("attention_bias", True))
    types, window = r.window(r.layer_types(
        r.need("num_hidden_layers"), lambda i: "sliding_attention" if (i + 1) % 2 else "full_attention"))
    quant = (hf.get("quantization_config") or {}).get("quant_method")
    return dict(hidden_act="clamped_swiglu", attention_bias=bias, attention_out_bias=bias, layer_types=types,
                sliding_window=window, mxfp4_experts=quant == "mxfp4",
                **read_experts(r, inter_key="intermediate_size", norm_topk=True))


_LAYOUT = ExpertLayout(router="router", biases=True)
# GptOssConfig's defaults: the released checkpoints' RoPE and window
_DEFAULTS = {"rope_theta": 150000.0, "sliding_window": 128,
             "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                              "truncate": False, "original_max_position_embeddings": 4096}}
GPT_OSS = Family("gpt_oss", ("GptOssForCausalLM",), ("gpt_oss",), _gpt_oss, sinks=True, experts=_LAYOUT,
                 checkpoint_views=(lambda tensors, config: FusedExperts(tensors, _LAYOUT, interleaved=True,
                                                                       transposed=True),),
                 stored_quant="mxfp4", config_defaults=_DEFAULTS)
