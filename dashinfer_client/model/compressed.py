"""compressed-tensors checkpoints (llm-compressor's releases, quant_method "compressed-tensors"): the
config's groups, checked, and the pack-quantized int weights, dequantized at conversion.

A config group is float-quantized FP8 (fp8.py reads those weights) or pack-quantized int of 4 or 8
bits (the W4A16 and W8A16 releases: GPTQ's and round-to-nearest), by channel, group or tensor,
symmetric or with zero points. A pack-quantized weight [N, K] is stored as
    {w}_packed      int32 [N, ceil(K * bits / 32)]: the codes plus 2^(bits - 1), little-endian
    {w}_scale       [N, ceil(K / group_size)] (by group), [N, 1] (by channel) or [1] (by tensor)
    {w}_zero_point  int32 [ceil(N * bits / 32), groups], packed the same way along N (asymmetric only)
    {w}_shape       [N, K]
    {w}_g_idx       [K], each column's group (GPTQ's activation order, in older releases)
weight = (code - zero point) * scale, computed as compressed-tensors does: rounded to the scale's
dtype (a bf16 scale gives bf16 weights at any dtype the model converts to).
"""
import math

import numpy as np

from ..errors import ModelSerializerException
from .dequantized import DequantizedView, in_dtype, is_block, packed_codes
from .fp8 import FP8Weights

PARTS = ("_packed", "_scale", "_zero_point", "_shape", "_g_idx")  # after a weight's name
_ROWS = 256  # rows dequantized at a time


def read_config(q, where):
    """(the block size of the config's block-wise FP8 groups or None, the group sizes of its int
    groups); a group of another format, type, width or strategy, sparse weights and rotations are
    refused by name."""
    refused, blocks, sizes = [], set(), set()
    groups = q.get("config_groups") or {}
    for name, group in groups.items():
        weights, fmt = group.get("weights") or {}, group.get("format") or q.get("format")
        kind, strategy = (fmt, weights.get("type"), weights.get("num_bits")), weights.get("strategy")
        if kind == ("float-quantized", "float", 8) and weights.get("symmetric", True):
            if strategy == "block" and is_block(weights.get("block_structure")):
                blocks.add(tuple(weights["block_structure"]))
            elif strategy == "block":
                refused.append(f"{name}: block_structure={weights.get('block_structure')!r} (two positive integers)")
            elif strategy not in ("tensor", "channel"):
                refused.append(f"{name}: strategy {strategy!r} (tensor, channel and block are)")
        elif kind in (("pack-quantized", "int", 4), ("pack-quantized", "int", 8)):
            if strategy not in ("tensor", "channel", "group"):
                refused.append(f"{name}: strategy {strategy!r} (tensor, channel and group are)")
            if strategy == "group":
                sizes.add(weights.get("group_size"))
        else:
            refused.append(f"{name}: format {fmt!r}, weights {weights.get('type')!r} of {weights.get('num_bits')} bits"
                           f"{'' if weights.get('symmetric', True) else ', asymmetric'} (float-quantized FP8, "
                           "symmetric, and pack-quantized int of 4 or 8 bits are)")
    if not groups:
        refused.append("no config_groups")
    if len(blocks) > 1:
        refused.append(f"blocks of several sizes {sorted(blocks)}")
    for key, what in (("sparsity_config", "sparse weights"), ("transform_config", "rotated weights")):
        if q.get(key):
            refused.append(f"{key} ({what})")
    if refused:
        raise ModelSerializerException(f"{where}: compressed-tensors checkpoint with {'; '.join(refused)} "
                                       "is not supported")
    return (blocks.pop() if blocks else None), sizes


def release_format(q):
    """The InstantQuant format of the release's width: uint4 for int4 groups, int8 where any group
    is 8 bits wide; None where any is FP8 (it converts exactly to the float dtype)."""
    weights = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values()]
    if not weights or any(w.get("type") != "int" for w in weights):
        return None
    return "int8" if any(w.get("num_bits") == 8 for w in weights) else "uint4"


