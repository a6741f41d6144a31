"""Model loaders (Hugging Face, GGUF), the serialized format (DashInferModel) and InstantQuant."""
from .gguf_loader import GGUFModel
from .hf import HuggingFaceModel
from .serialized import DashInferModel

__all__ = ["HuggingFaceModel", "GGUFModel", "DashInferModel"]
