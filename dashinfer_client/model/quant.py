"""InstantQuant: weight-only asymmetric quantization per group of input channels (DashInfer's IQ).

For a weight W [N, K] and groups of G consecutive k in each row, int8:
    scale = (max - min) / 255,  zero = -min / scale  (a float, not rounded),
    q = clip(round(w / scale + zero), 0, 255),  dequantized w = (q - zero) * scale,
both stored as float32 per group (8.5-9 bits a weight). A group with max == min (or a range too
small for a normal float scale) gets scale 1, so nothing divides by zero.
uint4 stores its group parameters as two bytes (native/linear.h's u4 layout), 4.5 + 32/K bits a
weight in groups of 32 (fp32 pairs were 6: Qwen3-30B-A3B would not fit 24 GiB):
    row scale d = max over the row's groups of (max - min) / 15, over 255, one float32 a row;
    per group a scale code sc (1..255) and a zero code zc (0..240): scale = d * sc (float32),
    zero = zc / 16, dequantized w = (q - zero) * scale, q = clip(round(w / scale + zero), 0, 15).
Each group's range is widened to hold 0 (zero within 0..15), and (sc, zc) is the pair of least
squared error among sc within 1 of round((max - min) / 15 / d) and zc within 1 of
round(-min / scale * 16): in groups of 32 the default model's next-token NLL is +0.04% of bf16's
(float32 pairs: 0.00%, bench/quality.py), and on heavy-tailed random weights its error is below
the plain min/max rule's with float32 pairs (tests/test_quant.py).
When G does not divide K the last group of each row is ragged (K mod G channels), as DashInfer's
IQ serves a group-128 config on a 576-wide model; group parameters are then [N, ceil(K/G)].
int8 stores one code (0..255) a byte; uint4 two codes (0..15) a byte, the even k in the low nibble.
The quantizer is native/linear_quantize.c, in a module of its own without OpenMP (_quantize, see
native/conversion_quantize.c), so any process may convert, before or after it is placed;
tests/quant_reference.py keeps the same rules in numpy, and both agree bit for bit.
"""
import dataclasses
import math
import os

import numpy as np

from ..errors import ModelSerializerException
from . import _quantize

BITS = {"int8": 8, "uint4": 4}
_DEFAULT_GROUP = 64  # this runtime's own choice (from_config(None), the default model)
# The group this runtime picks per format when the user names none (the default model, the
# benches): uint4 in groups of 32 costs +0.04% NLL on the default model against +6.3% in groups of
# 64 (bench/quality.py; its weights come from a Q4_1 GGUF, blocks of 32) for 8% more bytes.
DEFAULT_GROUPS = {"int8": _DEFAULT_GROUP, "uint4": 32}
PER_CHANNEL = -1  # DashInfer's group_size when a customized_quant_config names none
# Groups the packed linear formats take besides K itself (native/linear.h, dn_linear_check_shape):
# a ragged quantization is served in the largest of these that divides both the group and K.
SERVED_GROUPS = (256, 128, 64, 32)
_KNOWN_KEYS = {"quant_method", "weight_format", "group_size", "quantize_lm_head", "compute_method"}
ACTIVATE_QUANT = "activate_quant"  # DashInfer's A8W8: int8 per-channel weights, int8 activations
ACT_BLOCK = 32  # k per activation quantization block (native/linear.h DN_Q8_BLOCK)
# The stored tensors of a quantized weight, {format: ((part, safetensors dtype code), ...)}
PARTS = {"int8": (("qweight", "U8"), ("scales", "F32"), ("zeros", "F32")),
         "uint4": (("qweight", "U8"), ("scales", "U8"), ("zeros", "U8"), ("row_scales", "F32"))}
U4_SCALE_CODES, U4_ZERO_STEPS = 255, 16  # uint4: sc in 1..255, zero in steps of 1/16 (0..15)