def view(tensors, settings, where):
    """The checkpoint's tensors with its packed int and its FP8 weights dequantized, as
    compressed-tensors computes them (settings: read_config's)."""
    block, group_sizes = settings
    return FP8Weights(PackedIntWeights(tensors, where, group_sizes), block, where, in_scale_dtype=True)


def unpack(words, bits, count) -> np.ndarray:
    """The signed codes [rows, count] of int32 words [rows, n] packed little-endian, each code plus
    2^(bits - 1)."""
    return packed_codes(words, bits)[:, :count].astype(np.int16) - (1 << (bits - 1))


class PackedIntWeights(DequantizedView):
    """A checkpoint's tensors with each pack-quantized weight shown as {w} (float32, dequantized when
    fetched) and its parts hidden."""

    def __init__(self, tensors, where, group_sizes=()):
        super().__init__(tensors, where)
        self.group_sizes = group_sizes
        names = set(tensors.keys())
        for name in sorted(n for n in names if n.endswith(".weight_packed")):
            weight = name.removesuffix("_packed")
            missing = [weight + p for p in ("_scale", "_shape") if weight + p not in names]
            if missing:
                raise ModelSerializerException(f"{where}: pack-quantized '{name}' has no {', '.join(missing)}")
            shape = tuple(int(d) for d in np.asarray(tensors.fetch(weight + "_shape", ("I64", "I32"))[0]))
            if len(shape) != 2:
                raise ModelSerializerException(f"{where}: '{weight}_shape' is {list(shape)}: only 2-D weights are "
                                               "supported (not experts stacked in one tensor)")
            self.shown[weight] = shape
            self._bits(weight)  # refuses a width other than 4 or 8 bits now, not when converting
        self.hidden = {w + p for w in self.shown for p in PARTS}

    def _bits(self, weight) -> int:
        (n, k), words = self.shown[weight], self.tensors.shape(weight + "_packed")
        for bits in (4, 8):
            if tuple(words) == (n, math.ceil(k * bits / 32)):
                return bits
        raise ModelSerializerException(f"{self.where}: '{weight}_packed' is {list(words)}, which packs [{n}, {k}] "
                                       "in neither 4 nor 8 bits")

    def _group_size(self, k, groups) -> int:
        """Columns a group: the config's group size that gives `groups` groups of k columns."""
        if groups == 1:
            return k
        sizes = [g for g in self.group_sizes if isinstance(g, int) and g > 0 and math.ceil(k / g) == groups]
        return sizes[0] if sizes else math.ceil(k / groups)

    def dequantize(self, name):
        (n, k), bits = self.shown[name], self._bits(name)
        scale, scale_code = self.scales(name + "_scale")
        scale = np.broadcast_to(scale.reshape(-1, 1) if scale.ndim < 2 else scale, (n, scale.shape[-1]))
        groups = scale.shape[1]
        zero = np.zeros((n, groups), np.int16)
        if name + "_zero_point" in self.tensors:
            zero = np.asarray(self.tensors.fetch(name + "_zero_point", ("I32", "I8"))[0])
            zero = unpack(zero.T, bits, n).T if zero.shape != (n, groups) else zero.astype(np.int16)
        group_of = (np.asarray(self.tensors.fetch(name + "_g_idx", ("I32", "I64"))[0]).astype(np.int64)
                    if name + "_g_idx" in self.tensors else np.arange(k) // self._group_size(k, groups))
        if zero.shape != (n, groups) or group_of.shape != (k,) or not 0 <= group_of.min() <= group_of.max() < groups:
            raise ModelSerializerException(f"{self.where}: the zero points or groups of '{name}' do not match its "
                                           f"[{n}, {groups}] scales")
        words = self.tensors.fetch(name + "_packed", ("I32",))[0]
        out = np.empty((n, k), np.float32)
        for begin in range(0, n, _ROWS):
            rows = slice(begin, begin + _ROWS)
            out[rows] = (unpack(words[rows], bits, k) - zero[rows][:, group_of]) * scale[rows][:, group_of]
        return in_dtype(out, scale_code)
