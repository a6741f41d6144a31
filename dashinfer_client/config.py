"""Config builders with DashInfer's names, in one import: AsModelRuntimeConfigBuilder ->
AsModelRuntimeConfig (how a model is served: runtime_config.py) and ASGenerationConfigBuilder ->
ASGenerationConfig (how one request generates: generation_config.py)."""
from .generation_config import ASGenerationConfig, ASGenerationConfigBuilder  # noqa: F401
from .runtime_config import AsModelRuntimeConfig, AsModelRuntimeConfigBuilder  # noqa: F401
