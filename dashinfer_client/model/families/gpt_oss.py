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

FusedExperts shows them under experts.py's per-expert names ([out, in] weights, as the other
families store them); MXFP4 ones as {name}.mxfp4_blocks [out, in / 2] and {name}.mxfp4_scales
[out, in / 32], which the serialized model keeps as they are (ModelConfig.mxfp4_experts).
"""
import re

import numpy as np

from ..safetensors_io import drop_mapped_pages
from .base import Family
from .experts import ExpertLayout, read_experts

MXFP4_PARTS = ("mxfp4_blocks", "mxfp4_scales")  # the stored parts of an MXFP4 weight
SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}  # native/glu.h's constants
_FUSED = re.compile(r"^(?P<layer>model\.layers\.\d+\.)mlp\.experts\.(?P<proj>gate_up|down)_proj"
                    r"(?P<part>|_bias|_blocks|_scales)$")


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


def split_interleaved_gate_up(t: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """gpt-oss's gate_up_proj alternates gate and up rows along `axis` (its MXFP4 *_blocks and
    *_scales, float weight and bias alike; transformers reads gate_up[..., ::2] and [..., 1::2])
    -> (gate rows, up rows), stored as every family's gate and up experts are, packed gate then up
    as linear_glu / glu_mul take them. Views, no copy."""
    if t.shape[axis] % 2:
        raise ValueError(f"gate_up has {t.shape[axis]} rows along axis {axis}: not gate and up pairs")
    every = [slice(None)] * t.ndim
    every[axis] = slice(0, None, 2)
    gate = t[tuple(every)]
    every[axis] = slice(1, None, 2)
    return gate, t[tuple(every)]


class FusedExperts:
    """A gpt-oss checkpoint's tensors (tensors: keys(), in, shape(name), fetch(name) -> (array,
    dtype code)) under the names weight_shapes gives; the rest pass through unchanged."""

    def __init__(self, tensors):
        self.tensors = tensors
        self.layout = GPT_OSS.experts
        self.views = {}  # our name -> (checkpoint name, expert, which rows: "gate" | "up" | None)
        for name in tensors.keys():
            m = _FUSED.match(name)
            if not m:
                self.views[name] = (name, None, None)
                continue
            part = {"": ".weight", "_bias": ".bias", "_blocks": ".weight." + MXFP4_PARTS[0],
                    "_scales": ".weight." + MXFP4_PARTS[1]}[m["part"]]
            roles = ("gate", "up") if m["proj"] == "gate_up" else ("down",)
            for e in range(tensors.shape(name)[0]):
                for role in roles:
                    ours = self.layout.expert(m["layer"], e, role) + part
                    self.views[ours] = (name, e, role if m["proj"] == "gate_up" else None)

    def keys(self):
        """Our names; an MXFP4 weight under its plain name too (what weight_shapes lists)."""
        blocks = "." + MXFP4_PARTS[0]
        return [n.removesuffix(blocks) for n in self.views if not n.endswith(MXFP4_PARTS[1])]

    def __contains__(self, name):
        return name in self.views or name + "." + MXFP4_PARTS[0] in self.views

    def shape(self, name):
        """Our shape; an MXFP4 weight's plain name gives the [out, in] it dequantizes to."""
        if name not in self.views:
            blocks = self.shape(name + "." + MXFP4_PARTS[0])
            return blocks[0], blocks[1] * 2
        source, e, rows = self.views[name]
        shape = self.tensors.shape(source)
        if e is None:
            return tuple(shape)
        shape = shape[1:]
        if name.endswith(".weight") and len(shape) == 2:  # a float weight, stored [in, out]
            shape = shape[::-1]
        if rows:
            shape = (shape[0] // 2,) + tuple(shape[1:])
        if name.endswith(MXFP4_PARTS[0]):
            shape = (shape[0], shape[1] * shape[2])
        return tuple(shape)

    def fetch(self, name):
        source, e, rows = self.views[name]
        stored = name.endswith(MXFP4_PARTS)
        array, code = self.tensors.fetch(source, *((("U8",),) if stored else ()))
        if e is None:
            return array, code
        t = array[e]
        if name.endswith(".weight"):
            t = t.T  # [in, out] -> [out, in]
        if rows:
            t = split_interleaved_gate_up(t)[0 if rows == "gate" else 1]
        if name.endswith(MXFP4_PARTS[0]):
            t = t.reshape(t.shape[0], -1)
        # a copy, then the whole fused tensor's pages dropped: the kernel maps pages well beyond
        # the slice read (fault-around on large folios), so dropping the slice alone leaves them
        out = np.array(t, order="C", copy=True)
        drop_mapped_pages(array)
        return out, code


GPT_OSS = Family("gpt_oss", ("GptOssForCausalLM",), ("gpt_oss",), _gpt_oss, sinks=True,
                 experts=ExpertLayout(router="router", biases=True), checkpoint_view=FusedExperts,
                 stored_quant="mxfp4")
