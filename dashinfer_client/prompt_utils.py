"""DashInfer's `allspark.prompt_utils` module name."""
from .prompt import PromptTemplate

__all__ = ["PromptTemplate"]
