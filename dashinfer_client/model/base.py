"""What every model handle offers once its config is known: tokenizer and reference config builders.

Subclasses (HuggingFaceModel, GGUFModel, DashInferModel) set self.config (ModelConfig) and
self.generation_config (dict), and say where the serialized model is and how to build the tokenizer.
"""
import contextlib

from .. import tokenizer as light_tokenizer
from ..errors import ModelSerializerException


def auto_tokenizer(path, **kwargs):
    """transformers' AutoTokenizer.from_pretrained(path, **kwargs), or a clear error naming the
    extra that provides it."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ModelSerializerException(
            f"the tokenizer in {path} needs transformers, which is not installed: "
            "pip install 'dashinfer-py[convert]'") from None
    return AutoTokenizer.from_pretrained(path, **kwargs)


@contextlib.contextmanager
def reading_tokenizer(what):
    """Whatever building a tokenizer raises (files that are not JSON, not a tokenizer, a kind
    transformers cannot build) becomes the one documented error, naming `what` it read."""
    try:
        yield
    except (ModelSerializerException, MemoryError):
        raise
    except Exception as e:
        raise ModelSerializerException(f"cannot read {what}: {type(e).__name__}: {str(e)[:300]}") from None


class ModelHandle:
    def __init__(self):
        self.config = None
        self.generation_config = {}
        self.tokenizer = None

    # -- to provide ---------------------------------------------------------------------------
    def _serialized_location(self):
        """(model_dir, prefix) of the serialized model, or raise if there is none yet."""
        raise NotImplementedError

    def _tokenizer_path(self):
        """A Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json...)."""
        raise NotImplementedError

    def _tokenizer_kwargs(self):
        return {}

    # -- DashInfer API -------------------------------------------------------------------------
    def init_tokenizer(self, padding_side="left"):
        """Build the tokenizer once (later calls keep it): dashinfer_client.tokenizer.Tokenizer
        (tokenizers + jinja2, no transformers) when it reproduces the directory's tokenizer, else
        transformers' AutoTokenizer (the [convert] extra)."""
        if self.tokenizer is None:
            path = self._tokenizer_path()
            kwargs = self._tokenizer_kwargs()
            with reading_tokenizer(f"the tokenizer in {path}"):
                if light_tokenizer.supports(path) and not kwargs.get("trust_remote_code"):
                    self.tokenizer = light_tokenizer.Tokenizer(path, padding_side=padding_side)
                else:
                    self.tokenizer = auto_tokenizer(path, padding_side=padding_side, **kwargs)
        return self

    def get_tokenizer(self):
        if self.tokenizer is None:
            self.init_tokenizer()
        return self.tokenizer

    def get_model_context_length(self):
        """The model's own context length (max_position_embeddings)."""
        self._need_config()
        return self.config.max_position_embeddings

    def create_reference_runtime_config_builder(self, engine_model_name=None, device_type=None, device_ids=None,
                                                max_batch=None, max_context_length=-1):
        """An AsModelRuntimeConfigBuilder pointing at the serialized model, to adjust before build().
        DashInfer's arguments: engine_model_name (default: the model's name), device_type (TargetDevice
        or its name, default CPU), device_ids (NUMA nodes for CPU_NUMA), max_batch (default 32) and
        max_context_length (-1: the model's context length)."""
        from ..runtime_config import AsModelRuntimeConfigBuilder
        model_dir, prefix = self._serialized_location()
        builder = (AsModelRuntimeConfigBuilder().model_name(self._default_engine_model_name())
                   .model_dir(model_dir, prefix).max_length(self.get_model_context_length())
                   .update_from_dict(self._reference_runtime_fields()))
        if engine_model_name:
            builder.model_name(engine_model_name)
        if device_type is not None or device_ids is not None:
            builder.compute_unit(device_type or "CPU", device_ids)
        if max_batch is not None:
            builder.max_batch(max_batch)
        if max_context_length != -1:
            builder.max_length(max_context_length)
        return builder

    def create_reference_generation_config_builder(self, runtimeConfig=None):
        """An ASGenerationConfigBuilder with the model's generation_config.json defaults (eos ids included);
        with a runtime config (DashInfer's keyword: runtimeConfig), max_length = min(model context length,
        runtime max_length)."""
        from ..config import ASGenerationConfigBuilder
        self._need_config()
        defaults = dict(self.generation_config)
        eos = self.eos_token_ids()
        defaults.pop("eos_token_id", None)
        if eos:  # one id stays an int (DashInfer reads several as eos + stop words)
            defaults["eos_token_id"] = eos[0] if len(eos) == 1 else list(eos)
        builder = ASGenerationConfigBuilder(defaults)
        if runtimeConfig is not None:  # a built config, or an AsModelConfig (0 there means the default)
            built = runtimeConfig.build() if hasattr(runtimeConfig, "build") else runtimeConfig
            builder.update({"max_length": min(self.get_model_context_length(), built.engine_max_length)})
        return builder

    def eos_token_ids(self) -> list:
        """The ids that end an answer: generation_config.json's eos_token_id, else config.json's."""
        self._need_config()
        eos = self.generation_config.get("eos_token_id") or self.config.eos_token_id
        return [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]

    def _default_engine_model_name(self):
        return self._serialized_location()[1]

    def _reference_runtime_fields(self):
        """Runtime settings the model brings along (a DashInferModel's DIConfig runtime_config)."""
        return {}

    def _need_config(self):
        if self.config is None:
            raise ModelSerializerException("the model config is not read yet: call read_model_config() first")

