"""DashInfer's `allspark.quantization` names: KVCacheConfig, and QuantizeConfig (the weight
quantization of DashInfer 1.3's serialize_model_from_torch).

Both choose what this runtime already does: QuantizeConfig is InstantQuant weight-only (the
settings serialize_to_path(customized_quant_config=...) takes), KVCacheConfig a kv_cache_mode.
"""
import enum

from .types import AsCacheMode


class KVCacheConfig:
    """DashInfer's KV cache quantization choice: KVCacheConfig("int8") or ("uint4").
    cache_mode gives the same choice as the runtime config takes it (kv_cache_mode)."""

    class QuantType(enum.IntEnum):
        INT8 = 0
        UINT4 = 1

    def __init__(self, kv_cache_type: str = "int8"):
        if not isinstance(kv_cache_type, str) or kv_cache_type.upper() not in self.QuantType.__members__:
            raise ValueError(f"kv_cache_type must be 'int8' or 'uint4', got {kv_cache_type!r}")
        self.quantize_type_alias = kv_cache_type
        self.quantize_type = self.QuantType[kv_cache_type.upper()]

    @property
    def cache_mode(self) -> AsCacheMode:
        return {self.QuantType.INT8: AsCacheMode.AsCacheQuantI8,
                self.QuantType.UINT4: AsCacheMode.AsCacheQuantU4}[self.quantize_type]

    def __repr__(self):
        return f"KVCacheConfig({self.quantize_type_alias})"


class QuantizeConfig:
    """DashInfer 1.3's weight quantization choice, in its argument order:
    QuantizeConfig(activation_type, weight_type, quan_json=None, op_type_to_quantize=None, extra_option=None).

    activation_type "bfloat16" | "float16" and weight_type "int8" | "uint8" (A16W8, as DashInfer 1.3)
    or "uint4" (A16W4, which DashInfer 1.3's EngineHelper names and this runtime also quantizes).
    extra_option {"SubChannel": bool, "GroupSize": 64 | 128 | 256 | 512}: SubChannel False (the
    default) quantizes per output channel, True in groups of GroupSize input channels (default 512).
    Both 8-bit types give the same weights here: 8-bit codes with a scale and a zero point per group
    (DashInfer's int8 and uint8 differ only in the sign of the stored code). On a CPU with
    AVX512-VNNI the activations are quantized to int8 on the fly for the dot products, elsewhere
    they stay float; activation_type says only that they are not quantized ahead of time. Anything
    else DashInfer 1.3 refuses is refused here too (ValueError, an Exception as DashInfer raised).
    """

    class QuantMode(enum.Enum):
        Dynamic = 1
        A16W8 = 2
        A16W4 = 3

    OP_TYPES = ("GEMM",)
    EXTRA_OPTIONS = {"SubChannel": False, "GroupSize": 512}
    GROUP_SIZES = (64, 128, 256, 512)
    _WEIGHT_FORMATS = {"INT8": "int8", "UINT8": "int8", "UINT4": "uint4"}

    def __init__(self, activation_type, weight_type=None, quan_json=None, op_type_to_quantize=None,
                 extra_option=None):
        if quan_json:
            raise ValueError("QuantizeConfig: quan_json (an already-quantized checkpoint's settings) is not "
                             "supported: quantize a float model (InstantQuant)")
        self.activation_type = activation_type
        self.weight_type = weight_type
        self.op_type_to_quantize = [str(op).upper() for op in (op_type_to_quantize or self.OP_TYPES)]
        bad_ops = [op for op in self.op_type_to_quantize if op not in self.OP_TYPES]
        if bad_ops:
            raise ValueError(f"QuantizeConfig: op type(s) {bad_ops} cannot be quantized (only GEMM)")
        if (str(activation_type).upper() not in ("FLOAT16", "BFLOAT16")
                or str(weight_type).upper() not in self._WEIGHT_FORMATS):
            raise ValueError(f"QuantizeConfig: activation_type={activation_type!r}, weight_type={weight_type!r} is "
                             "not supported: activations bfloat16 or float16, weights int8, uint8 or uint4")
        self.quantize_mode = (self.QuantMode.A16W4 if str(weight_type).upper() == "UINT4"
                              else self.QuantMode.A16W8)
        extra = dict(extra_option or {})
        unknown = sorted(set(extra) - set(self.EXTRA_OPTIONS))
        if unknown:
            raise ValueError(f"QuantizeConfig: extra_option key(s) {unknown} are not known "
                             f"(known: {sorted(self.EXTRA_OPTIONS)})")
        self.extra_option = {**self.EXTRA_OPTIONS, **extra}
        if self.extra_option["SubChannel"] and self.extra_option["GroupSize"] not in self.GROUP_SIZES:
            raise ValueError(f"QuantizeConfig: GroupSize must be one of {list(self.GROUP_SIZES)}, "
                             f"got {self.extra_option['GroupSize']!r}")

    @property
    def weight_format(self) -> str:
        """The InstantQuant weight format: "int8" (8-bit codes) or "uint4"."""
        return self._WEIGHT_FORMATS[str(self.weight_type).upper()]

    @property
    def group_size(self) -> int:
        """Input channels per scale: GroupSize with SubChannel, else -1 (per output channel)."""
        return int(self.extra_option["GroupSize"]) if self.extra_option["SubChannel"] else -1

    def customized_quant_config(self) -> dict:
        """The same choice as serialize_to_path's customized_quant_config."""
        return {"quant_method": "instant_quant", "weight_format": self.weight_format,
                "group_size": self.group_size}

    def __repr__(self):
        return (f"QuantizeConfig(mode={self.quantize_mode}, activation={self.activation_type}, "
                f"weight={self.weight_type}, extra={self.extra_option})")


__all__ = ["KVCacheConfig", "QuantizeConfig"]
