"""Config builders with DashInfer's names: AsModelRuntimeConfigBuilder -> AsModelRuntimeConfig (how a
model is served), and (from generation_config.py) ASGenerationConfigBuilder -> ASGenerationConfig
(how one request generates).

AsModelRuntimeConfig is a plain dataclass, validated when constructed, with to_dict()/from_dict()
for the gRPC wire. A bad value fails where it is set, with a ValueError naming the key and what it
accepts; keys nobody knows are refused rather than ignored.
"""
import os
from dataclasses import dataclass, field, fields

from .checks import check_bool as _bool
from .checks import check_enum as _enum
from .checks import check_ids as _ids
from .checks import check_int as _int
from .checks import check_keys as _check_keys
from .checks import check_str as _str
from .generation_config import ASGenerationConfig, ASGenerationConfigBuilder  # noqa: F401 (re-exported)
from .types import AsCacheMode, TargetDevice


# ---- runtime config --------------------------------------------------------------------------------

_SPAN_SIZES = (16, 32, 64, 128)


def _device_ids(unit, ids):
    if unit == TargetDevice.CPU:
        return [0]  # a single-process CPU model has no device choice (DashInfer: "CPU:0")
    ids = _ids("device_ids", ids)
    if not ids or len(set(ids)) != len(ids):
        raise ValueError(f"device_ids must be distinct NUMA node numbers, at least one, got {ids}")
    return ids


