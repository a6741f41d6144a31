"""DashInfer 1.3's serialize_model_from_torch: a torch model in memory -> this runtime's serialized model.

    engine.serialize_model_from_torch(model_name, model_type, torch_model, model_config, save_dir, ...)

torch_model is the model's state_dict (what DashInfer 1.3's EngineHelper passed) or the module
itself, model_config the Hugging Face config as a dict (`model.config.__dict__`, or `to_dict()`).
The files are {save_dir}/{model_name}.dimodel + .ditensors, DashInfer 1.3's names, holding this
runtime's format (serialized.py), so AsModelConfig(model_path=...dimodel, weights_path=...ditensors)
installs them. Serving them needs no torch: only this conversion reads torch tensors.
"""
import os

from ..errors import ModelSerializerException
from .hf import copy_tokenizer_files, torch_tensor_to_numpy, unexpected_tensors
from .arch import normalize_hf_config
from .families import FAMILIES, family
from .families.fused_experts import holds_mxfp4
from .serialized import DTYPES, V13_SUFFIXES, weight_shapes, write_serialized

# DashInfer 1.3's model_type -> the Hugging Face class its checkpoints are. Its other types
# (Qwen_v10, ChatGLM_v2/v3/v4, Baichuan, Baichuan_v2) are architectures this runtime lacks.
MODEL_TYPES = {"LLaMA_v2": "LlamaForCausalLM", "LLaMA_v3": "LlamaForCausalLM",
               "Qwen_v15": "Qwen2ForCausalLM", "Qwen_v20": "Qwen2ForCausalLM"}
UNSUPPORTED_MODEL_TYPES = ("Qwen_v10", "ChatGLM_v2", "ChatGLM_v3", "ChatGLM_v4", "Baichuan", "Baichuan_v2")


def check_model_type(model_type):
    """The Hugging Face class of a DashInfer 1.3 model_type, or of a class name given as model_type
    (the families DashInfer 1.3 never had: "Qwen3ForCausalLM", ...); others refused by name."""
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    classes = [c for f in FAMILIES.values() for c in f.hf_classes]
    if model_type in classes:
        return model_type
    what = "an architecture this runtime does not have" if model_type in UNSUPPORTED_MODEL_TYPES else "unknown"
    raise ModelSerializerException(f"model_type {model_type!r} is {what}; supported: "
                                   f"{', '.join(MODEL_TYPES)}, or one of {', '.join(classes)}")


def serialize_model_from_torch(model_name, model_type, torch_model, model_config, save_dir, multinode_mode=1,
                               data_type="float32", do_dynamic_quantize_convert=False, quant_config=None,
                               use_dynamic_ntk=False, use_logn_attn=False, model_sequence_length=2048,
                               seqlen_extrapolation=1.0, rotary_base=None, derive_type="lmhead", progress=False):
    """Write {save_dir}/{model_name}.dimodel / .ditensors (and .tokenizer/ when model_config's
    _name_or_path is a directory holding a tokenizer); returns write_serialized's report.

    DashInfer 1.3's arguments: multinode_mode either way writes the same unsharded files (each rank
    slices its shard at load). data_type "float32" | "float16" | "bfloat16": the stored dtype of what
    is not quantized. do_dynamic_quantize_convert with quant_config (a QuantizeConfig): weight-only
    InstantQuant of the layers' linear weights; without the flag quant_config is not used, as in
    DashInfer 1.3. rotary_base (RoPE theta) overrides the config's when given. use_dynamic_ntk,
    use_logn_attn (Qwen 1.0 features) and seqlen_extrapolation != 1.0 are refused; model_sequence_length
    only mattered to dynamic NTK, so it has nothing to change here."""
    if not isinstance(model_name, str) or not model_name or os.sep in model_name:
        raise ModelSerializerException(f"model_name must be a file name (a non-empty str without {os.sep}), "
                                       f"got {model_name!r}")
    hf_class = check_model_type(model_type)
    if data_type not in DTYPES:
        raise ModelSerializerException(f"data_type {data_type!r} is not supported: use one of {', '.join(DTYPES)}")
    _refuse_unsupported(use_dynamic_ntk, use_logn_attn, seqlen_extrapolation, derive_type)
    if do_dynamic_quantize_convert and quant_config is None:
        raise ModelSerializerException("do_dynamic_quantize_convert=True needs a quant_config (a QuantizeConfig)")
    architecture, config, hf = _config(model_type, hf_class, model_config, rotary_base)
    state = torch_model.state_dict() if hasattr(torch_model, "state_dict") else torch_model
    if not hasattr(state, "keys") or not hasattr(state, "__getitem__"):
        raise ModelSerializerException(
            f"torch_model must be a state_dict (name -> tensor) or a torch module, got {type(torch_model).__name__}")
    tensors = StateTensors(state)
    fam = family(architecture)
    if fam.stored_quant == "mxfp4":  # a module loaded from an MXFP4 checkpoint holds its experts dequantized
        config.mxfp4_experts = holds_mxfp4(state.keys())
    tensors = fam.checkpoint_view(tensors, config)
    _check_tensors(tensors, config, architecture)
    source_dir = hf.get("_name_or_path") or ""
    report = write_serialized(
        save_dir, model_name, model_name=model_name, architecture=architecture, config=config, dtype=data_type,
        quant_settings=_quant_settings(quant_config) if do_dynamic_quantize_convert else None,
        fetch=tensors.fetch,
        generation_config={"eos_token_id": list(config.eos_token_id)},
        save_tokenizer=lambda out: os.path.isdir(source_dir) and copy_tokenizer_files(source_dir, out),
        progress=progress, suffixes=V13_SUFFIXES)
    return report


