"""llama.cpp's mixture-of-experts layout in a GGUF file, mapped onto the family's HF names.

llama.cpp's converter (convert_hf_to_gguf.py) stacks each projection of a layer's experts into one
3-D tensor, numpy shape [experts, out, in] (GGUF dims reversed): blk.{i}.ffn_gate_exps,
ffn_up_exps, ffn_down_exps. The router is blk.{i}.ffn_gate_inp [experts, hidden]; Qwen2-MoE's
shared expert is ffn_gate_shexp / ffn_up_shexp / ffn_down_shexp and its sigmoid gate
ffn_gate_inp_shexp ([hidden], or [1, hidden]). GGUF architectures: qwen3moe, qwen2moe, olmoe,
llama with {arch}.expert_count set (Mixtral), glm4moe (GLM-4.5: DeepSeek-V3's router, below),
minimax-m2 (the same router, always renormalised, without a shared expert) and ernie4_5-moe (the
softmax, always renormalised, with a choice bias). A shared expert's width is its tensors' rows.
The counts are metadata: {arch}.expert_count, expert_used_count, expert_feed_forward_length
(Mixtral: feed_forward_length), expert_shared_feed_forward_length (or, GLM-4.5's,
expert_shared_count experts' worth of rows). A layer without a router keeps a dense MLP
(ffn_gate/up/down).

glm4moe's and minimax-m2's router, as llama.cpp reads it: {arch}.expert_gating_func (GLM-4.5:
sigmoid where unset),
expert_weights_scale, expert_weights_norm, and the choice bias blk.{i}.exp_probs_b.bias. The other
architectures' llama.cpp routers are the softmax: a file saying otherwise for them, grouped routing,
fused gate_up experts are refused by key or tensor name.
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
NORM_TOPK_BY_ARCH = {"qwen3moe": True, "llama": True, "qwen2moe": False, "olmoe": False, "glm4moe": False}
SOFTMAX_GATING = 1  # gguf.ExpertGatingFuncType.SOFTMAX
SCORING = {1: "softmax", 2: "sigmoid"}  # gguf.ExpertGatingFuncType
# the architectures whose llama.cpp router reads the gating function, its scale and a choice bias
# (their default gating where the file names none; None: llama.cpp needs the key)
SIGMOID_ROUTERS = {"glm4moe": 2, "minimax-m2": None}
# llama.cpp renormalises these whatever the key says (Granite 3 MoE: the softmax of the top k logits)
FIXED_NORM = {"minimax-m2": True, "ernie4_5-moe": True, "granitemoe": True}
CHOICE_BIAS = "exp_probs_b"
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
    router = _router_fields(meta, a, names, path, gguf_family(a, meta).experts)
    inter_key = f"{a}.expert_feed_forward_length" if meta.get(f"{a}.expert_feed_forward_length") \
        else f"{a}.feed_forward_length"
    shexp = next((t for n, t in names.items() if n.endswith(".ffn_up_shexp.weight")), None)
    # its rows (numpy shape [rows, hidden]): ERNIE's converter writes intermediate_size / kv heads as
    # the key, equal to them only by its models' shapes
    shared = int(shexp.shape[-1]) if shexp is not None else 0
    said = meta.get(f"{a}.expert_shared_feed_forward_length") or meta.get(f"{a}.expert_shared_count")
    if said and not shared:
        raise ModelSerializerException(
            f"GGUF file {path}: its metadata gives a shared expert ({a}.expert_shared_feed_forward_length / "
            "expert_shared_count) but no layer has its ffn_*_shexp tensors")
    norm = FIXED_NORM[a] if a in FIXED_NORM else meta.get(f"{a}.expert_weights_norm", NORM_TOPK_BY_ARCH.get(a))
    if norm is None:
        raise ModelSerializerException(f"GGUF file {path}: {a} experts without {a}.expert_weights_norm")
    dense = [i for i in range(layers) if i not in sparse]
    return dict(num_experts=meta.count(f"{a}.expert_count"), num_experts_per_tok=meta.count(f"{a}.expert_used_count"),
                moe_intermediate_size=meta.count(inter_key), norm_topk_prob=bool(norm),
                shared_expert_intermediate_size=shared, dense_mlp_layers=dense or None, **router)


def _router_fields(meta, a, names, path, layout):
    """expert_scoring and routed_scaling_factor of the file's router; what llama.cpp does not read
    for architecture a, or this runtime does not compute, refused by key or tensor name."""
    fused = [n for n in names if n.split(".")[2:3] == ["ffn_gate_up_exps"]]
    if fused:
        raise ModelSerializerException(f"GGUF file {path}: expert tensor {fused[0]} (fused gate_up experts) is an "
                                       "expert layout this loader does not know")
    for key in ("expert_group_count", "expert_group_used_count"):
        value = meta.get(f"{a}.{key}", 1)
        if value not in (1, 0):  # llama.cpp reads 0 as unset
            raise ModelSerializerException(f"GGUF file {path}: {a}.{key} = {value!r}, a router or expert "
                                           "layout this runtime does not compute")
    if a in SIGMOID_ROUTERS:
        gating = meta.get(f"{a}.expert_gating_func") or SIGMOID_ROUTERS[a]  # 0: unset
        if gating is None:
            raise ModelSerializerException(f"GGUF file {path} lacks the metadata key '{a}.expert_gating_func'")
        if gating not in SCORING:
            raise ModelSerializerException(f"GGUF file {path}: {a}.expert_gating_func {gating!r} is neither "
                                           "softmax (1) nor sigmoid (2)")
        scale = meta.real(f"{a}.expert_weights_scale", 1.0) or 1.0
        if scale < 0:
            raise ModelSerializerException(f"GGUF file {path}: {a}.expert_weights_scale = {scale!r}")
        return dict(expert_scoring=SCORING[gating], routed_scaling_factor=scale)
    biased = [n for n in names if f".{CHOICE_BIAS}." in n]
    if biased and not layout.choice_bias:
        raise ModelSerializerException(f"GGUF file {path}: expert tensor {biased[0]} (a router bias) is an "
                                       f"expert layout this loader does not know for {a}")
    gating = meta.get(f"{a}.expert_gating_func", SOFTMAX_GATING)
    if gating != SOFTMAX_GATING:
        raise ModelSerializerException(f"GGUF file {path}: {a}.expert_gating_func {gating!r} is not softmax "
                                       f"({SOFTMAX_GATING}): a router this runtime does not compute")
    scale = meta.get(f"{a}.expert_weights_scale", 1.0)
    if scale not in (1.0, 0):
        raise ModelSerializerException(f"GGUF file {path}: {a}.expert_weights_scale = {scale!r}, a router or "
                                       "expert layout this runtime does not compute")
    return {}


def expert_entries(layer, part, kind, family, config):
    """[(HF name, expert index or None)] of GGUF tensor blk.{layer}.{part}.{kind} when it is a
    router, its choice bias, stacked experts or the shared expert's; None otherwise."""
    layout = family.experts
    if layout is None:
        return None
    prefix = f"model.layers.{layer}."
    if part == CHOICE_BIAS and kind == "bias" and layout.choice_bias:
        return [(layout.choice_bias_name(prefix), None)]
    if kind != "weight":
        return None
    if part in STACKED:
        return [(layout.expert(prefix, e, STACKED[part]) + ".weight", e) for e in range(config.num_experts)]
    if part == ROUTER:
        return [(layout.router_name(prefix) + ".weight", None)]
    if part in SHARED:
        return [(layout.shared_name(prefix, SHARED[part]) + ".weight", None)]
    return None
