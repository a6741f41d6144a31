"""The model a benchmark runs: the default model, or any model by path, serialized once.

    --model default                      SmolLM2-135M-Instruct (dashinfer_client.default_model)
    --model DIR                          a Hugging Face directory (config.json + weights)
    --model FILE.gguf                    a GGUF file
    --model DIR/PREFIX                   a serialized model (DIR/PREFIX.asgraph + .asparam)

A source model is converted with the bench's dtype and quantization into the cache
(~/.cache/dashinfer/bench, or DASHINFER_CACHE), once: later runs find it there.
"""
import hashlib
import os

from dashinfer_client import default_model
from dashinfer_client.model import DashInferModel, GGUFModel, HuggingFaceModel
from dashinfer_client.model.quant import DEFAULT_GROUPS
from dashinfer_client.model.serialized import graph_path
from dashinfer_client.model_cache import quant_tag


def quant_config(quant, group_size=None):
    """DashInfer's customized_quant_config for InstantQuant, or None for float weights."""
    if quant is None:
        return None
    return {"quant_method": "instant_quant", "weight_format": quant, "group_size": group_size or DEFAULT_GROUPS[quant]}


def resolve(model: str, dtype="bfloat16", quant=None, group_size=None) -> tuple:
    """(model_dir, prefix) of the serialized model `model` names (see the module docstring)."""
    if model == "default" and not group_size:
        return default_model.ensure_default_model(dtype, quant=quant, progress=False)
    if model == "default":
        model = default_model.default_model_path()
    path = os.path.abspath(os.path.expanduser(model))
    if os.path.exists(graph_path(os.path.dirname(path), os.path.basename(path))):
        if quant or group_size:
            raise SystemExit(f"{model} is serialized already: its weights are what they are (no --quant)")
        return os.path.dirname(path), os.path.basename(path)
    if os.path.isdir(path):
        source = HuggingFaceModel
    elif path.endswith(".gguf") and os.path.isfile(path):
        source = GGUFModel
    else:
        raise SystemExit(f"--model {model}: not a Hugging Face directory, a .gguf file or a serialized "
                         "DIR/PREFIX")
    tag = hashlib.sha1(path.encode()).hexdigest()[:8]
    prefix = "-".join([os.path.basename(path.rstrip("/")).replace(".gguf", ""), tag, dtype]
                      + ([quant_tag(quant, group_size or DEFAULT_GROUPS[quant])] if quant else []))
    out = os.path.join(default_model.cache_root(), "bench")
    if not os.path.exists(graph_path(out, prefix)):
        loader = source(path, prefix, user_set_data_type=dtype, progress=False)
        loader.load_model().read_model_config().serialize_to_path(
            None, out, enable_quant=quant is not None, weight_only_quant=True,
            customized_quant_config=quant_config(quant, group_size))
        loader.free_model()
    return out, prefix


def load(model: str, dtype="bfloat16", quant=None, group_size=None) -> DashInferModel:
    return DashInferModel(*resolve(model, dtype, quant, group_size))
