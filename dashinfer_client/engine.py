"""DashInfer's `allspark.engine` names. Engine lives in dashinfer_server and is imported on first
use (the documented exception to the client-never-imports-server rule); the rest are the client's."""
import importlib

from .config import ASGenerationConfigBuilder
from .as_model_config import AsModelConfig
from .introspection import AsEngineStat
from .types import AsCacheMode, AsStatus, GenerateRequestStatus, RequestStatInfo, RoPEScaleMethod, TargetDevice

__all__ = ["Engine", "TargetDevice", "RoPEScaleMethod", "RequestStatInfo", "AsStatus", "AsEngineStat",
           "AsModelConfig",
           "AsCacheMode", "GenerateRequestStatus", "ASGenerationConfigBuilder"]


def __getattr__(name):
    if name == "Engine":
        return importlib.import_module("dashinfer_server.engine").Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
