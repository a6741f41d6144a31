"""ERNIE 4.5 MoE (ERNIE-4.5-21B-A3B, 300B-A47B; Ernie4_5_MoeForCausalLM): ERNIE 4.5's attention
(interleaved RoPE, glm4.py's view) and, on the layers moe_layer_start_index ..
moe_layer_end_index every moe_layer_interval, experts routed by the softmax over all of them: the
top moe_k of probability + e_score_correction_bias (moe_statics: it picks, the probability weighs),
renormalised, plus moe_num_shared_experts experts' worth of an ungated shared MLP.

Its releases hold the multi-token-prediction block beside the model (model.mtp_*): transformers
leaves it unread, and so does the view below. A transformers 5 model in memory holds the choice bias
under its router (mlp.gate.moe_statics), where the checkpoints have it under the MLP."""
from .base import Family
from .experts import ExpertLayout, read_experts, without_empty_shared
from .fused_experts import stacked_experts
from .glm4 import HalvedRope
from .renamed import Renamed, Without

_LAYOUT = ExpertLayout(shared="shared_experts", shared_gate=None, choice_bias="moe_statics.e_score_correction_bias",
                       choice_bias_row=True)


def _ernie4_5_moe(hf, r):
    layers = r.need("num_hidden_layers")
    start, end, every = (r.get(k, d) for k, d in (("moe_layer_start_index", 1), ("moe_layer_end_index", -1),
                                                  ("moe_layer_interval", 1)))
    shared = r.get("moe_num_shared_experts", 2)
    if not all(isinstance(v, int) for v in (start, end, every, shared)) or every < 1 or shared < 0:
        r.refuse(f"moe_layer_start_index={start!r} / moe_layer_end_index={end!r} / moe_layer_interval={every!r} / "
                 f"moe_num_shared_experts={shared!r}")
    bias = bool(r.get("use_bias", False))
    if bias and shared:
        r.refuse("use_bias=true with shared experts (a biased shared MLP)")
    end = layers - 1 if end == -1 else end  # transformers' reading of -1
    fields = read_experts(r, count_key="moe_num_experts", top_k_key="moe_k", norm_topk=True)
    return dict(fields, hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias, mlp_bias=bias,
                shared_expert_intermediate_size=shared * fields["moe_intermediate_size"],
                dense_mlp_layers=[i for i in range(layers) if (i + 1) % every or not start <= i <= end] or None)


def _mtp(name):
    return name.startswith("model.mtp_")


_IN_MEMORY = {r"(model\.layers\.\d+\.mlp\.)gate\.(moe_statics\.e_score_correction_bias)": r"\1\2"}


ERNIE4_5_MOE = Family("ernie4_5_moe", ("Ernie4_5_MoeForCausalLM",), ("ernie4_5_moe",), _ernie4_5_moe, experts=_LAYOUT,
                      gguf_arch="ernie4_5-moe",
                      checkpoint_views=(HalvedRope, lambda tensors, config: Without(Renamed(tensors, _IN_MEMORY), _mtp),
                                        without_empty_shared(_LAYOUT), stacked_experts(_LAYOUT)),
                      config_defaults={"head_dim": 128, "tie_word_embeddings": True, "rope_theta": 500000.0})
