"""A layer's experts stored fused, one tensor per projection, shown under experts.py's per-expert
names ([out, in] weights, one tensor per expert), so that conversion reads them one expert at a time.

transformers 5 holds every MoE family's experts so (and saves state_dicts so):
    mlp.experts.gate_up_proj   [E, 2 * inter, hidden]  gate rows, then up rows
    mlp.experts.down_proj      [E, hidden, inter]
with the router at mlp.gate (Mixtral's checkpoints say block_sparse_moe instead of mlp). gpt-oss's
checkpoints store them transposed ([E, in, out]) with gate and up alternating, with biases, and in
its released files as MXFP4 *_blocks / *_scales (families/gpt_oss.py). Tensors of any other name
pass through, so a checkpoint with one tensor per expert reads as it is.
"""
import re

import numpy as np

from ...errors import ModelSerializerException
from ..safetensors_io import drop_mapped_pages

MXFP4_PARTS = ("mxfp4_blocks", "mxfp4_scales")  # the stored parts of an MXFP4 weight
_FUSED = re.compile(r"^(?P<layer>model\.layers\.\d+\.)mlp\.experts\.(?P<proj>gate_up|down)_proj"
                    r"(?P<part>|_bias|_blocks|_scales)$")
_PART = {"": ".weight", "_bias": ".bias", "_blocks": ".weight." + MXFP4_PARTS[0],
         "_scales": ".weight." + MXFP4_PARTS[1]}


def holds_mxfp4(names) -> bool:
    """Whether a checkpoint's fused experts are MXFP4 blocks rather than floats: the tensors say it,
    not quantization_config (a dequantized save may keep the release's config.json); a checkpoint
    holding both is refused."""
    parts = {m["part"] for m in map(_FUSED.match, names) if m and m["part"] in ("", "_blocks")}
    if len(parts) > 1:
        raise ModelSerializerException("the checkpoint holds both float and MXFP4 (*_blocks) experts")
    return parts == {"_blocks"}


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


def split_halves(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers 5's gate_up_proj: the gate's rows, then the up's (its forward chunks in two)."""
    half = t.shape[0] // 2
    return t[:half], t[half:]


class FusedExperts:
    """A checkpoint's tensors (tensors: keys(), in, shape(name), fetch(name) -> (array, dtype
    code)) under the names weight_shapes gives for `layout` (an ExpertLayout). interleaved: gate
    and up rows alternate (gpt-oss) rather than come in halves; transposed: float weights are
    stored [in, out]."""

    def __init__(self, tensors, layout, interleaved=False, transposed=False, config=None):
        self.tensors = tensors
        self.split = split_interleaved_gate_up if interleaved else split_halves
        self.views = {}  # our name -> (checkpoint name, expert, which rows: "gate" | "up" | None)
        self.transposed = set()  # the fused tensors stored [E, in, out]
        fused_layers = set()
        for name in tensors.keys():
            m = _FUSED.match(name)
            if not m:
                self.views[name] = (name, None, None)
                continue
            if transposed or (config is not None and m["part"] == "" and _stored_in_out(tensors.shape(name), m["proj"],
                                                                                        config)):
                self.transposed.add(name)
            fused_layers.add(m["layer"])
            roles = ("gate", "up") if m["proj"] == "gate_up" else ("down",)
            for e in range(tensors.shape(name)[0]):
                for role in roles:
                    ours = layout.expert(m["layer"], e, role) + _PART[m["part"]]
                    self.views[ours] = (name, e, role if m["proj"] == "gate_up" else None)
        for layer in fused_layers:  # transformers 5 names Mixtral's block (block_sparse_moe) mlp too
            router, ours = f"{layer}mlp.{layout.router}", layout.router_name(layer)
            for suffix in (".weight", ".bias"):
                if router != ours and router + suffix in self.views:
                    self.views[ours + suffix] = self.views.pop(router + suffix)

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
        if source in self.transposed and name.endswith(".weight") and len(shape) == 2:
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
        if source in self.transposed and name.endswith(".weight"):
            t = t.T  # [in, out] -> [out, in]
        if rows:
            t = self.split(t)[0 if rows == "gate" else 1]
        if name.endswith(MXFP4_PARTS[0]):
            t = t.reshape(t.shape[0], -1)
        # a copy, then the whole fused tensor's pages dropped: the kernel maps pages well beyond
        # the slice read (fault-around on large folios), so dropping the slice alone leaves them
        out = np.array(t, order="C", copy=True)
        drop_mapped_pages(array)
        return out, code


def stacked_experts(layout):
    """The checkpoint view of a family whose experts transformers 5 stacks (gate and up in halves),
    either way round: Qwen3-VL-MoE's releases store them [E, in, out], which transformers transposes
    where the shape says so (its Transpose(check_dims))."""
    return lambda tensors, config: FusedExperts(tensors, layout, config=config)


def _stored_in_out(shape, proj, config):
    """Whether a fused stack [E, a, b] is [E, in, out]: its shape is that and not [E, out, in]."""
    inter, hidden = config.moe_intermediate_size, config.hidden_size
    out_in = (2 * inter, hidden) if proj == "gate_up" else (hidden, inter)
    return tuple(shape[1:]) != out_in and tuple(shape[1:]) == out_in[::-1]
