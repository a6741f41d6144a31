"""DashInfer's `allspark._allspark` (its C++ binding module): the same names, here in Python."""
from .as_model_config import AsModelConfig
from .types import (AsCacheMode, AsEvictionStrategy, AsMHAPrefill, AsSchedulingStrategy, AsStatus,
                    GeneratedElements, GenerateRequestStatus, MultiMediaInfo, ResultQueue, VocabType)

__all__ = ["AsModelConfig", "AsCacheMode", "AsEvictionStrategy", "AsMHAPrefill", "AsSchedulingStrategy",
           "AsStatus", "GeneratedElements", "GenerateRequestStatus", "MultiMediaInfo", "ResultQueue",
           "VocabType"]
