"""DashInfer's `allspark._allspark` (its C++ binding module): the same names, here in Python."""
from .as_model_config import AsModelConfig
from .introspection import AsEngineStat, AsFileInfo
from .options import AsEvictionStrategy, AsMHAPrefill, AsSchedulingStrategy, MultiMediaInfo, VocabType
from .types import AsCacheMode, AsStatus, GeneratedElements, GenerateRequestStatus, ResultQueue

__all__ = ["AsModelConfig", "AsEngineStat", "AsFileInfo", "AsCacheMode", "AsEvictionStrategy", "AsMHAPrefill",
           "AsSchedulingStrategy",
           "AsStatus", "GeneratedElements", "GenerateRequestStatus", "MultiMediaInfo", "ResultQueue",
           "VocabType"]
