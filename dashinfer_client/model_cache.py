"""Model resolution and the conversion cache shared by the front doors (pipeline, HTTP server, CLI).

    model_dir, prefix = resolve_model(model_path, dtype="bfloat16", quant=None)

model_path is one of
  - None or the default model's name: the default model (dashinfer_client.default_model);
  - a Hugging Face checkpoint directory (config.json) or a GGUF file: converted once into
    {cache}/models/ under a prefix keyed on the source (path, and size + mtime of its files), dtype
    and quantization, and reused as long as the source is unchanged;
  - a directory holding one serialized model ({prefix}.asgraph), or the path of an .asgraph itself
    (or {dir}/{prefix}): used where it is.
cache = cache_dir argument, else $DASHINFER_CACHE, else ~/.cache/dashinfer-py. Conversions hold a
lock on the cache, so two processes resolving the same model convert it once.
"""
import contextlib
import glob
import hashlib
import json
import os
import re

from . import settings
from .errors import ModelSerializerException
from .model.quant import DEFAULT_GROUPS

QUANT_FORMATS = ("int8", "uint4")
FLOAT = "none"  # a quant that asks for float weights where the default would quantize (a 4-bit release)
DEFAULT_DTYPE = "bfloat16"
GGUF_MAGIC = b"GGUF"


def cache_root(cache_dir=None):
    return os.path.abspath(os.path.expanduser(
        cache_dir or settings.get("DASHINFER_CACHE") or os.path.join("~", ".cache", "dashinfer-py")))


@contextlib.contextmanager
def cache_lock(root):
    """One converter at a time per cache (tests and servers may start together)."""
    import fcntl
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_converted(model_dir, prefix):
    """Cheap check for a cached conversion: the .asgraph is renamed into place last (after the
    .tokenizer, which a source without a tokenizer does not have)."""
    return all(os.path.exists(os.path.join(model_dir, prefix + ext)) for ext in (".asgraph", ".asparam"))