def _refuse_unsupported(use_dynamic_ntk, use_logn_attn, seqlen_extrapolation, derive_type):
    if use_dynamic_ntk or use_logn_attn:
        raise ModelSerializerException("use_dynamic_ntk / use_logn_attn (Qwen 1.0's long-context tricks) are not "
                                       "supported: the model would compute something else past its context")
    if seqlen_extrapolation != 1.0:
        raise ModelSerializerException(f"seqlen_extrapolation={seqlen_extrapolation!r} is not supported (only 1.0); "
                                       "RoPE scaling comes from the model config's rope_scaling")
    if derive_type != "lmhead":
        raise ModelSerializerException(f"derive_type={derive_type!r} is not supported (only 'lmhead': a causal LM)")


def _config(model_type, hf_class, model_config, rotary_base):
    """(architecture, ModelConfig, the config as a plain dict) from a Hugging Face config dict."""
    if hasattr(model_config, "to_dict"):
        model_config = model_config.to_dict()
    if not isinstance(model_config, dict):
        raise ModelSerializerException(
            f"model_config must be the model's config as a dict, got {type(model_config).__name__}")
    hf = dict(model_config)
    named = hf.get("architectures") or [hf_class]
    if hf_class not in named:
        raise ModelSerializerException(
            f"model_type {model_type!r} is a {hf_class}, but model_config describes {', '.join(named)}")
    hf["architectures"] = [hf_class]
    architecture, config = normalize_hf_config(hf)
    if rotary_base is not None:
        config.rope_theta = rotary_base
        config.validate("rotary_base")
    return architecture, config, hf


class StateTensors:
    """A state_dict as the checkpoint interface families' views and write_serialized read."""

    def __init__(self, state):
        self.state = state

    def keys(self):
        return list(self.state.keys())

    def __contains__(self, name):
        return name in self.state

    def shape(self, name):
        return tuple(self.state[name].shape)

    def fetch(self, name, *codes):
        return torch_tensor_to_numpy(name, self.state[name], "torch_model", *codes)


def _check_tensors(state, config, architecture):
    shapes = weight_shapes(config, architecture)
    missing = [n for n in shapes if n not in state]
    if missing:
        raise ModelSerializerException(f"torch_model lacks tensor(s) {', '.join(missing[:5])}"
                                       + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    extra = unexpected_tensors(state.keys(), config, architecture)
    if extra:
        raise ModelSerializerException(f"torch_model has tensor(s) this architecture does not use: "
                                       f"{', '.join(sorted(extra)[:5])}")
    for name, shape in shapes.items():
        if tuple(state.shape(name)) != shape:
            raise ModelSerializerException(
                f"tensor '{name}' of torch_model has shape {list(state.shape(name))}, the config implies {list(shape)}")


def _quant_settings(quant_config):
    from ..quantization import QuantizeConfig
    from .quant import InstantQuantSettings
    if not isinstance(quant_config, QuantizeConfig):
        raise ModelSerializerException(f"quant_config must be a QuantizeConfig, got {type(quant_config).__name__}")
    return InstantQuantSettings.from_config(quant_config.customized_quant_config())
