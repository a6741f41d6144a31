"""Block-wise FP8 checkpoints (DeepSeek-V3's format, Qwen3-*-FP8's): dequantized at conversion.

config.json says quantization_config {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
"dynamic", "weight_block_size": [rows, cols]}. A quantized linear weight [N, K] is stored as
F8_E4M3 with a sibling {weight}_scale_inv [ceil(N / rows), ceil(K / cols)] (float32 or bf16), the
last block of a dimension the blocks do not divide being shorter: weight = fp8 value * the scale
of its block, in float32, as transformers dequantizes it (finegrained_fp8). Which weights are FP8
is what the tensors say (embeddings, norms, the head and routers usually stay bf16).
"""
import math

import numpy as np

from ..dtypes import from_bf16
from ..errors import ModelSerializerException
from .safetensors_io import drop_mapped_pages

FP8_CODE = "F8_E4M3"
SCALE_SUFFIX = "_scale_inv"
_SCALE_CODES = ("F32", "BF16", "F16")
DEFAULT_BLOCK = [128, 128]  # transformers' FineGrainedFP8Config's, where config.json names none


def _e4m3_values() -> np.ndarray:
    """float32 of each of the 256 e4m3fn bit patterns: bias 7, subnormals, no infinity, S.1111.111 NaN."""
    bits = np.arange(256)
    exponent, mantissa = (bits >> 3) & 15, bits & 7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    magnitude[(exponent == 15) & (mantissa == 7)] = np.nan
    return np.where(bits & 128, -magnitude, magnitude).astype(np.float32)


E4M3 = _e4m3_values()


def block_size(quantization_config, where):
    """(rows, cols) of a quant_method "fp8" config's blocks; what would be computed otherwise is
    refused by name."""
    q = quantization_config
    refused = [f"{key}={q[key]!r} (only {want!r} is)" for key, want in
               (("fmt", "e4m3"), ("activation_scheme", "dynamic"), ("expert_dtype", "fp8"))
               if q.get(key, want) != want]
    block = q.get("weight_block_size", DEFAULT_BLOCK)
    if block is None:
        refused.append("weight_block_size null (per-tensor FP8; only block-wise FP8 is)")
    elif not (isinstance(block, (list, tuple)) and len(block) == 2
              and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        refused.append(f"weight_block_size={block!r} (two positive integers)")
    if refused:
        raise ModelSerializerException(f"{where}: fp8 checkpoint with {'; '.join(refused)} is not supported")
    return tuple(block)


def dequantize(bits, scale, block):
    """fp8 e4m3 bits [N, K] (uint8) and float32 scales [ceil(N / rows), ceil(K / cols)] -> the
    float32 weight, one row of blocks at a time."""
    rows, cols = block
    out = np.empty(bits.shape, np.float32)
    scale_of_column = scale[:, np.arange(bits.shape[1]) // cols]  # [row blocks, K]
    for b, begin in enumerate(range(0, bits.shape[0], rows)):
        part = out[begin:begin + rows]
        np.take(E4M3, bits[begin:begin + rows], out=part)
        part *= scale_of_column[b]
    return out


class BlockFP8Weights:
    """A checkpoint's tensors (HFWeights: keys, in, shape, code, fetch) as keys, in, shape and fetch
    show them, with each FP8 weight read as the float32 weight it dequantizes to and its scales
    hidden; float tensors pass through."""

    def __init__(self, tensors, block, where):
        self.tensors, self.block, self.where = tensors, block, where
        names = set(tensors.keys())
        self.scaled = {}  # FP8 weight -> its scales
        for name in sorted(names):
            if name.endswith(SCALE_SUFFIX):
                weight = name.removesuffix(SCALE_SUFFIX)
                if not weight.endswith(".weight") or weight not in names:
                    raise ModelSerializerException(
                        f"{where}: '{name}' scales no '.weight' tensor of the checkpoint (FP8 experts stacked "
                        "in one tensor per layer are not supported: the released checkpoints keep one per expert)")
                self.scaled[weight] = name
                self._check_grid(weight, name)
                if tensors.code(name) not in _SCALE_CODES:
                    raise ModelSerializerException(
                        f"{where}: scales '{name}' are {tensors.code(name)}; supported are {', '.join(_SCALE_CODES)}")
            elif tensors.code(name) == FP8_CODE and name + SCALE_SUFFIX not in names:
                if name + "_scale" in names:
                    raise ModelSerializerException(
                        f"{where}: FP8 tensor '{name}' has one scale, '{name}_scale' (per-tensor FP8, AutoFP8's "
                        f"layout), which is not supported: only block-wise FP8 ({name}{SCALE_SUFFIX}) is")
                raise ModelSerializerException(f"{where}: FP8 tensor '{name}' has no '{name}{SCALE_SUFFIX}' scales")

    def _check_grid(self, weight, scale):
        shape, grid = self.tensors.shape(weight), tuple(self.tensors.shape(scale))
        want = tuple(math.ceil(n / b) for n, b in zip(shape, self.block)) if len(shape) == 2 else None
        if grid != want:
            raise ModelSerializerException(
                f"{self.where}: '{scale}' is {list(grid)}, but '{weight}' {list(shape)} in blocks of "
                f"{list(self.block)} (weight_block_size) has {list(want) if want else 'no such'} grid of scales")

    def keys(self):
        return [n for n in self.tensors.keys() if not n.endswith(SCALE_SUFFIX)]

    def __contains__(self, name):
        return name in self.tensors and not name.endswith(SCALE_SUFFIX)

    def shape(self, name):
        return self.tensors.shape(name)

    def fetch(self, name, *codes):
        """(array, dtype code): an FP8 weight dequantized to float32, its source pages dropped."""
        if name not in self.scaled:
            return self.tensors.fetch(name, *codes)
        bits, _ = self.tensors.fetch(name, (FP8_CODE,))
        scale, scale_code = self.tensors.fetch(self.scaled[name], _SCALE_CODES)
        weight = dequantize(bits, from_bf16(scale) if scale_code == "BF16" else np.asarray(scale, np.float32),
                            self.block)
        drop_mapped_pages(bits)
        return weight, "F32"