def check_dtype_quant(dtype, quant):
    from .model.serialized import DTYPES
    if dtype not in DTYPES:
        raise ModelSerializerException(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if quant not in (None, FLOAT) + QUANT_FORMATS:
        raise ModelSerializerException(f"quant {quant!r} is not one of None, {FLOAT!r}, {', '.join(QUANT_FORMATS)}")


def convert_once(make_loader, root, model_dir, prefix, quant):
    """Serialize make_loader() into model_dir/prefix unless it is there already -> (model_dir, prefix).
    make_loader() returns a SourceModel (HuggingFaceModel, GGUFModel) not loaded yet."""
    from .model.serialized import DashInferModel
    if is_converted(model_dir, prefix):
        return model_dir, prefix
    with cache_lock(root):
        if not is_converted(model_dir, prefix):
            loader = make_loader()
            # our measured default groups (DashInfer's API defaults to per-channel)
            quant_config = None if quant is None else {"quant_method": "instant_quant", "weight_format": quant,
                                                       "group_size": DEFAULT_GROUPS[quant]}
            loader.load_model().read_model_config().serialize_to_path(
                None, model_dir, enable_quant=quant is not None, weight_only_quant=True,
                customized_quant_config=quant_config)
            loader.free_model()
    DashInferModel(model_dir, prefix)  # full check once, right after conversion
    return model_dir, prefix


def resolve_model(model_path=None, dtype=None, quant=None, cache_dir=None, progress=False):
    """(model_dir, prefix) of the serialized model that model_path names, converting it on first use.

    dtype: "bfloat16" (default for conversions) | "float32" | "float16"; quant: None | "int8" | "uint4" |
    "none". None converts a checkpoint quantized as released at its own width (hf.release_quant: a
    4-bit AWQ release as uint4) and anything else unquantized; "none" asks for float weights always.
    For an already serialized model, dtype/quant None accept what it holds; a different value is refused.
    """
    from . import default_model
    from .model.hf import release_quant
    if model_path is None or model_path == default_model.MODEL_NAME:
        check_dtype_quant(dtype or DEFAULT_DTYPE, quant)
        return default_model.ensure_default_model(dtype or DEFAULT_DTYPE, None if quant == FLOAT else quant,
                                                  cache_dir, progress=progress)
    if not isinstance(model_path, (str, os.PathLike)):
        raise TypeError(f"model_path must be a path (str) or None, got {type(model_path).__name__}")
    path = os.path.abspath(os.path.expanduser(os.fspath(model_path)))
    serialized = _serialized_location(path)
    if serialized is not None:
        return _check_serialized(*serialized, dtype, quant)
    if not os.path.exists(path):
        raise ModelSerializerException(_missing_message(os.fspath(model_path)))
    check_dtype_quant(dtype or DEFAULT_DTYPE, quant)
    kind = _source_kind(path)
    if kind == "hf":
        from .model.hf import HuggingFaceModel as loader_class
    elif kind == "gguf":
        from .model.gguf_loader import GGUFModel as loader_class
    elif os.path.isdir(path):
        raise ModelSerializerException(
            f"model_path {path} is neither a Hugging Face checkpoint (no config.json) nor a directory "
            "of a serialized model (no .asgraph)")
    else:
        raise ModelSerializerException(f"model_path {path} is a file but not a GGUF model (no GGUF header)")
    dtype = dtype or DEFAULT_DTYPE
    if quant is None and kind == "hf":
        quant = release_quant(path)
    quant = None if quant == FLOAT else quant
    root = cache_root(cache_dir)
    prefix = cached_prefix(path, dtype, quant)
    return convert_once(lambda: loader_class(path, prefix, user_set_data_type=dtype, progress=progress),
                        root, os.path.join(root, "models"), prefix, quant)


def model_format(model_path):
    """'gguf', 'hf' or 'dashinfer' (serialized): the kind of model model_path names, read without
    converting it (None / the default model's name: its GGUF file); None when it names no model
    (resolve_model says why)."""
    from . import default_model
    if model_path is None or model_path == default_model.MODEL_NAME:
        return "gguf"
    if not isinstance(model_path, (str, os.PathLike)):
        return None
    path = os.path.abspath(os.path.expanduser(os.fspath(model_path)))
    return "dashinfer" if _serialized_location(path) is not None else _source_kind(path)


def _source_kind(path):
    """'hf' (a directory with config.json), 'gguf' (a file with GGUF's header) or None."""
    if os.path.isdir(path):
        return "hf" if os.path.isfile(os.path.join(path, "config.json")) else None
    return "gguf" if os.path.isfile(path) and _is_gguf(path) else None


def cached_prefix(path, dtype, quant):
    """{name}-{dtype}[-{quant}]-{digest of the source path and its files' sizes and mtimes}."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(path.rstrip(os.sep)))
    if name.lower().endswith(".gguf"):
        name = name[:-5]
    digest = hashlib.sha256(json.dumps([path, _fingerprint(path)]).encode()).hexdigest()[:12]
    return f"{name}-{dtype}" + quant_suffix(quant) + f"-{digest}"


def quant_suffix(quant):
    """The part of a cached model's name that says how it was quantized (format and group)."""
    return "-" + quant_tag(quant, DEFAULT_GROUPS[quant]) if quant else ""


def quant_tag(quant, group):
    """format-g{group}; uint4 with a "c" (its group codes, serialized format 2), so that a cache
    converted with float32 group pairs (format 1, refused now) is converted again, not reused."""
    return f"{quant}-g{group}" + ("c" if quant == "uint4" else "")


def _fingerprint(path):
    """Size and mtime of the file, or of every file directly in the directory."""
    if os.path.isfile(path):
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    entries = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            st = os.stat(full)
            entries.append([name, st.st_size, st.st_mtime_ns])
    return entries


def _serialized_location(path):
    """(model_dir, prefix) when path names a serialized model, else None."""
    if path.endswith(".asgraph") and os.path.isfile(path):
        return os.path.dirname(path), os.path.basename(path)[:-len(".asgraph")]
    if os.path.isfile(path + ".asgraph"):
        return os.path.dirname(path), os.path.basename(path)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        graphs = sorted(glob.glob(os.path.join(glob.escape(path), "*.asgraph")))
        if len(graphs) == 1:
            return path, os.path.basename(graphs[0])[:-len(".asgraph")]
        if len(graphs) > 1:
            names = ", ".join(os.path.basename(g)[:-len(".asgraph")] for g in graphs)
            raise ModelSerializerException(
                f"model_path {path} holds several serialized models ({names}); name one as {path}/<prefix>")
    return None


def _check_serialized(model_dir, prefix, dtype, quant):
    from .model.serialized import DashInferModel
    model = DashInferModel(model_dir, prefix)
    held_quant = (model.quantization or {}).get("weight_format")
    if dtype is not None and dtype != model.dtype:
        raise ModelSerializerException(
            f"the serialized model {model_dir}/{prefix} holds {model.dtype} weights, not {dtype}; "
            "convert the original checkpoint to change the dtype")
    if quant is not None and (None if quant == FLOAT else quant) != held_quant:
        raise ModelSerializerException(
            f"the serialized model {model_dir}/{prefix} is quantized as {held_quant}, not {quant}; "
            "convert the original checkpoint to change the quantization")
    return model_dir, prefix


def _is_gguf(path):
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _missing_message(given):
    looks_like_hub_id = re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", given) is not None
    if looks_like_hub_id:
        return (f"model_path {given!r} is not a local path, and this machine cannot download from a model hub. "
                f"Copy the model here (e.g. `huggingface-cli download {given} --local-dir DIR` on a machine "
                "with network access), then pass the local directory (a Hugging Face checkpoint or a .gguf "
                "file); it is converted once into the cache. `dashinfer_client.HuggingFaceModel(DIR, name)"
                ".load_model().read_model_config().serialize_to_path(None, OUT_DIR)` converts it ahead of time.")
    return f"model_path {given!r} does not exist"
