"""llama.cpp's mixture-of-experts layout in a GGUF file, mapped onto the family's HF names.

llama.cpp's converter (convert_hf_to_gguf.py) stacks each projection of a layer's experts into one
3-D tensor, numpy shape [experts, out, in] (GGUF dims reversed): blk.{i}.ffn_gate_exps,
ffn_up_exps, ffn_down_exps. The router is blk.{i}.ffn_gate_inp [experts, hidden]; Qwen2-MoE's
shared expert is ffn_gate_shexp / ffn_up_shexp / ffn_down_shexp and its sigmoid gate
ffn_gate_inp_shexp ([hidden], or [1, hidden]). GGUF architectures: qwen3moe, qwen2moe, olmoe, and
llama with {arch}.expert_count set (Mixtral). The counts are metadata: {arch}.expert_count,
expert_used_count, expert_feed_forward_length (Mixtral: feed_forward_length),
expert_shared_feed_forward_length. A layer without a router keeps a dense MLP (ffn_gate/up/down).

What llama.cpp can also write and this runtime does not compute (sigmoid or grouped routing,
scaled routing weights, more than one shared expert, fused gate_up experts, a router bias) is
refused by its key or tensor name.
"""
import re

from ..errors import ModelSerializerException
from .families import BY_GGUF
from .families.mixtral import MIXTRAL

STACKED = {"ffn_gate_exps": "gate", "ffn_up_exps": "up", "ffn_down_exps": "down"}
SHARED = {"ffn_gate_shexp": "gate", "ffn_up_shexp": "up", "ffn_down_shexp": "down", "ffn_gate_inp_shexp": "gate_weight"}
ROUTER = "ffn_gate_inp"
# llama.cpp's own choice where the GGUF has no {arch}.expert_weights_norm: it renormalises the
# top-k weights of these architectures (llama: Mixtral) and not of the others
NORM_TOPK_BY_ARCH = {"qwen3moe": True, "llama": True, "qwen2moe": False, "olmoe": False}
SOFTMAX_GATING = 1  # gguf.ExpertGatingFuncType.SOFTMAX
_ROUTER_NAME = re.compile(rf"^blk\.(\d+)\.{ROUTER}\.weight$")


def gguf_family(arch, meta):
    """The family of a GGUF architecture: llama with experts is Mixtral."""
    if arch == "llama" and meta.get("llama.expert_count"):
        return MIXTRAL
    return BY_GGUF.get(arch)


def expert_fields(meta, a, names, layers, path):
    """ModelConfig expert fields of GGUF metadata of architecture a ({} when no layer has a router)."""
    sparse = {int(m.group(1)) for n in names if (m := _ROUTER_NAME.match(n))}
    if not sparse:
        if meta.get(f"{a}.expert_count"):
            raise ModelSerializerException(f"GGUF file {path} sets {a}.expert_count but no layer has a router "
                                           f"({ROUTER}): an expert layout this loader does not know")
        return {}
    refused = [n for n in names if n.split(".")[2:3] == ["ffn_gate_up_exps"] or ".exp_probs_b." in n]
    if refused:
        raise ModelSerializerException(f"GGUF file {path}: expert tensor {refused[0]} (fused gate_up experts or a "
                                       "router bias) is an expert layout this loader does not know")
    gating = meta.get(f"{a}.expert_gating_func", SOFTMAX_GATING)
    if gating != SOFTMAX_GATING:
        raise ModelSerializerException(f"GGUF file {path}: {a}.expert_gating_func {gating!r} is not softmax "
                                       f"({SOFTMAX_GATING}): a router this runtime does not compute")
    for key, neutral in (("expert_weights_scale", 1.0), ("expert_group_count", 1), ("expert_group_used_count", 1)):
        value = meta.get(f"{a}.{key}", neutral)
        if value not in (neutral, 0):  # llama.cpp reads 0 as unset
            raise ModelSerializerException(f"GGUF file {path}: {a}.{key} = {value!r}, a router or expert "
                                           "layout this runtime does not compute")
    key = f"{a}.expert_shared_feed_forward_length"
    shared = meta.count(key) if meta.get(key) is not None else 0
    count = meta.get(f"{a}.expert_shared_count")
    if count not in (None, 0, 1) or bool(shared) != any(".ffn_gate_shexp." in n for n in names):
        raise ModelSerializerException(
            f"GGUF file {path}: {a}.expert_shared_count {count!r}, shared expert size {shared}: one shared "
            "expert with its ffn_*_shexp tensors, or none, is what this runtime computes")
    inter_key = f"{a}.expert_feed_forward_length" if meta.get(f"{a}.expert_feed_forward_length") \
        else f"{a}.feed_forward_length"
    norm = meta.get(f"{a}.expert_weights_norm", NORM_TOPK_BY_ARCH.get(a))
    if norm is None:
        raise ModelSerializerException(f"GGUF file {path}: {a} experts without {a}.expert_weights_norm")
    dense = [i for i in range(layers) if i not in sparse]
    return dict(num_experts=meta.count(f"{a}.expert_count"), num_experts_per_tok=meta.count(f"{a}.expert_used_count"),
                moe_intermediate_size=meta.count(inter_key), norm_topk_prob=bool(norm),
                shared_expert_intermediate_size=shared, dense_mlp_layers=dense or None)


def expert_entries(layer, part, family, config):
    """[(HF name, expert index or None)] of GGUF tensor blk.{layer}.{part}.weight when it is a
    router, stacked experts or the shared expert's; None otherwise."""
    layout = family.experts
    if layout is None:
        return None
    prefix = f"model.layers.{layer}."
    if part in STACKED:
        return [(layout.expert(prefix, e, STACKED[part]) + ".weight", e) for e in range(config.num_experts)]
    if part == ROUTER:
        return [(layout.router_name(prefix) + ".weight", None)]
    if part in SHARED:
        return [(layout.shared_name(prefix, SHARED[part]) + ".weight", None)]
    return None