@dataclass
class AsModelRuntimeConfig:
    """How a model is served. The model files are {model_dir}/{model_prefix}.asgraph and .asparam.

    compute_unit / device_ids: TargetDevice.CPU (device_ids is then [0]) or TargetDevice.CPU_NUMA
    with one tensor-parallel rank per listed NUMA node. thread_num: compute threads per rank, 0 =
    every core of the node. max_length: the longest request (prompt + generated). max_batch: requests
    running at once. max_prefill_length: prompt tokens computed per scheduler step, 0 = the engine
    chooses. prefill_cache: reuse the KV cache of shared prompt prefixes. kv_cache_span_size: tokens
    per KV cache block. kv_cache_memory_mb: the KV cache budget, 0 = room for max_batch x max_length.
    """
    model_name: str = ""
    model_dir: str = ""
    model_prefix: str = ""
    compute_unit: TargetDevice = TargetDevice.CPU
    device_ids: list = field(default_factory=lambda: [0])
    thread_num: int = 0
    max_batch: int = 32
    max_length: int = 2048
    max_prefill_length: int = 0
    prefill_cache: bool = True
    kv_cache_mode: AsCacheMode = AsCacheMode.AsCacheDefault
    kv_cache_span_size: int = 32
    kv_cache_memory_mb: int = 0

    def __post_init__(self):
        self.model_name = _str("model_name", self.model_name)
        if not self.model_name:
            raise ValueError("model_name must be set (a non-empty string)")
        self.model_dir = _str("model_dir", self.model_dir)
        self.model_prefix = _str("model_prefix", self.model_prefix)
        self.compute_unit = _enum("compute_unit", TargetDevice, self.compute_unit)
        self.device_ids = _device_ids(self.compute_unit, self.device_ids)
        self.thread_num = _int("thread_num", self.thread_num, 0)
        self.max_batch = _int("max_batch", self.max_batch, 1)
        self.max_length = _int("max_length", self.max_length, 1)
        self.max_prefill_length = _int("max_prefill_length", self.max_prefill_length, 0)
        self.prefill_cache = _bool("prefill_cache", self.prefill_cache)
        self.kv_cache_mode = _enum("kv_cache_mode", AsCacheMode, self.kv_cache_mode)
        self.kv_cache_span_size = _span_size(self.kv_cache_span_size)
        self.kv_cache_memory_mb = _int("kv_cache_memory_mb", self.kv_cache_memory_mb, 0)

    @property
    def model_path(self):
        """The .asgraph file (DashInfer's AsModelConfig.model_path)."""
        return os.path.join(self.model_dir, self.model_prefix + ".asgraph")

    @property
    def weights_path(self):
        """The .asparam file (DashInfer's AsModelConfig.weights_path)."""
        return os.path.join(self.model_dir, self.model_prefix + ".asparam")

    def to_dict(self) -> dict:
        """Plain JSON types: enums by name."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(compute_unit=self.compute_unit.name, kv_cache_mode=self.kv_cache_mode.name,
                 device_ids=list(self.device_ids))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "AsModelRuntimeConfig":
        _check_keys("AsModelRuntimeConfig.from_dict", d, [f.name for f in fields(cls)])
        return cls(**d)


def _span_size(v):
    v = _int("kv_cache_span_size", v)
    if v not in _SPAN_SIZES:
        raise ValueError(f"kv_cache_span_size must be one of {', '.join(map(str, _SPAN_SIZES))}, got {v}")
    return v


def _runtime_defaults():
    d = {f.name: f.default for f in fields(AsModelRuntimeConfig) if f.name != "device_ids"}
    return dict(d, device_ids=[0])


# DashInfer's DIConfig runtime section spells some keys differently; both spellings are accepted.
_RUNTIME_ALIASES = {
    "engine_max_length": "max_length",
    "engine_max_batch": "max_batch",
    "engine_max_prefill_length": "max_prefill_length",
    "enable_prefix_cache": "prefill_cache",
}


class AsModelRuntimeConfigBuilder:
    """Fluent builder of AsModelRuntimeConfig; every setter checks its value and returns self.

    build() returns a new validated config each call and leaves the builder as it is.
    """

    def __init__(self):
        self._cfg = _runtime_defaults()

    def model_name(self, model_name: str) -> "AsModelRuntimeConfigBuilder":
        self._cfg["model_name"] = _str("model_name", model_name)
        return self

    def model_dir(self, model_dir: str, file_name_prefix: str) -> "AsModelRuntimeConfigBuilder":
        """The model files are {model_dir}/{file_name_prefix}.asgraph and .asparam."""
        self._cfg["model_dir"] = _str("model_dir", os.fspath(model_dir))
        self._cfg["model_prefix"] = _str("model_prefix", file_name_prefix)
        return self

    def model_file_path(self, model_file: str, weight_file: str) -> "AsModelRuntimeConfigBuilder":
        """DashInfer's alternative to model_dir(): the two file paths, which must share directory
        and prefix (dir/p.asgraph, dir/p.asparam)."""
        graph_dir, graph = os.path.split(os.fspath(model_file))
        param_dir, param = os.path.split(os.fspath(weight_file))
        prefix = graph[: -len(".asgraph")]
        if not graph.endswith(".asgraph") or graph_dir != param_dir or param != prefix + ".asparam":
            raise ValueError(f"model_file_path: expected dir/p.asgraph and dir/p.asparam, "
                             f"got {model_file!r} and {weight_file!r}")
        return self.model_dir(graph_dir, prefix)

    def compute_unit(self, target_device, device_id_array=None,
                     compute_thread_in_device=None) -> "AsModelRuntimeConfigBuilder":
        """target_device: TargetDevice.CPU or CPU_NUMA (or its name). device_id_array: the NUMA nodes
        for CPU_NUMA (default [0]); ignored for CPU. compute_thread_in_device: threads per node
        (sets thread_num when given)."""
        unit = _enum("compute_unit", TargetDevice, target_device)
        self._cfg["device_ids"] = _device_ids(unit, [0] if device_id_array is None else device_id_array)
        self._cfg["compute_unit"] = unit
        if compute_thread_in_device is not None:
            self.thread_num(compute_thread_in_device)
        return self

    def thread_num(self, n: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["thread_num"] = _int("thread_num", n, 0)
        return self

    def max_length(self, length: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["max_length"] = _int("max_length", length, 1)
        return self

    def max_batch(self, batch: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["max_batch"] = _int("max_batch", batch, 1)
        return self

    def max_prefill_length(self, length: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["max_prefill_length"] = _int("max_prefill_length", length, 0)
        return self

    def prefill_cache(self, enable: bool = True) -> "AsModelRuntimeConfigBuilder":
        self._cfg["prefill_cache"] = _bool("prefill_cache", enable)
        return self

    def kv_cache_mode(self, cache_mode) -> "AsModelRuntimeConfigBuilder":
        """An AsCacheMode, or its name ("AsCacheQuantI8")."""
        self._cfg["kv_cache_mode"] = _enum("kv_cache_mode", AsCacheMode, cache_mode)
        return self

    def kv_cache_span_size(self, span_size: int) -> "AsModelRuntimeConfigBuilder":
        """Tokens per KV cache block: 16, 32 (default), 64 or 128."""
        self._cfg["kv_cache_span_size"] = _span_size(span_size)
        return self

    def kv_cache_memory_mb(self, mb: int) -> "AsModelRuntimeConfigBuilder":
        self._cfg["kv_cache_memory_mb"] = _int("kv_cache_memory_mb", mb, 0)
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
        DashInfer's DIConfig spellings (engine_max_length, engine_max_batch,
        engine_max_prefill_length, enable_prefix_cache, and compute_unit as a dict of device_type,
        device_ids, compute_thread_in_device). An unknown key or a bad value raises ValueError and
        changes nothing."""
        known = [f.name for f in fields(AsModelRuntimeConfig)] + list(_RUNTIME_ALIASES)
        _check_keys("AsModelRuntimeConfigBuilder.update_from_dict", rfield, known)
        before = dict(self._cfg)
        try:
            return self._apply(rfield)
        except ValueError:
            self._cfg = before
            raise

    def _apply(self, rfield):
        d = {_RUNTIME_ALIASES.get(k, k): v for k, v in rfield.items()}
        unit = d.pop("compute_unit", None)
        ids = d.pop("device_ids", None)
        if isinstance(unit, dict):
            _check_keys("compute_unit", unit, ["device_type", "device_ids", "compute_thread_in_device"])
            self.compute_unit(unit.get("device_type", TargetDevice.CPU),
                              unit.get("device_ids", ids), unit.get("compute_thread_in_device"))
        elif unit is not None or ids is not None:
            self.compute_unit(self._cfg["compute_unit"] if unit is None else unit, ids)
        if "model_dir" in d or "model_prefix" in d:
            self.model_dir(d.pop("model_dir", self._cfg["model_dir"]),
                           d.pop("model_prefix", self._cfg["model_prefix"]))
        for key, value in d.items():
            getattr(self, key)(value)
        return self

    def build(self) -> AsModelRuntimeConfig:
        return AsModelRuntimeConfig(**dict(self._cfg, device_ids=list(self._cfg["device_ids"])))
