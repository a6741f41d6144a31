"""DashInfer 1.3's `dashinfer.helper`: EngineHelper and ConfigManager, over this runtime's public API."""
from .config_manager import ConfigManager
from .engine_helper import EngineHelper

__all__ = ["EngineHelper", "ConfigManager"]
