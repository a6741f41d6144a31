"""DashInfer's `allspark.quantization` names.

KVCacheConfig is here. QuantizeConfig belongs to the v1.3 serialize_model_from_torch flow, which
this runtime does not have yet: weight quantization is InstantQuant at serialization
(serialize_to_path(enable_quant=True, customized_quant_config=...)).
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


__all__ = ["KVCacheConfig"]
