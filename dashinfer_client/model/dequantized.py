"""What the readers of checkpoints quantized as released share (fp8.py, compressed.py, awq.py): a
view over a checkpoint's tensors that shows each quantized weight as the float32 weight it
dequantizes to, when conversion fetches it, with its parts hidden; the scales read as float32; the
product rounded to the scales' dtype where the format's own library computes in it."""
import numpy as np

from ..dtypes import from_bf16, to_bf16

SCALE_CODES = ("F32", "BF16", "F16")


class DequantizedView:
    """A checkpoint's tensors (HFWeights: keys, in, shape, code, fetch) as keys, in, shape, code and
    fetch show them. A subclass fills `shown` (weight name -> [N, K]) and `hidden` (the parts) and
    writes dequantize(name) -> float32 [N, K]."""

    def __init__(self, tensors, where):
        self.tensors, self.where = tensors, where
        self.shown, self.hidden = {}, set()

    def keys(self):
        return [n for n in self.tensors.keys() if n not in self.hidden and n not in self.shown] + list(self.shown)

    def __contains__(self, name):
        return name in self.shown or (name in self.tensors and name not in self.hidden)

    def shape(self, name):
        return self.shown[name] if name in self.shown else self.tensors.shape(name)

    def code(self, name):
        return "F32" if name in self.shown else self.tensors.code(name)

    def fetch(self, name, *codes):
        """(array, dtype code): a quantized weight dequantized, float32."""
        if name not in self.shown:
            return self.tensors.fetch(name, *codes)
        return self.dequantize(name), "F32"

    def dequantize(self, name) -> np.ndarray:
        raise NotImplementedError

    def scales(self, name):
        """(the float32 scales, their dtype code) of tensor `name`."""
        scale, code = self.tensors.fetch(name, SCALE_CODES)
        return (from_bf16(scale) if code == "BF16" else np.asarray(scale, np.float32)), code


def packed_codes(words, bits) -> np.ndarray:
    """The unsigned codes [rows, n * 32 / bits] (uint8) of int32 words [rows, n] that pack 4- or
    8-bit codes little-endian from bit 0 (compressed-tensors' and AutoAWQ's packing)."""
    data = np.ascontiguousarray(words, dtype="<i4").view(np.uint8)
    if bits == 8:
        return data
    codes = np.empty((data.shape[0], data.shape[1] * 2), np.uint8)
    codes[:, 0::2], codes[:, 1::2] = data & 15, data >> 4
    return codes


def in_dtype(weight, code) -> np.ndarray:
    """weight (float32) rounded to dtype `code` (BF16, F16; F32 as it is)."""
    if code == "BF16":
        return from_bf16(to_bf16(weight))
    if code == "F16":
        return weight.astype(np.float16).astype(np.float32)
    return weight


def is_block(block) -> bool:
    """Two positive integers, a block's rows and columns."""
    return (isinstance(block, (list, tuple)) and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block))
