"""DashInfer's `allspark.generation_config` module name."""
from .config import ASGenerationConfig, ASGenerationConfigBuilder

__all__ = ["ASGenerationConfigBuilder", "ASGenerationConfig"]
