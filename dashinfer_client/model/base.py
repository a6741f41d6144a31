"""What every model handle offers once its config is known: tokenizer and reference config builders.

Subclasses (HuggingFaceModel, GGUFModel, DashInferModel) set self.config (ModelConfig) and
self.generation_config (dict), and say where the serialized model is and how to build the tokenizer.
"""
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

    def create_reference_runtime_config_builder(self, model_name, device_type, device_list, max_batch,
                                                max_context_length=-1):
        """An AsModelRuntimeConfigBuilder pointing at the serialized model; max_length = the context length
        (or max_context_length when given), to adjust before build()."""
        from ..config import AsModelRuntimeConfigBuilder
        model_dir, prefix = self._serialized_location()
        if max_context_length == -1:
            max_context_length = self.get_model_context_length()
        return (AsModelRuntimeConfigBuilder()
                .model_name(model_name)
                .model_dir(model_dir, prefix)
                .compute_unit(device_type, device_list)
                .max_length(max_context_length)
                .max_batch(max_batch))

    def create_reference_generation_config_builder(self, runtime_cfg=None):
        """An ASGenerationConfigBuilder with the model's generation_config.json defaults (eos ids included);
        with a runtime config, max_length = min(model context length, runtime max_length)."""
        from ..config import ASGenerationConfigBuilder
        self._need_config()
        defaults = dict(self.generation_config)
        eos = defaults.get("eos_token_id") or self.config.eos_token_id
        defaults.pop("eos_token_id", None)
        if eos:
            defaults["eos_token_id"] = list(eos)
        builder = ASGenerationConfigBuilder(defaults)
        if runtime_cfg is not None:
            builder.update({"max_length": min(self.get_model_context_length(), runtime_cfg.max_length)})
        return builder

    def _need_config(self):
        if self.config is None:
            raise ModelSerializerException("the model config is not read yet: call read_model_config() first")

