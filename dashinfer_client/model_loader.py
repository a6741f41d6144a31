"""DashInfer's `allspark.model_loader` names: the model loaders and their exception."""
import enum

from .errors import ModelSerializerException
from .model.gguf_loader import GGUFModel
from .model.hf import HuggingFaceModel
from .model.serialized import DashInferModel


class LoadFormat(str, enum.Enum):
    """load_model(load_format=...) values, as DashInfer names them."""
    AUTO = "auto"
    PT = "pt"
    SAFETENSORS = "safetensors"


__all__ = ["HuggingFaceModel", "DashInferModel", "GGUFModel", "ModelSerializerException", "LoadFormat"]
