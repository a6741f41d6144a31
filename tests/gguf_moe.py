"""A tiny HF mixture-of-experts checkpoint's expert tensors and metadata as llama.cpp's converter
(convert_hf_to_gguf.py: Qwen2MoeModel, Qwen3MoeModel, LlamaModel for Mixtral, OlmoeModel) writes
them: each projection of a layer's experts stacked into one [experts, out, in] tensor
(ffn_gate_exps / ffn_up_exps / ffn_down_exps), the router as ffn_gate_inp, Qwen2-MoE's shared
expert as ffn_*_shexp and its gate as ffn_gate_inp_shexp, and the counts under {arch}.expert_*.
tests/gguf_builders.py build_tiny_gguf calls it for a checkpoint with experts."""
import re

import numpy as np

GGUF_ARCH = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama", "olmoe": "olmoe"}
_PROJ = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
_ROUTER = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.gate\.weight$")
_SHARED = re.compile(r"^model\.layers\.(\d+)\.mlp\.shared_expert\.(\w+)_proj\.weight$")
_SHARED_GATE = re.compile(r"^model\.layers\.(\d+)\.mlp\.shared_expert_gate\.weight$")


def write_experts(writer, cfg, tensors):
    """Write the expert metadata of config.json dict cfg; returns tensors with the MoE ones replaced
    by their GGUF names (blk.*), the others untouched."""
    writer.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("moe_intermediate_size"):
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if cfg.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
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
        else:
            out[name] = w
    for (layer, proj), experts in stacks.items():
        out[f"blk.{layer}.ffn_{proj}_exps.weight"] = np.stack([experts[e] for e in sorted(experts)])
    return out
