"""LMDeploy's offline inference pipeline over this runtime: `from dashinfer_client import pipeline`."""
from .chat_template import ChatTemplateConfig
from .engine_config import CpuEngineConfig, PytorchEngineConfig, TurbomindEngineConfig
from .generation import GenerationConfig
from .pipeline import Pipeline, pipeline
from .response import Response

__all__ = ["pipeline", "Pipeline", "GenerationConfig", "TurbomindEngineConfig", "PytorchEngineConfig",
           "CpuEngineConfig", "ChatTemplateConfig", "Response"]
