"""dashinfer-py client side: API types, config builders, model loaders, ClientEngine.

Code written for DashInfer ports by changing its import to `import dashinfer_client as allspark`.
Importing this package stays light (no torch, no transformers): the model loaders and the engines
are imported the first time one of their names is used.
"""
import importlib

from .api import ModelState
from .as_model_config import AsModelConfig
from .introspection import AsEngineStat, AsFileInfo
from .config import (ASGenerationConfig, ASGenerationConfigBuilder, AsModelRuntimeConfig,
                     AsModelRuntimeConfigBuilder)
from .prompt import PromptTemplate
from .options import AsEvictionStrategy, AsMHAPrefill, AsSchedulingStrategy, MultiMediaInfo, VocabType
from .types import (AsCacheMode, AsStatus, GeneratedElements, GenerateRequestStatus, RequestStatInfo,
                    ResultQueue, RoPEScaleMethod, TargetDevice)

# name -> module that defines it, imported on first use.
_LAZY = {
    "Engine": "dashinfer_server.engine",
    "ClientEngine": "dashinfer_client.client_engine",
    "HuggingFaceModel": "dashinfer_client.model.hf",
    "GGUFModel": "dashinfer_client.model.gguf_loader",
    "DashInferModel": "dashinfer_client.model.serialized",
    "ModelSerializerException": "dashinfer_client.errors",
    # LMDeploy's pipeline API (dashinfer_client.pipeline_api)
    **{name: "dashinfer_client.pipeline_api" for name in (
        "pipeline", "Pipeline", "GenerationConfig", "TurbomindEngineConfig", "PytorchEngineConfig",
        "CpuEngineConfig", "ChatTemplateConfig", "Response")},
}

__all__ = ["ASGenerationConfig", "ASGenerationConfigBuilder", "AsEngineStat", "AsFileInfo", "AsModelConfig",
           "AsModelRuntimeConfig",
           "AsModelRuntimeConfigBuilder", "ModelState", "PromptTemplate", "AsCacheMode", "AsEvictionStrategy",
           "AsMHAPrefill", "AsSchedulingStrategy", "AsStatus", "GeneratedElements", "GenerateRequestStatus",
           "MultiMediaInfo", "RequestStatInfo", "ResultQueue", "RoPEScaleMethod", "TargetDevice",
           "VocabType", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"dashinfer_client.{name} comes from {_LAZY[name]}, which could not be "
                          f"loaded: {e}") from e
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