@dataclasses.dataclass(frozen=True)
class InstantQuantSettings:
    weight_format: str = "int8"
    group_size: int = _DEFAULT_GROUP
    quantize_lm_head: bool = False
    compute_method: str = "weight_only"

    @classmethod
    def from_config(cls, config):
        """From a DashInfer-style customized_quant_config dict; anything this runtime can't honour is refused.
        Without group_size the weights are quantized per channel (group_size -1), as DashInfer does.
        None (weight_only_quant=True and no dict, which DashInfer would refuse) gives this runtime's own
        choice: int8 in groups of 64, the measured accuracy/speed balance on the default model."""
        if config is None:
            return cls()
        unknown = set(config) - _KNOWN_KEYS
        if unknown:
            raise ModelSerializerException(
                f"customized_quant_config: unsupported key(s) {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}")
        method = config.get("quant_method", "instant_quant")
        if method != "instant_quant":
            raise ModelSerializerException(
                f"customized_quant_config: quant_method {method!r} is not supported (only 'instant_quant')")
        fmt = config.get("weight_format", "int8")
        if fmt not in BITS:
            raise ModelSerializerException(
                f"customized_quant_config: weight_format {fmt!r} is not supported (use {' or '.join(BITS)})")
        group = config.get("group_size", PER_CHANNEL)
        if not isinstance(group, int) or isinstance(group, bool) or not (group == -1 or group > 0):
            raise ModelSerializerException(
                f"customized_quant_config: group_size must be a positive integer or -1 (per channel), got {group!r}")
        if fmt == "uint4" and group > 0 and group % 2:
            raise ModelSerializerException(f"customized_quant_config: uint4 needs an even group_size, got {group}")
        compute = _check_compute_method(config.get("compute_method", "weight_only"), fmt, group)
        return cls(fmt, group, bool(config.get("quantize_lm_head", False)), compute)

    def quantized_names(self, shapes):
        """The tensors of weight_shapes' {name: shape} InstantQuant quantizes: every layer's
        projection matrices and experts (not the routers, which choose the experts), and lm_head
        (when untied) if quantize_lm_head."""
        names = [n for n, s in shapes.items() if n.startswith("model.layers.") and n.endswith(".weight")
                 and (n.endswith("_proj.weight") or ".experts." in n)]
        if self.quantize_lm_head and "lm_head.weight" in shapes:
            names.append("lm_head.weight")
        return names

    def group_of(self, k):
        """The group size used for a weight with k input channels (-1 means the whole row)."""
        return k if self.group_size == -1 else self.group_size

    def packed_shapes(self, n, k):
        """Shapes of the stored parts (PARTS) of a [n, k] weight (a ragged last group when the
        group does not divide k)."""
        g = self.group_of(k)
        if k % g:
            served_group(g, k)  # refuses a ragged split the kernels cannot serve, at conversion
        if self.compute_method == ACTIVATE_QUANT and k % ACT_BLOCK:
            raise ModelSerializerException(
                f"customized_quant_config: compute_method 'activate_quant' needs input sizes that are whole "
                f"blocks of {ACT_BLOCK} (activations are quantized per block), got {k}")
        if self.weight_format == "uint4" and k % 2:
            raise ModelSerializerException(f"InstantQuant uint4: input size {k} must be even (two codes a byte)")
        q_cols = k if self.weight_format == "int8" else k // 2
        groups = -(-k // g)
        return ((n, q_cols), (n, groups), (n, groups)) + (((n,),) if self.weight_format == "uint4" else ())


def _check_compute_method(compute, fmt, group):
    """'weight_only', or 'activate_quant' as DashInfer has it: int8 weights per channel only."""
    if compute == "weight_only":
        return compute
    if compute != ACTIVATE_QUANT:
        raise ModelSerializerException(
            f"customized_quant_config: compute_method {compute!r} is not supported (use 'weight_only' or "
            f"'{ACTIVATE_QUANT}')")
    if fmt != "int8" or group != PER_CHANNEL:
        raise ModelSerializerException(
            f"customized_quant_config: compute_method '{ACTIVATE_QUANT}' needs weight_format 'int8' and "
            f"group_size -1 (per channel), as DashInfer's A8W8; got weight_format {fmt!r}, group_size {group}")
    return compute


def quantize(w, weight_format="int8", group_size=_DEFAULT_GROUP, stats=None):
    """w float [N, K], or bf16 bits (uint16, dashinfer_client.dtypes), read as they are -> the parts
    PARTS names: int8 (qweight uint8, scales, zeros float32 [N, ceil(K/G)]); uint4 (qweight uint8
    [N, K/2], scale codes, zero codes uint8 [N, ceil(K/G)], row scales float32 [N]). In C
    (native/linear_quantize.c, through its module without OpenMP, safe to load in any process
    before or after placement), rows split over this process's cpus.
    A weight holding an infinity or a NaN is refused (no code represents it).
    stats: a QuantErrorStats that the error of w's quantization is added to."""
    settings = InstantQuantSettings.from_config({"weight_format": weight_format, "group_size": group_size})
    w = np.asarray(w)
    w = w if w.dtype == np.uint16 else w.astype(np.float32, copy=False)
    if w.ndim != 2:
        raise ModelSerializerException(f"InstantQuant: expects a 2-D weight [N, K], got shape {list(w.shape)}")
    w = np.ascontiguousarray(w)
    n, k = w.shape
    shapes = settings.packed_shapes(n, k)
    parts = tuple(np.empty(shape, dtype=np.float32 if code == "F32" else np.uint8)
                  for shape, (_, code) in zip(shapes, PARTS[weight_format]))
    row_scales = parts[3] if weight_format == "uint4" else np.empty(0, np.float32)
    error = None if stats is None else np.empty((n, 3))
    try:
        _quantize.quantize_into(w, settings.group_of(k), BITS[weight_format], *parts[:3], row_scales, error,
                                len(os.sched_getaffinity(0)))
    except ValueError as e:  # a weight with an infinity or a NaN
        detail = str(e).removeprefix("quantize_into: ")  # the C function's name says nothing here
        raise ModelSerializerException(f"InstantQuant: {detail}; convert without quantization, or repair the "
                                       "checkpoint") from None
    if stats is not None:
        stats.add_rows(error, w.size)
    return parts


def unpack_codes(q, weight_format):
    """Packed qweight -> one code per element (uint8 [N, K])."""
    if weight_format == "int8":
        return q
    codes = np.empty((q.shape[0], q.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = q & 0x0F
    codes[:, 1::2] = q >> 4
    return codes


def group_params(parts, weight_format):
    """(scale, zero) float32 [N, groups] of quantize's parts: w = (q - zero) * scale per group."""
    if weight_format == "int8":
        return parts[1], parts[2]
    _, codes, zero_codes, rows = parts
    return rows[:, None] * codes.astype(np.float32), zero_codes.astype(np.float32) / np.float32(U4_ZERO_STEPS)


def dequantize(parts, weight_format="int8", group_size=_DEFAULT_GROUP):
    """quantize's parts -> float32 [N, K]: (q - zero) * scale per group."""
    codes = unpack_codes(np.asarray(parts[0]), weight_format)
    scales, zeros, _ = uniform_groups(*group_params(parts, weight_format), codes.shape[1], group_size)
    n, k = codes.shape
    groups = codes.reshape(n, scales.shape[1], -1).astype(np.float32)
    return ((groups - zeros[..., None]) * scales[..., None]).reshape(n, k)


def served_group(g, k):
    """The equal group a ragged quantization (g does not divide k) is served in: the largest of
    SERVED_GROUPS dividing both; ModelSerializerException when none does."""
    common = math.gcd(g, k)
    for p in SERVED_GROUPS:
        if common % p == 0:
            return p
    raise ModelSerializerException(
        f"InstantQuant: group_size {g} leaves a ragged last group on input size {k}, and the kernels serve "
        f"it in groups dividing both ({', '.join(map(str, SERVED_GROUPS))}), which gcd({g}, {k}) = {common} "
        f"is not a multiple of; choose a group_size that divides {k}, a multiple of 32 sharing that with {k}, "
        f"or -1 (per channel)")


def uniform_groups(scales, zeros, k, group_size):
    """(scales, zeros, p): a ragged quantization (the group does not divide k) in equal groups of
    p channels (served_group), each stored group, the ragged last one included, repeated over the
    p-groups it holds; the values dequantize the same. Groups that divide k come back as they are."""
    g = k if group_size == -1 else group_size
    if k % g == 0:
        return scales, zeros, g
    p = served_group(g, k)
    owner = np.arange(k // p) * p // g  # the stored group of each p-group
    return scales[:, owner], zeros[:, owner], p


class QuantErrorStats:
    """Accumulates the quantization error over all quantized weights: max |w - w_q| and relative RMS,
    w_q as the kernels dequantize it (float32), from the per-row sums quantize measures."""

    def __init__(self):
        self.max_abs = 0.0
        self.sq_err = 0.0
        self.sq_ref = 0.0
        self.count = 0

    def add_rows(self, error, count):
        """error float64 [N, 3]: per row the sum of squared errors, of squared weights, the largest |error|."""
        self.sq_err += float(error[:, 0].sum())
        self.sq_ref += float(error[:, 1].sum())
        self.max_abs = max(self.max_abs, float(error[:, 2].max(initial=0.0)))
        self.count += count

    def summary(self):
        rel = (self.sq_err / self.sq_ref) ** 0.5 if self.sq_ref > 0 else 0.0
        return {"max_abs_error": self.max_abs, "relative_rms_error": rel, "quantized_elements": self.count}
