"""The serialized model: {prefix}.asgraph (JSON) + {prefix}.asparam (safetensors) + {prefix}.tokenizer/.

The .asgraph says what the model is (architecture, hyper-parameters, dtype, quantization, tensor
manifest, generation defaults); the .asparam holds the tensors under Hugging Face LLaMA names,
unsharded, so any rank can map it and slice its own shard. Files are written under temporary names
and renamed, the .asgraph last: an .asgraph on disk means a complete model. The same two files
may be named {prefix}.dimodel + {prefix}.ditensors instead, the names DashInfer 1.3's
serialize_model_from_torch wrote (dashinfer_client/model/torch_model.py writes them so).
"""
import json
import os

import numpy as np

from ..dtypes import from_bf16, to_bf16
from ..errors import ModelSerializerException, malformed
from .arch import ModelConfig
from .families import family
from .families.fused_experts import MXFP4_PARTS
from .base import ModelHandle
from .conversion_files import remove, remove_stale_temporaries, temporary, writing
from .conversion_fit import refuse_what_will_not_fit, refuse_what_will_not_fit_on_disk
from .quant import PARTS, InstantQuantSettings, QuantErrorStats, quantize
from .safetensors_io import SafetensorsFile, SafetensorsWriter, drop_mapped_pages, planned_size

FORMAT = "dashinfer-py"
VERSION = 2  # 2: uint4 group parameters as codes (quant.PARTS); 1 kept them as float32 pairs
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}  # user dtype -> safetensors code


# (graph, params) file suffixes: ours, then DashInfer 1.3's names (its serialize_model_from_torch
# wrote {name}.dimodel + {name}.ditensors). The content is this format either way.
SUFFIXES = (".asgraph", ".asparam")
V13_SUFFIXES = (".dimodel", ".ditensors")


def model_files(model_dir, prefix):
    """(graph, params) paths of model `prefix` in model_dir, under the names on disk (ours when
    neither is there). Writing one pair removes the other, so at most one is present."""
    for suffixes in (SUFFIXES, V13_SUFFIXES):
        paths = tuple(os.path.join(model_dir, prefix + s) for s in suffixes)
        if os.path.exists(paths[0]):
            return paths
    return tuple(os.path.join(model_dir, prefix + s) for s in SUFFIXES)


def graph_path(model_dir, prefix):
    return model_files(model_dir, prefix)[0]


def param_path(model_dir, prefix):
    return model_files(model_dir, prefix)[1]


def tokenizer_dir_name(prefix):
    return prefix + ".tokenizer"


MAX_LAYERS = 10_000  # far past any real model; a config claiming more is a broken file, refused
#                     before anything loops over its layers


def weight_shapes(config, architecture):
    """{HF tensor name: shape} of the unquantized model of this architecture, in layer order."""
    if not 0 < config.num_hidden_layers <= MAX_LAYERS:
        raise ModelSerializerException(f"num_hidden_layers {config.num_hidden_layers} is not within 1..{MAX_LAYERS}")
    return family(architecture).weight_shapes(config)


def mxfp4_tensors(config, shapes):
    """The weights of weight_shapes' {name: shape} stored as MXFP4 blocks and scales (gpt-oss's
    experts when the checkpoint holds them so): kept as they are, never converted or re-quantized."""
    if not config.mxfp4_experts:
        return set()
    return {n for n in shapes if ".experts." in n and n.endswith(".weight")}


