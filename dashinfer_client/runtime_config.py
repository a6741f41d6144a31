"""How a model is served: AsModelRuntimeConfigBuilder -> AsModelRuntimeConfig (DashInfer's
runtime_config module; its AsModelConfig struct is in as_model_config.py).

The built config is a plain dataclass, validated when constructed, with to_dict()/from_dict() for
the gRPC wire; it also reads under DashInfer's AsModelConfig attribute names (engine_max_length,
num_threads, compute_unit "CPU:0", ...). A bad value fails where it is set, with a ValueError naming
the key and what it accepts; keys nobody knows are refused rather than ignored.
"""
import os
from dataclasses import dataclass, field, fields

from .as_model_config import AsModelConfig  # noqa: F401 (DashInfer's runtime_config has it)
from .options import AsEvictionStrategy, AsMHAPrefill, AsSchedulingStrategy
from .types import AsCacheMode, TargetDevice
from .checks import check_bool, check_enum, check_ids, check_int, check_keys, check_str

_SPAN_SIZES = (16, 32, 64, 128)
DEFAULT_PREFIX_CACHE_TTL = 300  # seconds, DashInfer's


def _device_ids(unit, ids):
    if unit == TargetDevice.CPU:
        return [0]  # a single-process CPU model has no device choice (DashInfer: "CPU:0")
    ids = check_ids("device_ids", ids)
    if not ids or len(set(ids)) != len(ids):
        raise ValueError(f"device_ids must be distinct NUMA node numbers, at least one, got {ids}")
    return ids


def _span_size(v):
    v = check_int("kv_cache_span_size", v)
    if v not in _SPAN_SIZES:
        raise ValueError(f"kv_cache_span_size must be one of {', '.join(map(str, _SPAN_SIZES))}, got {v}")
    return v


def parse_compute_unit(text):
    """DashInfer's compute unit string -> (TargetDevice, device ids): "CPU:0" is one process,
    "CPU:0,1" (or "CPU_NUMA:0,1") one tensor-parallel rank per listed NUMA node."""
    kind, ids = AsModelRuntimeConfigBuilder.parse_device_type(text)
    if kind == "CPU" and len(ids) <= 1:
        return TargetDevice.CPU, [0]
    return TargetDevice.CPU_NUMA, ids


def get_cache_mode_from_str(name):
    """DashInfer's helper: "AsCacheQuantI8" -> AsCacheMode.AsCacheQuantI8."""
    return check_enum("kv_cache_mode", AsCacheMode, check_str("kv_cache_mode", name))


