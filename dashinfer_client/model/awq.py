"""AutoAWQ's GEMM checkpoints (quant_method "awq", as Qwen's *-AWQ releases are): 4-bit weights,
dequantized at conversion.

config.json says quantization_config {"quant_method": "awq", "bits": 4, "group_size": G,
"zero_point": true, "version": "gemm"}. A quantized linear weight [N, K] (module m) is stored
transposed and packed along N, eight codes (0..15) to an int32, in AWQ's interleaved order (the
word's nibble j holds column `8 * word + ORDER[j]`):
    m.qweight  int32 [K, N / 8]
    m.qzeros   int32 [K / G, N / 8]  packed alike (without zero_point: 8 for every group)
    m.scales   [K / G, N]            (fp16 as released)
weight[n, k] = (code - zero) * scale of k's group, rounded to the scales' dtype as
compressed-tensors computes it after its AutoAWQ converter (the tests' reference).
"""
import math

import numpy as np

from ..errors import ModelSerializerException
from .dequantized import DequantizedView, in_dtype, packed_codes

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the column (of 8) each nibble of a word holds
PARTS = (".qweight", ".qzeros", ".scales")
_ROWS = 512  # input columns (qweight rows) dequantized at a time


def read_config(q, where):
    """(group size, zero points stored) of an AWQ config; what is not AutoAWQ's GEMM layout in 4
    bits is refused by name."""
    refused = []
    if q.get("bits", 4) != 4:
        refused.append(f"bits={q.get('bits')!r} (only 4 is)")
    if str(q.get("version", "gemm")).lower() != "gemm":
        refused.append(f"version={q.get('version')!r} (only AutoAWQ's 'gemm' layout is)")
    group = q.get("group_size", 128)
    if not (isinstance(group, int) and not isinstance(group, bool) and (group > 0 or group == -1)):
        refused.append(f"group_size={group!r}")
    if refused:
        raise ModelSerializerException(f"{where}: awq checkpoint with {'; '.join(refused)} is not supported")
    return group, bool(q.get("zero_point", True))


def release_format(q):
    """The InstantQuant format of the release's width: AWQ is 4 bits."""
    return "uint4"


def view(tensors, settings, where):
    """The checkpoint's tensors with its AWQ modules' weights dequantized (settings: read_config's)."""
    return AWQWeights(tensors, where, *settings)


def unpack(words) -> np.ndarray:
    """The codes [rows, 8 * n] (uint8, 0..15) of int32 words [rows, n] in AWQ's order."""
    nibbles = packed_codes(words, 4)  # nibble j of word w at 8w + j
    codes = np.empty_like(nibbles)
    for j, column in enumerate(ORDER):
        codes[:, column::8] = nibbles[:, j::8]
    return codes


class AWQWeights(DequantizedView):
    """A checkpoint's tensors with each AWQ module's {m}.qweight / qzeros / scales shown as {m}.weight
    [N, K] (float32, dequantized when fetched)."""

    def __init__(self, tensors, where, group_size, zero_point):
        super().__init__(tensors, where)
        self.group_size, self.zero_point = group_size, zero_point
        names = set(tensors.keys())
        for name in sorted(n for n in names if n.endswith(".qweight")):
            module = name.removesuffix(".qweight")
            parts = [module + p for p in (PARTS if zero_point else PARTS[::2])]
            missing = [p for p in parts if p not in names]
            if missing:
                raise ModelSerializerException(f"{where}: AWQ module '{module}' has no {', '.join(missing)}")
            k, words = tensors.shape(name)
            n = 8 * words
            groups = 1 if group_size == -1 else math.ceil(k / group_size)
            want = {module + ".scales": (groups, n), module + ".qzeros": (groups, words)}
            wrong = [f"'{p}' is {list(tensors.shape(p))}, not {list(want[p])}" for p in parts[1:]
                     if tuple(tensors.shape(p)) != want[p]]
            if wrong:
                raise ModelSerializerException(f"{where}: AWQ module '{module}' of qweight [{k}, {words}] in groups "
                                               f"of {group_size}: {'; '.join(wrong)}")
            self.shown[module + ".weight"] = (n, k)
            self.hidden |= set(parts)

    def dequantize(self, name):
        module = name.removesuffix(".weight")
        n, k = self.shown[name]
        group = self.group_size if self.group_size != -1 else k
        scale, scale_code = self.scales(module + ".scales")
        zero = (unpack(self.tensors.fetch(module + ".qzeros", ("I32",))[0]).astype(np.int16) if self.zero_point
                else np.full(scale.shape, 8, np.int16))
        words = self.tensors.fetch(module + ".qweight", ("I32",))[0]
        out = np.empty((n, k), np.float32)
        for begin in range(0, k, _ROWS):
            columns = slice(begin, begin + _ROWS)
            groups = np.arange(begin, min(begin + _ROWS, k)) // group
            out[:, columns] = ((unpack(words[columns]).astype(np.int16) - zero[groups]) * scale[groups]).T
        return in_dtype(out, scale_code)
