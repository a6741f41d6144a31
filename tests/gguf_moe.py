"""A tiny HF mixture-of-experts checkpoint's expert tensors and metadata as llama.cpp's converter
(convert_hf_to_gguf.py: Qwen2MoeModel, Qwen3MoeModel, LlamaModel for Mixtral, OlmoeModel,
Glm4MoeModel, MiniMaxM2Model, Ernie4_5MoeModel, GraniteMoeModel) writes them: each projection of a layer's experts stacked into one [experts, out, in]
tensor (ffn_gate_exps / ffn_up_exps / ffn_down_exps), the router as ffn_gate_inp, the shared
expert as ffn_*_shexp and Qwen2-MoE's gate of it as ffn_gate_inp_shexp, the counts under
{arch}.expert_*; GLM-4.5's and MiniMax-M2's router (sigmoid gating, its scale and norm, the choice
bias as exp_probs_b.bias) and the multi-token-prediction layer its releases carry after the last
(nextn_predict_layers: a copy of the last layer plus nextn.* tensors, which llama.cpp's converter
keeps). tests/gguf_builders.py build_tiny_gguf calls it for a checkpoint with experts."""
import re

import numpy as np

GGUF_ARCH = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama", "olmoe": "olmoe", "glm4_moe": "glm4moe",
             "minimax_m2": "minimax-m2", "ernie4_5_moe": "ernie4_5-moe", "granitemoe": "granitemoe"}
DRAFT_LAYERS = {"glm4_moe": 1}  # the multi-token-prediction layers each one's GGUF carries
_PROJ = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
# Granite 3 MoE's stacks (GraniteMoeModel splits input_linear into the gate's and up's halves)
_GRANITE_STACKS = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.(input_linear|output_linear|router\.layer)\.weight$")
_ROUTER = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.gate\.weight$")
_SHARED = re.compile(r"^model\.layers\.(\d+)\.mlp\.shared_experts?\.(\w+)_proj\.weight$")
_CHOICE_BIAS = re.compile(r"^model\.layers\.(\d+)\.(?:mlp\.gate|block_sparse_moe|mlp\.moe_statics)\.e_score_correction_bias$")
_SHARED_GATE = re.compile(r"^model\.layers\.(\d+)\.mlp\.shared_expert_gate\.weight$")


def write_experts(writer, cfg, tensors):
    """Write the expert metadata of config.json dict cfg; returns tensors with the MoE ones replaced
    by their GGUF names (blk.*), the others untouched."""
    import gguf
    writer.add_expert_count(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
                            or cfg["moe_num_experts"])
    writer.add_expert_used_count(cfg.get("num_experts_per_tok") or cfg["moe_k"])
    if cfg.get("moe_intermediate_size") or cfg["model_type"] == "minimax_m2":
        writer.add_expert_feed_forward_length(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    if cfg["model_type"] == "minimax_m2":  # its converter writes the gating from scoring_func
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if cfg.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if cfg["model_type"] == "ernie4_5_moe":  # Ernie4_5MoeModel's keys, its shared width as it computes it
        writer.add_expert_shared_count(cfg["moe_num_shared_experts"])
        writer.add_expert_shared_feed_forward_length(cfg["intermediate_size"] // cfg["num_key_value_heads"])
        writer.add_leading_dense_block_count(cfg["moe_layer_start_index"])
        writer.add_interleave_moe_layer_step(cfg["moe_layer_interval"])
    if cfg["model_type"] == "glm4_moe":
        writer.add_expert_shared_count(cfg["n_shared_experts"])
        writer.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        writer.add_expert_weights_scale(cfg["routed_scaling_factor"])
        writer.add_expert_weights_norm(cfg["norm_topk_prob"])
        writer.add_nextn_predict_layers(DRAFT_LAYERS["glm4_moe"])
    out, stacks = {}, {}
    for name, w in tensors.items():
        if m := _EXPERT.match(name):
            stacks.setdefault((m.group(1), _PROJ[m.group(3)]), {})[int(m.group(2))] = w
        elif m := _ROUTER.match(name):
            out[f"blk.{m.group(1)}.ffn_gate_inp.weight"] = w
        elif m := _SHARED.match(name):
            out[f"blk.{m.group(1)}.ffn_{m.group(2)}_shexp.weight"] = w
        elif m := _SHARED_GATE.match(name):
            out[f"blk.{m.group(1)}.ffn_gate_inp_shexp.weight"] = w
        elif m := _CHOICE_BIAS.match(name):
            out[f"blk.{m.group(1)}.exp_probs_b.bias"] = w
        elif m := _GRANITE_STACKS.match(name):
            layer = m.group(1)
            if m.group(2) == "input_linear":
                half = w.shape[1] // 2
                out[f"blk.{layer}.ffn_gate_exps.weight"], out[f"blk.{layer}.ffn_up_exps.weight"] = w[:, :half], w[:, half:]
            else:
                out[f"blk.{layer}.{'ffn_down_exps' if m.group(2) == 'output_linear' else 'ffn_gate_inp'}.weight"] = w
        else:
            out[name] = w
    for (layer, proj), experts in stacks.items():
        out[f"blk.{layer}.ffn_{proj}_exps.weight"] = np.stack([experts[e] for e in sorted(experts)])
    return out


def draft_layers(cfg, gguf_tensors):
    """The multi-token-prediction layers after the last, as GLM-4.5's GGUF files hold them: the last
    layer's tensors again under the next index, plus its nextn.* ones (random: nothing reads them)."""
    last, hidden = cfg["num_hidden_layers"] - 1, cfg["hidden_size"]
    rng = np.random.default_rng(0)
    out = {}
    for d in range(1, DRAFT_LAYERS.get(cfg["model_type"], 0) + 1):
        out.update({n.replace(f"blk.{last}.", f"blk.{last + d}.", 1): w for n, w in gguf_tensors.items()
                    if n.startswith(f"blk.{last}.")})
        out[f"blk.{last + d}.nextn.eh_proj.weight"] = rng.standard_normal((hidden, 2 * hidden)).astype(np.float32)
        for norm in ("enorm", "hnorm", "shared_head_norm"):
            out[f"blk.{last + d}.nextn.{norm}.weight"] = np.ones(hidden, np.float32)
    return out
