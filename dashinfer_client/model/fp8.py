"""FP8 checkpoints, dequantized at conversion: F8_E4M3 weights with float scales, as released.

- block-wise (DeepSeek-V3, Qwen3-*-FP8): quantization_config {"quant_method": "fp8", "fmt": "e4m3",
  "weight_block_size": [rows, cols]}; a weight [N, K] has {weight}_scale_inv of
  [ceil(N / rows), ceil(K / cols)], a dimension's last block shorter where the blocks do not divide it.
- per-tensor (AutoFP8: "quant_method": "fp8" naming no block size): {weight}_scale, one value.
- compressed-tensors' float-quantized (llm-compressor's FP8 and FP8-dynamic releases):
  "quant_method": "compressed-tensors", each config group's weights {"type": "float", "num_bits": 8,
  "strategy": "tensor" | "channel" | "block"}: {weight}_scale of one value, of [N, 1], or of blocks
  ("block_structure").

A scale's shape says which it is: weight = fp8 value * its scale, in float32 as transformers
dequantizes, rounded to the scale's dtype for compressed-tensors' checkpoints, which multiply in it
(bf16 scales: the bf16 weights compressed-tensors and vLLM compute). Which weights are FP8 is what
the tensors say. The scales of activations
and of the KV cache (input_scale, k_scale, v_scale, of static schemes) are not used: nothing here
computes in FP8, the activations stay in the model's dtype.
"""
import math

import numpy as np

from ..errors import ModelSerializerException
from .dequantized import SCALE_CODES, DequantizedView, in_dtype, is_block
from .safetensors_io import drop_mapped_pages

FP8_CODE = "F8_E4M3"
SCALE_SUFFIXES = ("_scale_inv", "_scale")  # the block-wise releases', the others'
UNUSED_SCALES = (".input_scale", ".k_scale", ".v_scale")
DEFAULT_BLOCK = (128, 128)  # transformers' FineGrainedFP8Config's, where config.json names none


def _e4m3_values() -> np.ndarray:
    """float32 of each of the 256 e4m3fn bit patterns: bias 7, subnormals, no infinity, S.1111.111 NaN."""
    bits = np.arange(256)
    exponent, mantissa = (bits >> 3) & 15, bits & 7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    magnitude[(exponent == 15) & (mantissa == 7)] = np.nan
    return np.where(bits & 128, -magnitude, magnitude).astype(np.float32)


E4M3 = _e4m3_values()


def release_format(q):
    """None: an FP8 release converts exactly to the float dtype (int8 would round it again)."""
    return None


def read_config(quantization_config, where):
    """(rows, cols) of the blocks a quant_method "fp8" config's grids of scales cover (None: it names
    none, so every scale must be one a tensor or one a row); what would be computed otherwise is
    refused by name (compressed.py reads compressed-tensors' configs)."""
    q = quantization_config
    refused = [f"{key}={q[key]!r} (only {want!r} is)" for key, want in (("fmt", "e4m3"), ("expert_dtype", "fp8"))
               if q.get(key, want) != want]
    block = q.get("weight_block_size", DEFAULT_BLOCK)
    if block is not None and not is_block(block):
        refused.append(f"weight_block_size={block!r} (two positive integers)")
    if refused:
        raise ModelSerializerException(f"{where}: fp8 checkpoint with {'; '.join(refused)} is not supported")
    return tuple(block) if block is not None else None


def view(tensors, block, where):
    """The checkpoint's tensors with its FP8 weights dequantized (FP8Weights)."""
    return FP8Weights(tensors, block, where)


def dequantize(bits, scale, block, chunk=256):
    """fp8 e4m3 bits [N, K] (uint8) and float32 scales [ceil(N / rows), ceil(K / cols)] -> the
    float32 weight, `chunk` rows at a time."""
    rows, cols = block
    out = np.empty(bits.shape, np.float32)
    scale_of_column = scale[:, np.arange(bits.shape[1]) // cols]  # [row blocks, K]
    for begin in range(0, bits.shape[0], chunk):
        part = out[begin:begin + chunk]
        np.take(E4M3, bits[begin:begin + chunk], out=part)
        part *= scale_of_column[np.arange(begin, begin + len(part)) // rows]
    return out


class FP8Weights(DequantizedView):
    """A checkpoint's tensors with each FP8 weight shown as the float32 weight it dequantizes to,
    its scales and the unused ones hidden; float tensors pass through."""

    def __init__(self, tensors, block, where, in_scale_dtype=False):
        super().__init__(tensors, where)
        self.block, self.in_scale_dtype = block, in_scale_dtype
        names = set(tensors.keys())
        self.scaled = {}  # FP8 weight -> (its scales, the block each scale covers)
        for name in sorted(n for n in names if tensors.code(n) == FP8_CODE):
            scales = [name + s for s in SCALE_SUFFIXES if name + s in names]
            if not scales:
                raise ModelSerializerException(f"{where}: FP8 tensor '{name}' has no '{name}{SCALE_SUFFIXES[0]}' "
                                               f"or '{name}{SCALE_SUFFIXES[1]}' scales")
            if tensors.code(scales[0]) not in SCALE_CODES:
                raise ModelSerializerException(f"{where}: scales '{scales[0]}' are {tensors.code(scales[0])}; "
                                               f"supported are {', '.join(SCALE_CODES)}")
            self.scaled[name] = scales[0], self._block_of(name, scales[0])
            self.shown[name] = tuple(tensors.shape(name))
        self.hidden = {s for s, _ in self.scaled.values()} | {n for n in names if n.endswith(UNUSED_SCALES)}
        for name in sorted(names - self.hidden):
            scaled = next((name.removesuffix(s) for s in SCALE_SUFFIXES if name.endswith(s)), None)
            if scaled is not None and scaled.endswith((".weight", "_proj")):
                raise ModelSerializerException(
                    f"{where}: '{name}' scales no FP8 '.weight' tensor of the checkpoint (FP8 experts stacked in "
                    "one tensor per layer are not supported: the released checkpoints keep one per expert)")

    def _block_of(self, weight, scale):
        """The block one scale of `scale` covers: the whole weight, a row, or the config's block."""
        shape, grid = self.tensors.shape(weight), tuple(self.tensors.shape(scale))
        if len(shape) != 2:
            raise ModelSerializerException(f"{self.where}: FP8 tensor '{weight}' is {list(shape)}: only 2-D FP8 "
                                           "weights are supported (not experts stacked in one tensor)")
        n, k = shape
        if math.prod(grid) == 1:
            return n, k
        if grid in ((n,), (n, 1)):
            return 1, k
        blocks = None if self.block is None else tuple(math.ceil(d / b) for d, b in zip(shape, self.block))
        if grid == blocks:
            return self.block
        raise ModelSerializerException(
            f"{self.where}: '{scale}' is {list(grid)}, but '{weight}' {list(shape)} has one scale, one a row ([{n}, 1])"
            + (f" or, in blocks of {list(self.block)} (the config's block size), a {list(blocks)} grid" if blocks else
               " (the config names no block size)"))

    def dequantize(self, name):
        """The FP8 weight in float32, its source pages dropped."""
        (scale_name, block), (bits, _) = self.scaled[name], self.tensors.fetch(name, (FP8_CODE,))
        scale, scale_code = self.scales(scale_name)
        rows, cols = block
        weight = dequantize(bits, scale.reshape(math.ceil(bits.shape[0] / rows), math.ceil(bits.shape[1] / cols)),
                            block)
        drop_mapped_pages(bits)
        return in_dtype(weight, scale_code) if self.in_scale_dtype else weight