def expected_tensors(config, architecture, dtype, quantization):
    """{stored tensor name: (safetensors dtype code, shape)} for a config, dtype and quantization dict."""
    code = DTYPES[dtype]
    quantized, settings = set(), None
    if quantization:
        settings = InstantQuantSettings(quantization["weight_format"], quantization["group_size"])
        quantized = set(quantization["quantized"])
    shapes = weight_shapes(config, architecture)
    mxfp4 = mxfp4_tensors(config, shapes)
    fp32 = family(architecture).held_in_fp32(shapes)
    out = {}
    for name, shape in shapes.items():
        if name in mxfp4:
            n, k = shape
            out[f"{name}.{MXFP4_PARTS[0]}"] = ("U8", (n, k // 2))
            out[f"{name}.{MXFP4_PARTS[1]}"] = ("U8", (n, k // 32))
        elif name in quantized:
            for (part, part_code), part_shape in zip(PARTS[settings.weight_format], settings.packed_shapes(*shape)):
                out[f"{name}.{part}"] = (part_code, part_shape)
        else:
            out[name] = ("F32" if name in fp32 else code, shape)
    return out


def convert_dtype(array, source_code, dtype):
    """A float tensor (numpy; BF16 as uint16 bits) -> storage array of the user dtype, exact when unchanged."""
    target = DTYPES[dtype]
    if source_code == target:
        return array
    as_f32 = from_bf16(array) if source_code == "BF16" else np.asarray(array, dtype=np.float32)
    if target == "BF16":
        return to_bf16(as_f32)
    return as_f32.astype(np.float16 if target == "F16" else np.float32)


def as_float32(array, source_code):
    return from_bf16(array) if source_code == "BF16" else np.asarray(array, dtype=np.float32)


def write_serialized(model_dir, prefix, *, model_name, architecture, config, dtype, quant_settings,
                     fetch, generation_config, save_tokenizer, progress=False, suffixes=SUFFIXES):
    """Convert and write a model; returns a report (sizes, seconds, quantization error).

    fetch(name) -> (numpy array, source dtype code) gives each HF-named tensor of weight_shapes(config)
    in its checkpoint dtype; save_tokenizer(dir) writes the tokenizer files and returns True, or False
    when the source has none. Everything is written under temporary names first; on any error they
    are removed and an existing model of the same prefix is left as it was.
    """
    import time
    begin = time.time()
    if dtype not in DTYPES:
        raise ModelSerializerException(f"unsupported data type {dtype!r}: use one of {', '.join(DTYPES)}")
    quantization = None
    shapes = weight_shapes(config, architecture)
    mxfp4 = mxfp4_tensors(config, shapes)
    if quant_settings is not None:
        quantization = {"method": "instant_quant", "weight_format": quant_settings.weight_format,
                        "group_size": quant_settings.group_size, "compute_method": quant_settings.compute_method,
                        "quantized": [n for n in quant_settings.quantized_names(shapes) if n not in mxfp4]}
    manifest = expected_tensors(config, architecture, dtype, quantization)
    layout = [(n, c, s) for n, (c, s) in manifest.items()]
    metadata = {"format": FORMAT, "model_name": model_name}
    tok_name = tokenizer_dir_name(prefix)
    graph = {"format": FORMAT, "version": VERSION, "model_name": model_name, "architecture": architecture,
             "config": config.to_dict(), "dtype": dtype, "quantization": quantization,
             "tensors": {n: {"dtype": c, "shape": list(s)} for n, (c, s) in manifest.items()},
             "generation_config": generation_config, "tokenizer": tok_name}
    sizes = [planned_size(layout, metadata), len(_graph_text(graph))]  # the tokenizer's name: the longer graph
    refuse_what_will_not_fit(model_dir, model_name, shapes, quantization["quantized"] if quantization else (), sizes)
    os.makedirs(model_dir, exist_ok=True)
    remove_stale_temporaries(model_dir)
    final = {"tok": os.path.join(model_dir, tok_name), "param": os.path.join(model_dir, prefix + suffixes[1]),
             "graph": os.path.join(model_dir, prefix + suffixes[0])}
    temp = {key: temporary(path) for key, path in final.items()}
    try:
        with writing(final["tok"]):
            remove(temp["tok"])
            os.makedirs(temp["tok"])
            has_tokenizer = save_tokenizer(temp["tok"])
        refuse_what_will_not_fit_on_disk(model_dir, model_name, sizes)  # the tokenizer's blocks are taken now
        stats = _write_params((temp["param"], final["param"]), layout, metadata, shapes, mxfp4, dtype,
                              quant_settings, quantization, fetch, model_name, progress)
        graph["tokenizer"] = tok_name if has_tokenizer else None
        with writing(final["graph"]), open(temp["graph"], "w") as f:
            f.write(_graph_text(graph))
    except BaseException:  # an error, Ctrl-C, or SIGTERM as the command line raises it
        for path in temp.values():
            remove(path)
        raise
    for other in (SUFFIXES, V13_SUFFIXES):  # a stale graph must never describe the new params
        for suffix in other:
            remove(os.path.join(model_dir, prefix + suffix))
    os.replace(temp["param"], final["param"])
    remove(final["tok"])
    if has_tokenizer:
        os.replace(temp["tok"], final["tok"])
    else:
        remove(temp["tok"])
    os.replace(temp["graph"], final["graph"])
    report = {"model_dir": model_dir, "prefix": prefix, "dtype": dtype,
              "asparam_bytes": os.path.getsize(final["param"]), "asgraph_bytes": os.path.getsize(final["graph"]),
              "seconds": round(time.time() - begin, 3), "quantization": None}
    if quantization:
        report["quantization"] = {"weight_format": quant_settings.weight_format,
                                  "group_size": quant_settings.group_size, **stats.summary()}
    return report


def _graph_text(graph):
    return json.dumps(graph, indent=1)


def _write_params(paths, layout, metadata, shapes, mxfp4, dtype, quant_settings, quantization, fetch, model_name, progress):
    """The .asparam at paths (temporary, final), one source tensor in memory at a time
    (conversion_fit.conversion_memory_bound); returns the quantization error stats. A failed write
    names the final file; a failed read (fetch) stays the source's error."""
    quantized = set(quantization["quantized"]) if quantization else set()
    manifest = {name: (code, shape) for name, code, shape in layout}
    with writing(paths[1]):
        writer = SafetensorsWriter(paths[0], layout, metadata=metadata)

    def put(name, array):
        with writing(paths[1]):
            writer.write(name, array)
    stats = QuantErrorStats()
    try:
        for name in _progress(shapes, progress, f"serializing {model_name}"):
            if name in mxfp4:
                for part in MXFP4_PARTS:
                    stored = f"{name}.{part}"
                    array, code = fetch(stored)
                    want = manifest[stored][1]
                    if code != "U8" or tuple(array.shape) != want:
                        raise ModelSerializerException(
                            f"tensor '{stored}' is {code}{list(array.shape)}, the config implies U8{list(want)}")
                    put(stored, array)
                    drop_mapped_pages(array)
                continue
            array, code = fetch(name)
            if tuple(array.shape) != shapes[name]:
                raise ModelSerializerException(
                    f"tensor '{name}' has shape {list(array.shape)}, the config implies {list(shapes[name])}")
            if name in quantized:
                source = array if code == "BF16" else as_float32(array, code)  # bf16: read in place, no copy
                try:
                    parts = quantize(source, quant_settings.weight_format, quant_settings.group_size, stats)
                except ModelSerializerException as e:
                    raise ModelSerializerException(f"tensor '{name}': {e}") from None
                for (part, _), value in zip(PARTS[quant_settings.weight_format], parts):
                    put(f"{name}.{part}", value)
            else:  # a tensor held in fp32 whatever the dtype (expected_tensors) is converted so
                put(name, convert_dtype(array, code, "float32" if manifest[name][0] == "F32" else dtype))
            drop_mapped_pages(array)  # the source's pages leave this process: one tensor resident at a time
    except BaseException:
        writer.abort()
        raise
    with writing(paths[1]):
        writer.close()
    return stats


def _check_version(graph, gpath):
    """This VERSION, or version 1 but for its uint4 weights (their float32 group pairs are no
    longer read): refused with what to do."""
    version = graph.get("version")
    if version == 1 and (graph.get("quantization") or {}).get("weight_format") == "uint4":
        raise ModelSerializerException(
            f"{gpath} holds uint4 weights of format version 1 (float32 group scales and zeros, 6 bits a "
            f"weight); this reader keeps uint4 in 4.5 bits (version {VERSION}): convert the model again "
            f"from its checkpoint")
    if version not in (1, VERSION):
        raise ModelSerializerException(f"{gpath} has format version {version}, this reader knows version {VERSION}")


def _progress(items, enabled, desc):
    if not enabled:
        return items
    from tqdm import tqdm
    return tqdm(items, desc=desc, unit="tensor", leave=False)


# DashInfer's own .dimodel/.asgraph files are protobuf: the same names, another format.
_FOREIGN_HINT = ("; a model converted by DashInfer itself cannot be read here: convert the original "
                 "checkpoint with this package (HuggingFaceModel, or serialize_model_from_torch)")
DI_CONFIG_NAME = "dimodel_config.yaml"  # DashInfer's DIConfig file beside a model


class DashInferModel(ModelHandle):
    """A serialized model loaded without its original checkpoint, in DashInfer's argument order:
    DashInferModel(model_dir, prefix="model", config_file_path=None, config_content=None).

    Checks on load: both files present, valid JSON of this format, every tensor the config needs in
    the .asparam with the dtype and shape the config implies, and the .asparam not truncated.
    A DIConfig YAML (config_content, else config_file_path, else {model_dir}/dimodel_config.yaml
    when present) supplies the defaults of create_reference_runtime_config_builder() (its
    runtime_config section) and of create_reference_generation_config_builder() (its
    generation_config section); without one they come from the .asgraph. Its model section is not
    read: the .asgraph describes the model.
    """

    def __init__(self, model_dir, prefix="model", config_file_path=None, config_content=None):
        super().__init__()
        self.model_dir = str(model_dir)
        self.prefix = prefix
        gpath, ppath = graph_path(self.model_dir, prefix), param_path(self.model_dir, prefix)
        for path in (gpath, ppath):
            if not os.path.exists(path):
                raise ModelSerializerException(f"serialized model file {path} is missing")
        try:
            with open(gpath) as f:
                graph = json.load(f)
        except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON, or not text at all
            raise ModelSerializerException(f"{gpath} is not valid JSON: {e}{_FOREIGN_HINT}") from None
        if not isinstance(graph, dict) or graph.get("format") != FORMAT:
            raise ModelSerializerException(f"{gpath} is not a {FORMAT} model graph{_FOREIGN_HINT}")
        _check_version(graph, gpath)
        for key in ("model_name", "architecture", "config", "dtype", "tensors"):
            if key not in graph:
                raise ModelSerializerException(f"{gpath} lacks '{key}'")
        with malformed(gpath):
            if graph["dtype"] not in DTYPES:
                raise ModelSerializerException(f"{gpath}: unknown dtype {graph['dtype']!r}")
            self.graph = graph
            self.model_name = graph["model_name"]
            self.architecture = graph["architecture"]
            self.config = ModelConfig.from_dict(graph["config"], where=f"config in {gpath}")
            self.dtype = graph["dtype"]
            self.quantization = graph.get("quantization")
            self.generation_config = graph.get("generation_config") or {}
            self._params = SafetensorsFile(ppath)
            self._check_tensors(gpath, ppath)
        self.di_config = _read_di_config(self.model_dir, config_file_path, config_content)
        self.generation_config = self.di_config.get("generation_config") or self.generation_config

    def _reference_runtime_fields(self):
        return self.di_config.get("runtime_config") or {}

    def _check_tensors(self, gpath, ppath):
        try:
            expected = expected_tensors(self.config, self.architecture, self.dtype, self.quantization)
        except (KeyError, TypeError) as e:
            raise ModelSerializerException(f"{gpath}: malformed quantization entry ({e!r})") from None
        for name, (code, shape) in expected.items():
            if name not in self._params:
                raise ModelSerializerException(f"tensor '{name}' is missing from {ppath}")
            got_code, got_shape = self._params.info(name)
            if got_code != code or tuple(got_shape) != tuple(shape):
                raise ModelSerializerException(
                    f"tensor '{name}' in {ppath} is {got_code}{list(got_shape)}, the config in {gpath} "
                    f"implies {code}{list(shape)}")

    def tensor(self, name):
        """Zero-copy read-only numpy view (BF16 as uint16 bits)."""
        return self._params.get(name)

    def tensor_names(self):
        return self._params.keys()

    def tensor_dtype(self, name):
        return self._params.info(name)[0]

    def _tokenizer_path(self):
        name = self.graph.get("tokenizer")
        if not name:
            raise ModelSerializerException(f"serialized model {self.prefix} in {self.model_dir} has no tokenizer")
        path = os.path.join(self.model_dir, name)
        if not os.path.isdir(path):
            raise ModelSerializerException(f"tokenizer directory {path} is missing")
        return path

    def _serialized_location(self):
        return self.model_dir, self.prefix

    # DashInfer's DashInferModel is already converted: these steps have nothing to do.
    def load_model(self, *args, **kwargs):
        return self

    def read_model_config(self):
        return self

    def serialize_to_path(self, *args, **kwargs):
        return self

    def serialize_to_memory(self, *args, **kwargs):
        return self

    def free_memory_serialize_file(self):
        return self

    def free_model(self):
        return self


def _read_di_config(model_dir, path, content):
    """The DIConfig dict (content wins over path; {} when neither is given nor beside the model),
    with its runtime_config section checked now so a bad one fails here and not at install."""
    import yaml
    from ..runtime_config import AsModelRuntimeConfigBuilder
    where = "config_content"
    if content is None:
        where = path or os.path.join(model_dir, DI_CONFIG_NAME)
        if path is None and not os.path.exists(where):
            return {}
        try:
            with open(where) as f:
                content = f.read()
        except OSError as e:
            raise ModelSerializerException(f"cannot read the DIConfig {where}: {e}") from None
    try:
        doc = yaml.safe_load(content)
    except yaml.YAMLError as e:
        raise ModelSerializerException(f"{where} is not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ModelSerializerException(f"{where} is not a DIConfig (a YAML mapping)")
    for section in ("runtime_config", "generation_config"):
        if not isinstance(doc.get(section) or {}, dict):
            raise ModelSerializerException(f"{where}: {section} must be a mapping")
    try:
        AsModelRuntimeConfigBuilder().update_from_dict(doc.get("runtime_config") or {})
    except ValueError as e:
        raise ModelSerializerException(f"runtime_config in {where}: {e}") from None
    return doc
