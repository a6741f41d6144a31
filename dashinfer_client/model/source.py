"""The DashInfer loader steps shared by every checkpoint format (Hugging Face dir, GGUF file).

    loader.load_model().read_model_config().serialize_to_path(engine, out_dir).free_model()

A subclass says how to read the config (_read_config), how to open the weights (_open_weights ->
an object with fetch(hf_name) -> (numpy array, dtype code)) and how to write the tokenizer files
(_save_tokenizer). Conversion itself (dtype, InstantQuant, file layout) is serialized.write_serialized.
"""
import atexit
import os
import shutil
import sys
import tempfile

from .. import settings
from ..errors import ModelSerializerException, malformed
from .base import ModelHandle
from .quant import InstantQuantSettings
from .serialized import DTYPES, DashInferModel, weight_shapes, write_serialized

_TEMP_DIRS = set()  # in-memory serializations still on disk, removed at exit at the latest


@atexit.register
def _remove_temp_dirs():
    for path in list(_TEMP_DIRS):
        shutil.rmtree(path, ignore_errors=True)
        _TEMP_DIRS.discard(path)


def quiet_by_env():
    return settings.get("DASHINFER_QUIET")


class SourceModel(ModelHandle):
    source_format = "?"

    def __init__(self, model_path, model_name, in_memory_serialize=False, user_set_data_type=None,
                 trust_remote_code=False, progress=None):
        """DashInfer's argument order. user_set_data_type: "bfloat16", "float16" or "float32"; None
        keeps the checkpoint's own dtype (known once read_model_config() has run)."""
        super().__init__()
        self.model_path = str(model_path)
        self.model_name = model_name
        self.safe_model_name = str(model_name).replace("/", "_")
        self.user_set_data_type = None if user_set_data_type is None else _dtype(
            "user_set_data_type", user_set_data_type)
        self.data_type = self.user_set_data_type
        self.in_memory_serialize = in_memory_serialize
        self.trust_remote_code = trust_remote_code
        self.progress = progress
        self.architecture = None
        self.weights = None
        self.model_output_dir = None
        self.serialize_model_name = None
        self.quant_settings = None
        self.serialization_report = None
        self._memory_dir = None

    # -- to provide -----------------------------------------------------------------------------
    def _read_config(self):
        """-> (architecture, ModelConfig, generation_config dict)."""
        raise NotImplementedError

    def _open_weights(self, load_format):
        """-> object with names() and fetch(hf_name) -> (array, 'F32'|'F16'|'BF16'); load_format is
        "auto", "safetensors" or "pt" (refuse the ones the source format is not)."""
        raise NotImplementedError

    def _save_tokenizer(self, out_dir):
        """Write tokenizer files into out_dir; False when the source has none."""
        raise NotImplementedError

    def _checkpoint_dtype(self):
        """The dtype the checkpoint says its weights are in (one of DTYPES); DashInfer's fallback."""
        return "bfloat16"

    # -- fluent steps ------------------------------------------------------------------------------
    def read_model_config(self):
        """Read and check the model's hyper-parameters (once)."""
        with malformed(self.model_path):
            if self.config is None:
                self.architecture, self.config, self.generation_config = self._read_config()
            if self.data_type is None:
                self.data_type = self._checkpoint_dtype()
        return self

    def load_model(self, override_data_type=None, direct_load=False, load_format="auto", **unsupported):
        """Open the checkpoint (mapped, read lazily) and check that it holds every tensor the config needs.
        override_data_type: the serialized dtype, replacing user_set_data_type. direct_load is accepted
        (weights are always read directly, never through transformers). load_format: "auto" (or None),
        "safetensors" or "pt" (the PyTorch pickle files), which must then be present."""
        _refuse_unsupported(unsupported)
        if load_format not in LOAD_FORMATS:
            raise ModelSerializerException(
                f"load_format={load_format!r} is not one of {', '.join(map(repr, LOAD_FORMATS))}")
        if override_data_type is not None:
            self.data_type = _dtype("override_data_type", override_data_type)
        self.read_model_config()
        if self.weights is None:
            weights = self._open_weights(load_format or "auto")
            shapes = weight_shapes(self.config, self.architecture)
            missing = [n for n in shapes if n not in weights]
            if missing:
                raise ModelSerializerException(
                    f"checkpoint {self.model_path} lacks tensor(s) {', '.join(missing[:5])}"
                    + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
            for name, shape in shapes.items():
                got = tuple(weights.shape(name))
                if got != shape:
                    raise ModelSerializerException(
                        f"tensor '{name}' in {self.model_path} has shape {list(got)}, the config implies {list(shape)}")
            self.weights = weights
        return self

    def serialize_to_path(self, engine=None, model_output_dir="", enable_quant=False, weight_only_quant=False,
                          skip_if_exists=False, multinode_mode=True, customized_quant_config=None, lora_cfg=None,
                          progress=None, **unsupported):
        """Convert into {model_output_dir}/{name}.asgraph/.asparam/.tokenizer (DashInfer's argument order).
        engine is accepted for DashInfer compatibility (conversion needs no engine). enable_quant applies
        InstantQuant (customized_quant_config: {"quant_method": "instant_quant", "weight_format": "int8"|"uint4",
        "group_size": -1 (per channel, the default) or a group of input channels}). multinode_mode either
        way writes the same files: they are unsharded, and each rank slices its own shard at load."""
        _refuse_unsupported(dict(unsupported, lora_cfg=lora_cfg))
        if not model_output_dir:
            raise ModelSerializerException("serialize_to_path needs a model_output_dir")
        self.quant_settings = self._quant_settings(enable_quant, weight_only_quant, customized_quant_config)
        if skip_if_exists and self._already_serialized(model_output_dir):
            self._say(f"serialize_to_path: {self.safe_model_name} already serialized in {model_output_dir} with "
                      "the same dtype and quantization; skipping (skip_if_exists=True)", progress)
        else:
            self._write(model_output_dir, progress)
        self.model_output_dir, self.serialize_model_name = model_output_dir, self.safe_model_name
        return self

    serialize_to_file = serialize_to_path

    def serialize_to_memory(self, engine=None, enable_quant=False, weight_only_quant=False, multinode_mode=True,
                            customized_quant_config=None, lora_cfg=None, progress=None, **unsupported):
        """Convert into a temporary directory, removed by free_memory_serialize_file() or at process exit.
        Arguments as serialize_to_path (DashInfer's order)."""
        _refuse_unsupported(dict(unsupported, lora_cfg=lora_cfg))
        if not self.in_memory_serialize:
            raise ModelSerializerException(
                "serialize_to_memory needs HuggingFaceModel(..., in_memory_serialize=True); "
                "or use serialize_to_path(engine, dir)")
        self.quant_settings = self._quant_settings(enable_quant, weight_only_quant, customized_quant_config)
        self.free_memory_serialize_file()
        self._memory_dir = tempfile.mkdtemp(prefix="dashinfer-model-")
        _TEMP_DIRS.add(self._memory_dir)
        self._write(self._memory_dir, progress)
        self.model_output_dir, self.serialize_model_name = self._memory_dir, self.safe_model_name
        return self

    def serialize(self, engine=None, model_output_dir="", enable_quant=False, weight_only_quant=False,
                  customized_quant_config=None, **kwargs):
        """serialize_to_memory or serialize_to_path, as in_memory_serialize says."""
        if self.in_memory_serialize:
            return self.serialize_to_memory(engine, enable_quant, weight_only_quant,
                                            customized_quant_config=customized_quant_config, **kwargs)
        return self.serialize_to_path(engine, model_output_dir, enable_quant, weight_only_quant,
                                      customized_quant_config=customized_quant_config, **kwargs)

    def free_model(self):
        """Drop the source checkpoint (mappings, loaded tensors); the serialized files stay."""
        self.weights = None
        return self

    def free_memory_serialize_file(self):
        """Remove the temporary files of serialize_to_memory (call after engine.install_model)."""
        if self._memory_dir:
            shutil.rmtree(self._memory_dir, ignore_errors=True)
            _TEMP_DIRS.discard(self._memory_dir)
            if self.model_output_dir == self._memory_dir:
                self.model_output_dir = None
            self._memory_dir = None
        return self

    def export_model_diconfig(self, output_path):
        """Write the conversion settings (source, dtype, quantization, result location, config) as YAML,
        with DashInfer's DIConfig runtime_config and generation_config sections, which
        DashInferModel(dir, name, config_file_path=output_path) reads back as its defaults."""
        import yaml
        self.read_model_config()
        q = self.quant_settings
        doc = {
            "model": {"model_name": self.model_name, "source_path": self.model_path,
                      "source_format": self.source_format, "architecture": self.architecture,
                      "data_type": self.data_type, "config": self.config.to_dict()},
            "quantization": None if q is None else {"quant_method": "instant_quant", "weight_format": q.weight_format,
                                                    "group_size": q.group_size, "quantize_lm_head": q.quantize_lm_head,
                                                    "compute_method": q.compute_method},
            "serialized": None if not self.model_output_dir else {"model_dir": self.model_output_dir,
                                                                  "prefix": self.serialize_model_name},
            "generation_config": dict(self.generation_config),
            "runtime_config": {"model_name": self.safe_model_name,
                               "compute_unit": {"device_type": "CPU", "device_ids": [0], "compute_thread_in_device": 0},
                               "engine_max_length": min(2048, self.config.max_position_embeddings),
                               "engine_max_batch": 32, "kv_cache_mode": "AsCacheDefault", "enable_prefix_cache": True},
        }
        folder = os.path.dirname(os.path.abspath(output_path))
        os.makedirs(folder, exist_ok=True)
        with open(output_path, "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        return self

    # -- internals --------------------------------------------------------------------------------
    def _serialized_location(self):
        if not self.model_output_dir:
            raise ModelSerializerException(
                f"{self.safe_model_name} is not serialized yet: call serialize_to_path() or serialize_to_memory() first")
        return self.model_output_dir, self.serialize_model_name

    def _quant_settings(self, enable_quant, weight_only_quant, customized_quant_config):
        if not enable_quant:
            return None
        if customized_quant_config is None and not weight_only_quant:
            raise ModelSerializerException(
                "enable_quant=True with weight_only_quant=False asks for activation quantization, which this "
                "runtime does not do: pass weight_only_quant=True (InstantQuant int8, group 64) or a "
                "customized_quant_config")
        return InstantQuantSettings.from_config(customized_quant_config)

    def _already_serialized(self, out_dir):
        self.read_model_config()  # resolves the checkpoint's dtype when none was set
        try:
            existing = DashInferModel(out_dir, self.safe_model_name)
        except ModelSerializerException:
            return False
        q, eq = self.quant_settings, existing.quantization
        same_quant = (q is None and eq is None) or (
            q is not None and eq is not None and eq.get("weight_format") == q.weight_format
            and eq.get("group_size") == q.group_size
            and eq.get("compute_method", "weight_only") == q.compute_method
            and ("lm_head.weight" in eq.get("quantized", [])) == (q.quantize_lm_head and not self.config.tie_word_embeddings))
        return existing.dtype == self.data_type and same_quant

    def _write(self, out_dir, progress):
        self.load_model()
        report = write_serialized(
            out_dir, self.safe_model_name, model_name=self.model_name, architecture=self.architecture,
            config=self.config, dtype=self.data_type, quant_settings=self.quant_settings,
            fetch=self.weights.fetch, generation_config=self.generation_config,
            save_tokenizer=self._save_tokenizer, progress=self._show_progress(progress))
        self.serialization_report = report
        r = report["quantization"]
        held = self.data_type if not r else (
            f"linear layers {r['weight_format']} "
            f"{'per channel' if r['group_size'] == -1 else 'in groups of %d' % r['group_size']}, the rest {self.data_type}")
        line = (f"Model {self.model_name} serialized to {out_dir}/{self.safe_model_name}.asparam "
                f"({report['asparam_bytes'] / 2**20:.1f} MiB, {held}) in {report['seconds']:.1f} s")
        if r:
            line += (f"; InstantQuant error: max abs {r['max_abs_error']:.3g}, "
                     f"relative RMS {r['relative_rms_error']:.3g}")
        self._say(line, progress)

    def _show_progress(self, progress):
        for choice in (progress, self.progress):
            if choice is not None:
                return bool(choice)
        return not quiet_by_env()

    def _say(self, line, progress):
        if self._show_progress(progress):
            print(line, file=sys.stderr)


LOAD_FORMATS = (None, "auto", "safetensors", "pt")


def _dtype(key, value):
    if value not in DTYPES:
        raise ModelSerializerException(f"{key} {value!r} is not supported: use one of {', '.join(DTYPES)}")
    return value


def _refuse_unsupported(kwargs):
    """Options this runtime cannot honour, refused by name rather than silently ignored: LoRA
    (lora_cfg, no adapters are loaded here) and anything DashInfer forwarded to transformers."""
    rest = sorted(k for k, v in kwargs.items() if not (k == "lora_cfg" and v is None))
    if rest:
        raise ModelSerializerException(
            f"serialization option(s) not supported by this runtime: {', '.join(rest)}"
            + (" (LoRA adapters are not supported)" if "lora_cfg" in rest else ""))
