"""GLM-4.5 / GLM-4.6 / GLM-4.7 (Glm4MoeForCausalLM; GLM-4.5-Air too): LLaMA's pre-norm layer with
q/k/v biases, q/k norms per head where use_qk_norm, RoPE on the first half of each head (halves, not
GLM-4's interleaved pairs), and from layer first_k_dense_replace on a sparse MLP routed as DeepSeek-V3
routes: each expert's sigmoid score, the top num_experts_per_tok of score + e_score_correction_bias
(the bias picks, the score weighs), renormalised, times routed_scaling_factor, plus n_shared_experts
experts' worth of an ungated shared MLP every token runs.

The released checkpoints also hold the multi-token-prediction layers (num_nextn_predict_layers of
them after the last, speculative decoding's drafts): transformers leaves them unread, and so does
the view below."""
import re

from .base import Family
from .experts import ExpertLayout, read_experts, without_empty_shared
from .fused_experts import stacked_experts
from .renamed import Without

SIGMOID_LAYOUT = ExpertLayout(shared="shared_experts", shared_gate=None, choice_bias="gate.e_score_correction_bias")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def read_sigmoid_experts(r, shared_default):
    """The expert fields of a DeepSeek-V3-style router (GLM-4.5's, dots.llm1's): n_routed_experts
    scored by sigmoid, grouped routing only where it limits nothing, n_shared_experts experts' worth of
    a shared MLP (shared_default: the config class's, None where it has none), the first
    first_k_dense_replace layers dense."""
    groups, kept = r.get("n_group", 1), r.get("topk_group", 1)
    if not (isinstance(groups, int) and isinstance(kept, int) and 1 <= groups <= kept):
        # every group kept is no limit; DeepSeek-V3's 8 groups of which 4 are kept are one
        r.refuse(f"n_group={groups!r} with topk_group={kept!r} (experts chosen within the best groups)")
    layers, dense = r.need("num_hidden_layers"), r.get("first_k_dense_replace", 1)
    shared = r.get("n_shared_experts", shared_default) if shared_default is not None else r.need("n_shared_experts")
    if not isinstance(dense, int) or dense < 0 or not isinstance(shared, int) or shared < 0:
        r.refuse(f"first_k_dense_replace={dense!r} / n_shared_experts={shared!r}")
    fields = read_experts(r, count_key="n_routed_experts")
    scale = r.get("routed_scaling_factor", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        r.refuse(f"routed_scaling_factor={scale!r}")
    return dict(fields, shared_expert_intermediate_size=shared * fields["moe_intermediate_size"],
                dense_mlp_layers=list(range(min(dense, layers))) or None, expert_scoring="sigmoid",
                routed_scaling_factor=float(scale))


def _glm4_moe(hf, r):
    return dict(read_sigmoid_experts(r, shared_default=1), hidden_act=r.activation("hidden_act", {"silu": "silu"}),
                attention_bias=bool(r.get("attention_bias", False)), use_qk_norm=bool(r.get("use_qk_norm", False)))


def _draft_layers(config):
    """Whether a tensor name is of a layer past the model's last: the release's multi-token-prediction
    layers."""
    def unread(name):
        m = _LAYER.match(name)
        return bool(m) and int(m.group(1)) >= config.num_hidden_layers
    return unread


SIGMOID_VIEWS = (without_empty_shared(SIGMOID_LAYOUT), stacked_experts(SIGMOID_LAYOUT))
# llama.cpp names the pre-MLP norm post_attention_norm in GLM-4.5's GGUF files
GLM4_MOE = Family("glm4_moe", ("Glm4MoeForCausalLM",), ("glm4_moe", "glm4v_moe_text"), _glm4_moe, qk_norm="head", experts=SIGMOID_LAYOUT,
                  gguf_arch="glm4moe", gguf_names={"post_attention_norm": "post_attention_layernorm"},
                  checkpoint_views=(lambda tensors, config: Without(tensors, _draft_layers(config)), *SIGMOID_VIEWS),
                  config_defaults={"partial_rotary_factor": 0.5, "norm_topk_prob": True})