@dataclass
class AsModelRuntimeConfig:
    """How a model is served. The model files are {model_dir}/{model_prefix}.asgraph and .asparam.

    device_type / device_ids: TargetDevice.CPU (device_ids is then [0]) or TargetDevice.CPU_NUMA
    with one tensor-parallel rank per listed NUMA node. thread_num: compute threads per rank, 0 =
    every core of the node. max_length: the longest request (prompt + generated). max_batch: requests
    running at once. max_prefill_length: prompt tokens computed per scheduler step, 0 = the engine
    chooses. prefill_cache: reuse the KV cache of shared prompt prefixes; prefix_cache_ttl: seconds a
    cached prefix nobody uses is kept. kv_cache_span_size: tokens per KV cache block.
    kv_cache_memory_mb: the KV cache budget, 0 = room for max_batch x max_length. lora_max_rank,
    lora_max_num: DashInfer's LoRA limits, kept for reading (this runtime loads no LoRA adapters).
    """
    model_name: str = ""
    model_dir: str = ""
    model_prefix: str = ""
    device_type: TargetDevice = TargetDevice.CPU
    device_ids: list = field(default_factory=lambda: [0])
    thread_num: int = 0
    max_batch: int = 32
    max_length: int = 2048
    max_prefill_length: int = 0
    prefill_cache: bool = True
    prefix_cache_ttl: int = DEFAULT_PREFIX_CACHE_TTL
    kv_cache_mode: AsCacheMode = AsCacheMode.AsCacheDefault
    kv_cache_span_size: int = 32
    kv_cache_memory_mb: int = 0
    lora_max_rank: int = 64
    lora_max_num: int = 5

    def __post_init__(self):
        self.model_name = check_str("model_name", self.model_name)  # may stay empty until install_model
        self.model_dir = check_str("model_dir", self.model_dir)
        self.model_prefix = check_str("model_prefix", self.model_prefix)
        self.device_type = check_enum("compute_unit", TargetDevice, self.device_type)
        self.device_ids = _device_ids(self.device_type, self.device_ids)
        for key, lo in (("thread_num", 0), ("max_batch", 1), ("max_length", 1), ("max_prefill_length", 0),
                        ("prefix_cache_ttl", 1), ("kv_cache_memory_mb", 0), ("lora_max_rank", 1),
                        ("lora_max_num", 1)):
            setattr(self, key, check_int(key, getattr(self, key), lo))
        self.prefill_cache = check_bool("prefill_cache", self.prefill_cache)
        self.kv_cache_mode = check_enum("kv_cache_mode", AsCacheMode, self.kv_cache_mode)
        self.kv_cache_span_size = _span_size(self.kv_cache_span_size)

    @property
    def model_path(self):
        """The .asgraph (or .dimodel) file (DashInfer's AsModelConfig.model_path)."""
        from .model.serialized import graph_path
        return graph_path(self.model_dir, self.model_prefix)

    @property
    def weights_path(self):
        """The .asparam (or .ditensors) file (DashInfer's AsModelConfig.weights_path)."""
        from .model.serialized import param_path
        return param_path(self.model_dir, self.model_prefix)

    # DashInfer's AsModelConfig names for the same values, read-only.
    compute_unit = property(lambda self: "CPU:" + ",".join(map(str, self.device_ids)),
                            doc='"CPU:0" (one process) or "CPU:0,1" (a rank per NUMA node), as DashInfer prints it')
    engine_max_length = property(lambda self: self.max_length)
    engine_max_batch = property(lambda self: self.max_batch)
    engine_max_prefill_length = property(lambda self: self.max_prefill_length)
    num_threads = property(lambda self: self.thread_num)
    cache_mode = property(lambda self: self.kv_cache_mode)
    enable_prefix_cache = property(lambda self: self.prefill_cache)
    cache_span_size = property(lambda self: self.kv_cache_span_size)
    enable_sparsity_matmul = property(lambda self: False, doc="2:4 sparse matmul is a CUDA feature")
    prefill_mode = property(lambda self: AsMHAPrefill.AsPrefillDefault)
    eviction_strategy = property(lambda self: AsEvictionStrategy.MaxLength)
    scheduling_strategy = property(lambda self: AsSchedulingStrategy.ContextPriority)

    def as_model_config(self) -> AsModelConfig:
        """The same settings as DashInfer's AsModelConfig struct (no model files set: empty paths)."""
        has_files = bool(self.model_dir or self.model_prefix)
        return AsModelConfig(
            self.model_name, self.model_path if has_files else "", self.weights_path if has_files else "",
            self.compute_unit, self.max_length, self.max_batch, self.max_prefill_length,
            num_threads=self.thread_num, cache_span_size=self.kv_cache_span_size,
            enable_prefix_cache=self.prefill_cache, prefix_cache_ttl=self.prefix_cache_ttl,
            cache_mode=self.kv_cache_mode, lora_max_rank=self.lora_max_rank, lora_max_num=self.lora_max_num)

    def __str__(self):
        """Printed as DashInfer prints the AsModelConfig its builder returns."""
        return str(self.as_model_config())

    def to_dict(self) -> dict:
        """Plain JSON types: enums by name."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(device_type=self.device_type.name, kv_cache_mode=self.kv_cache_mode.name,
                 device_ids=list(self.device_ids))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "AsModelRuntimeConfig":
        check_keys("AsModelRuntimeConfig.from_dict", d, [f.name for f in fields(cls)])
        return cls(**d)


def _runtime_defaults():
    d = {f.name: f.default for f in fields(AsModelRuntimeConfig) if f.name != "device_ids"}
    return dict(d, device_ids=[0])


# update_from_dict keys in DashInfer's DIConfig spelling -> the builder method that takes them.
_DICT_KEYS = {
    "engine_max_length": "max_length",
    "engine_max_batch": "max_batch",
    "engine_max_prefill_length": "max_prefill_length",
    "enable_prefix_cache": "prefill_cache",
    "cache_span_size": "kv_cache_span_size",
    "cache_span_num_init": "set_span_init_size",
    "enable_sparsity_matmul": "enable_sparsity_matmul",
    "eviction_strategy": "eviction_strategy",
    "scheduling_strategy": "scheduling_strategy",
    "sparse_compute": "sparse_compute",
}
_FIELD_KEYS = [f.name for f in fields(AsModelRuntimeConfig)]


class AsModelRuntimeConfigBuilder:
    """Fluent builder of AsModelRuntimeConfig; every setter checks its value and returns self.

    build() returns a new validated config each call and leaves the builder as it is.
    """

    def __init__(self):
        self._cfg = _runtime_defaults()

    def model_name(self, model_name: str) -> "AsModelRuntimeConfigBuilder":
        self._cfg["model_name"] = check_str("model_name", model_name)
        return self

    def model_dir(self, model_dir: str, file_name_prefix: str) -> "AsModelRuntimeConfigBuilder":
        """The model files are {model_dir}/{file_name_prefix}.asgraph and .asparam."""
        self._cfg["model_dir"] = check_str("model_dir", os.fspath(model_dir))
        self._cfg["model_prefix"] = check_str("model_prefix", file_name_prefix)
        return self

    def model_file_path(self, model_file_name: str, weight_file_path: str) -> "AsModelRuntimeConfigBuilder":
        """DashInfer's alternative to model_dir(): the two file paths, which must share directory
        and prefix (dir/p.asgraph, dir/p.asparam; or DashInfer 1.3's dir/p.dimodel, dir/p.ditensors)."""
        from .model.serialized import SUFFIXES, V13_SUFFIXES
        graph_dir, graph = os.path.split(os.fspath(model_file_name))
        param_dir, param = os.path.split(os.fspath(weight_file_path))
        for graph_suffix, param_suffix in (SUFFIXES, V13_SUFFIXES):
            prefix = graph[: -len(graph_suffix)]
            if graph.endswith(graph_suffix) and graph_dir == param_dir and param == prefix + param_suffix:
                return self.model_dir(graph_dir, prefix)
        raise ValueError(f"model_file_path: expected dir/p.asgraph and dir/p.asparam (or dir/p.dimodel and "
                         f"dir/p.ditensors), got {model_file_name!r} and {weight_file_path!r}")

    def compute_unit(self, target_device, device_id_array=None,
                     compute_thread_in_device=None) -> "AsModelRuntimeConfigBuilder":
        """target_device: TargetDevice.CPU or CPU_NUMA (or its name). device_id_array: the NUMA nodes
        for CPU_NUMA (default [0]); ignored for CPU. compute_thread_in_device: threads per node
        (sets thread_num when given)."""
        unit = check_enum("compute_unit", TargetDevice, target_device)
        self._cfg["device_ids"] = _device_ids(unit, [0] if device_id_array is None else device_id_array)
        self._cfg["device_type"] = unit
        if compute_thread_in_device is not None:
            self.thread_num(compute_thread_in_device)
        return self

    def set_compute_unit_from_str(self, compute_unit: str) -> "AsModelRuntimeConfigBuilder":
        """DashInfer's string form: "CPU:0" (one process) or "CPU:0,1" (a rank per NUMA node)."""
        return self.compute_unit(*parse_compute_unit(compute_unit))

    @staticmethod
    def parse_device_type(compute_unit: str):
        """"CPU:0,1" -> ("CPU", [0, 1]), as DashInfer's; CUDA is refused (no GPU here)."""
        text = check_str("compute_unit", compute_unit)
        kind, sep, ids = text.partition(":")
        if not sep or kind not in ("CPU", "CPU_NUMA", "CUDA"):
            raise ValueError(f"compute_unit must look like 'CPU:0' or 'CPU:0,1', got {text!r}")
        if kind == "CUDA":
            raise ValueError(f"compute_unit {text!r}: this runtime has no CUDA devices; use 'CPU:0'")
        try:
            return kind, [int(i) for i in ids.split(",") if i.strip()]
        except ValueError:
            raise ValueError(f"compute_unit {text!r}: device ids must be integers") from None

    def thread_num(self, n: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["thread_num"] = check_int("thread_num", n, 0)
        return self

    def max_length(self, length: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["max_length"] = check_int("max_length", length, 1)
        return self

    def max_batch(self, batch: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["max_batch"] = check_int("max_batch", batch, 1)
        return self

    def max_prefill_length(self, length: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["max_prefill_length"] = check_int("max_prefill_length", length, 0)
        return self

    def prefill_cache(self, enable: bool = True) -> "AsModelRuntimeConfigBuilder":
        self._cfg["prefill_cache"] = check_bool("prefill_cache", enable)
        return self

    def prefix_cache_ttl(self, ttl: int = DEFAULT_PREFIX_CACHE_TTL) -> "AsModelRuntimeConfigBuilder":
        """Seconds a cached prompt prefix that no request uses stays reusable (DashInfer: 300)."""
        self._cfg["prefix_cache_ttl"] = check_int("prefix_cache_ttl", ttl, 1)
        return self

    def kv_cache_mode(self, cache_mode) -> "AsModelRuntimeConfigBuilder":
        """An AsCacheMode, or its name ("AsCacheQuantI8")."""
        self._cfg["kv_cache_mode"] = check_enum("kv_cache_mode", AsCacheMode, cache_mode)
        return self

    def kv_cache_span_size(self, span_size: int) -> "AsModelRuntimeConfigBuilder":
        """Tokens per KV cache block: 16, 32 (default), 64 or 128."""
        self._cfg["kv_cache_span_size"] = _span_size(span_size)
        return self

    def kv_cache_memory_mb(self, mb: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["kv_cache_memory_mb"] = check_int("kv_cache_memory_mb", mb, 0)
        return self

    def set_span_init_size(self, span_init_size: int) -> "AsModelRuntimeConfigBuilder":
        """DashInfer's initial KV block count, 0 = computed. Only 0 here: the pool is allocated whole
        when the model is installed; size it with kv_cache_memory_mb."""
        if check_int("cache_span_num_init", span_init_size, 0):
            raise ValueError("cache_span_num_init (set_span_init_size) must be 0 here: the KV pool is "
                             "allocated whole at install; size it with kv_cache_memory_mb(mb)")
        return self

    def enable_sparsity_matmul(self, enable: bool = False) -> "AsModelRuntimeConfigBuilder":
        """Only False: DashInfer's 2:4 sparse matmul runs on NVIDIA sparse tensor cores."""
        if check_bool("enable_sparsity_matmul", enable):
            raise ValueError("enable_sparsity_matmul=True needs NVIDIA 2:4 sparse tensor cores; "
                             "this runtime computes on the CPU")
        return self

    def lora_max_rank(self, rank: int) -> "AsModelRuntimeConfigBuilder":
        """Kept and readable; this runtime loads no LoRA adapters, so no limit ever applies."""
        self._cfg["lora_max_rank"] = check_int("lora_max_rank", rank, 1)
        return self

    def lora_max_num(self, num: int) -> "AsModelRuntimeConfigBuilder":
        """Kept and readable; this runtime loads no LoRA adapters, so no limit ever applies."""
        self._cfg["lora_max_num"] = check_int("lora_max_num", num, 1)
        return self

    def eviction_strategy(self, strategy) -> "AsModelRuntimeConfigBuilder":
        """DIConfig's eviction_strategy: only MaxLength (nothing is evicted here, see the enum)."""
        return self._only_default("eviction_strategy", AsEvictionStrategy, strategy)

    def scheduling_strategy(self, strategy) -> "AsModelRuntimeConfigBuilder":
        """DIConfig's scheduling_strategy: only ContextPriority (prefill first, as here)."""
        return self._only_default("scheduling_strategy", AsSchedulingStrategy, strategy)

    def sparse_compute(self, mode) -> "AsModelRuntimeConfigBuilder":
        """DIConfig's sparse_compute: only "none" (2:4 sparsity is a CUDA feature)."""
        if str(mode).lower() != "none":
            raise ValueError(f"sparse_compute={mode!r} needs NVIDIA sparse tensor cores; only 'none' here")
        return self

    def _only_default(self, key, enum_cls, value):
        member = check_enum(key, enum_cls, value)
        if member.value != 0:
            default = enum_cls(0).name
            raise ValueError(f"{key}={member.name} is not supported by this runtime; only {default}")
        return self

    def from_dict(self, rfield: dict) -> "AsModelRuntimeConfigBuilder":
        """Reset to the defaults, then apply rfield (see update_from_dict)."""
        before, self._cfg = self._cfg, _runtime_defaults()
        try:
            return self.update_from_dict(rfield)
        except ValueError:
            self._cfg = before
            raise

    def update_from_dict(self, rfield: dict) -> "AsModelRuntimeConfigBuilder":
        """Apply the keys of rfield: AsModelRuntimeConfig's field names (as to_dict writes them) or
        DashInfer's DIConfig spellings (engine_max_length, engine_max_batch, engine_max_prefill_length,
        enable_prefix_cache, prefix_cache_ttl, kv_cache_mode by name, cache_span_size,
        cache_span_num_init, enable_sparsity_matmul, eviction_strategy, scheduling_strategy,
        sparse_compute, and compute_unit as a dict of device_type, device_ids,
        compute_thread_in_device or as a "CPU:0,1" string). An unknown key or a bad value raises
        ValueError and changes nothing."""
        check_keys("AsModelRuntimeConfigBuilder.update_from_dict", rfield,
                   _FIELD_KEYS + ["compute_unit"] + list(_DICT_KEYS))
        before = dict(self._cfg)
        try:
            return self._apply(rfield)
        except ValueError:
            self._cfg = before
            raise

    def _apply(self, rfield):
        d = dict(rfield)
        unit = d.pop("compute_unit", None)
        kind, ids = d.pop("device_type", None), d.pop("device_ids", None)
        if isinstance(unit, dict):
            check_keys("compute_unit", unit, ["device_type", "device_ids", "compute_thread_in_device"])
            self.compute_unit(unit.get("device_type", TargetDevice.CPU),
                              unit.get("device_ids", ids), unit.get("compute_thread_in_device"))
        elif isinstance(unit, str) and ":" in unit:
            self.set_compute_unit_from_str(unit)
        elif unit is not None or kind is not None or ids is not None:
            self.compute_unit(unit or kind or self._cfg["device_type"], ids)
        if "model_dir" in d or "model_prefix" in d:
            self.model_dir(d.pop("model_dir", self._cfg["model_dir"]),
                           d.pop("model_prefix", self._cfg["model_prefix"]))
        for key, value in d.items():
            getattr(self, _DICT_KEYS.get(key, key))(value)
        return self

    def build(self) -> AsModelRuntimeConfig:
        return AsModelRuntimeConfig(**dict(self._cfg, device_ids=list(self._cfg["device_ids"])))
