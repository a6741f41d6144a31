"""Config builders with DashInfer's names: AsModelRuntimeConfigBuilder -> AsModelRuntimeConfig (how a
model is served) and ASGenerationConfigBuilder -> ASGenerationConfig (how one request generates).

Both built objects are plain dataclasses, validated when constructed, with to_dict()/from_dict()
for the gRPC wire. A bad value fails where it is set, with a ValueError naming the key and what it
accepts; keys nobody knows are refused rather than ignored.
"""
import math
import numbers
import os
import random
from dataclasses import dataclass, field, fields

from .types import AsCacheMode, TargetDevice

_SEED_MAX = 2**31 - 1  # DashInfer draws default seeds from [1, int32 max]


# ---- value checks shared by both configs ----------------------------------------------------------

def _int(key, v, lo=None, hi=None):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{key} must be an int, got {type(v).__name__} {v!r}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{key} must be {allowed}, got {v}")
    return v


def _float(key, v, ok=lambda x: True, allowed="finite"):
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{key} must be a number, got {type(v).__name__} {v!r}")
    v = float(v)
    if not math.isfinite(v) or not ok(v):
        raise ValueError(f"{key} must be {allowed}, got {v}")
    return v


def _bool(key, v):
    if not isinstance(v, bool):
        raise ValueError(f"{key} must be True or False, got {type(v).__name__} {v!r}")
    return v


def _str(key, v):
    if not isinstance(v, str):
        raise ValueError(f"{key} must be a string, got {type(v).__name__} {v!r}")
    return v


def _ids(key, v):
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise ValueError(f"{key} must be a list of token ids, got {v!r}")
    return [_int(f"{key}[{i}]", x, 0) for i, x in enumerate(v)]


def _enum(key, enum_cls, v):
    if isinstance(v, enum_cls):
        return v
    if isinstance(v, str):
        by_name = {m.name.lower(): m for m in enum_cls}
        if v.lower() in by_name:
            return by_name[v.lower()]
    elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
        for m in enum_cls:
            if m.value == v:
                return m
    names = ", ".join(m.name for m in enum_cls)
    raise ValueError(f"unknown {key} {v!r}; expected one of {names}")


def _check_keys(what, d, known):
    if not isinstance(d, dict):
        raise ValueError(f"{what} needs a dict, got {type(d).__name__}")
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"known keys: {', '.join(known)}")


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


# ---- generation config -----------------------------------------------------------------------------

def _eos(key, v):
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return _int(key, v, 0)
    ids = _ids(key, v)
    if not ids:
        raise ValueError(f"{key} must be a token id or a non-empty list of them, got {v!r}")
    return ids


def _stop_words(key, v):
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise ValueError(f"{key} must be a list of lists of token ids, got {v!r}")
    out = [_ids(f"{key}[{i}]", words) for i, words in enumerate(v)]
    if any(not words for words in out):
        raise ValueError(f"{key}: each stop sequence needs at least one token id, got {v!r}")
    return out


def _response_format(key, v):
    if v is not None and not isinstance(v, dict):
        raise ValueError(f"{key} must be a dict (e.g. {{'type': 'json_object'}}) or None, got {v!r}")
    return v


MAX_TOP_LOGPROBS = 10  # DashInfer's engine limit

# key -> check(key, value) returning the normalized value.
_GEN_CHECKS = {
    "do_sample": _bool,
    "temperature": lambda k, v: _float(k, v, lambda x: x >= 0, ">= 0 (0 = greedy)"),
    "top_k": lambda k, v: _int(k, v, 0),
    "top_p": lambda k, v: _float(k, v, lambda x: 0 < x <= 1, "in (0, 1]"),
    "max_length": lambda k, v: _int(k, v, 1),
    "min_length": lambda k, v: _int(k, v, 0),
    "early_stopping": _bool,
    "stop_words_ids": _stop_words,
    "eos_token_id": _eos,
    "no_repeat_ngram_size": lambda k, v: _int(k, v, 0),
    "repetition_penalty": lambda k, v: _float(k, v, lambda x: 0 < x <= 2, "in (0, 2]"),
    "length_penalty": _float,
    "presence_penalty": lambda k, v: _float(k, v, lambda x: -2 <= x <= 2, "in [-2, 2]"),
    "suppress_repetition_in_generation": _bool,
    "seed": lambda k, v: _int(k, v, 0, 2**64 - 1),
    "logprobs": _bool,
    "top_logprobs": lambda k, v: _int(k, v, 0, MAX_TOP_LOGPROBS),
    "lora_name": _str,
    "mm_info": lambda k, v: v,
    "response_format": _response_format,
}

# DashInfer keys this runtime does not implement: accepted only at their neutral value.
_NEUTRAL_ONLY = {
    "num_beams": (1, "beam search is not implemented"),
    "num_return_sequences": (1, "one sequence per request"),
    "frequency_penalty": (0.0, "use presence_penalty or repetition_penalty"),
    "bad_words_ids": (None, "token suppression lists are not implemented"),
}


def _neutral(key, v):
    neutral, why = _NEUTRAL_ONLY[key]
    if v == neutral or (neutral is None and not v):
        return
    raise ValueError(f"{key}={v!r} is not supported ({why}); only {neutral!r} is accepted")


@dataclass
class ASGenerationConfig:
    """How one request generates; defaults are DashInfer's.

    do_sample: sampling mode (DashInfer requires it on; greedy is temperature 0 or top_k 1).
    temperature: 0 = greedy. top_k: 0 = no top-k cut. top_p: nucleus mass, 1 = no cut.
    max_length: prompt + generated tokens. min_length: no EOS before this total length.
    early_stopping: stop at an eos_token_id (an id or a list of ids); off = ignore EOS.
    stop_words_ids: token sequences that end the generation when produced.
    no_repeat_ngram_size, repetition_penalty, length_penalty, presence_penalty: as in DashInfer;
    suppress_repetition_in_generation switches the engine from repetition_penalty to
    presence_penalty. seed: the sampling seed. logprobs / top_logprobs: return the chosen token's
    logprob and the top_logprobs alternatives (at most 10). lora_name, mm_info, response_format:
    DashInfer options that the engine refuses when set (no LoRA, multimedia or guided decoding).
    Reads like the dict DashInfer's build() returned: cfg["top_k"], cfg.get("seed").
    """
    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    max_length: int = 20
    min_length: int = 0
    early_stopping: bool = True
    stop_words_ids: list = field(default_factory=list)
    eos_token_id: object = 0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    length_penalty: float = 1.0
    presence_penalty: float = 0.0
    suppress_repetition_in_generation: bool = False
    seed: int = field(default_factory=lambda: random.randint(1, _SEED_MAX))
    logprobs: bool = False
    top_logprobs: int = 0
    lora_name: str = ""
    mm_info: object = None
    response_format: object = None

    def __post_init__(self):
        for key, check in _GEN_CHECKS.items():
            setattr(self, key, check(key, getattr(self, key)))
        if self.min_length > self.max_length:
            raise ValueError(f"min_length ({self.min_length}) must be <= max_length ({self.max_length})")
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs={self.top_logprobs} needs logprobs=True")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "ASGenerationConfig":
        _check_keys("ASGenerationConfig.from_dict", d, list(_GEN_CHECKS))
        return cls(**d)

    def __getitem__(self, key):
        if key not in _GEN_CHECKS:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key, default=None):
        return getattr(self, key) if key in _GEN_CHECKS else default

    def __contains__(self, key):
        return key in _GEN_CHECKS

    def keys(self):
        return list(_GEN_CHECKS)


# transformers GenerationConfig attributes DashInfer reads; everything else there is ignored, as
# in DashInfer (max_length included: it is the user's per-request choice here).
_HF_KEYS = ("top_k", "top_p", "temperature", "repetition_penalty", "length_penalty", "min_length",
            "no_repeat_ngram_size")


class ASGenerationConfigBuilder:
    """Fluent builder of ASGenerationConfig; every setter checks its value and returns self.

    ASGenerationConfigBuilder(hf_gen_config=None, seed=None, eos_token_id=0): empty (DashInfer's
    defaults), or from a transformers GenerationConfig or a dict of its keys (the content of
    generation_config.json). From Hugging Face, as DashInfer does: top_k, top_p, temperature,
    repetition/length penalties, min_length, no_repeat_ngram_size and eos_token_id are taken when
    set, num_return_sequences other than 1 is refused, and do_sample and early_stopping are turned
    on. seed: None draws one at random.
    """

    def __init__(self, hf_gen_config=None, seed=None, eos_token_id=0):
        self._cfg = {}
        self.eos_token_id(eos_token_id)
        self.seed(random.randint(1, _SEED_MAX) if seed is None else seed)
        if hf_gen_config is not None:
            self._apply_hf(hf_gen_config)

    def _apply_hf(self, hf):
        if isinstance(hf, dict):
            get = hf.get
        elif hasattr(hf, "to_dict") and hasattr(hf, "top_k"):
            def get(key):
                return getattr(hf, key, None)
        else:
            raise ValueError(f"hf_gen_config must be a transformers GenerationConfig or a dict, "
                             f"got {type(hf).__name__}")
        if get("num_return_sequences") not in (None, 1):
            raise ValueError(f"num_return_sequences={get('num_return_sequences')} is not supported; "
                             f"one sequence per request")
        for key in _HF_KEYS + ("eos_token_id",):
            if get(key) is not None:
                self._set(key, get(key))
        self.do_sample().early_stopping()

    def _set(self, key, value):
        self._cfg[key] = _GEN_CHECKS[key](key, value)
        return self

    def update(self, update_fields: dict) -> "ASGenerationConfigBuilder":
        """Set several keys at once; an unknown key or bad value raises before anything changes.
        DashInfer's num_beams, num_return_sequences, frequency_penalty and bad_words_ids are
        accepted at their neutral values only."""
        known = list(_GEN_CHECKS) + list(_NEUTRAL_ONLY)
        _check_keys("ASGenerationConfigBuilder.update", update_fields, known)
        checked = {}
        for key, value in update_fields.items():
            if key in _NEUTRAL_ONLY:
                _neutral(key, value)
            else:
                checked[key] = _GEN_CHECKS[key](key, value)
        self._cfg.update(checked)
        return self

    def do_sample(self, flag: bool = True):
        return self._set("do_sample", flag)

    def early_stopping(self, flag: bool = True):
        return self._set("early_stopping", flag)

    def log_probs(self, enable_logprobs: bool, top_logprobs: int = 0):
        """Return logprobs, with the top_logprobs (0..10) most likely alternatives per token."""
        return self.update({"logprobs": enable_logprobs, "top_logprobs": top_logprobs})

    def temperature(self, value: float):
        return self._set("temperature", value)

    def top_k(self, value: int):
        return self._set("top_k", value)

    def top_p(self, value: float):
        return self._set("top_p", value)

    def max_length(self, value: int):
        return self._set("max_length", value)

    def min_length(self, value: int):
        return self._set("min_length", value)

    def stop_words_ids(self, value):
        return self._set("stop_words_ids", value)

    def eos_token_id(self, value):
        return self._set("eos_token_id", value)

    def no_repeat_ngram_size(self, value: int):
        return self._set("no_repeat_ngram_size", value)

    def repetition_penalty(self, value: float):
        return self._set("repetition_penalty", value)

    def length_penalty(self, value: float):
        return self._set("length_penalty", value)

    def presence_penalty(self, value: float):
        return self._set("presence_penalty", value)

    def suppress_repetition_in_generation(self, flag: bool = True):
        return self._set("suppress_repetition_in_generation", flag)

    def seed(self, value: int):
        return self._set("seed", value)

    def logprobs(self, flag: bool = True):
        return self._set("logprobs", flag)

    def top_logprobs(self, value: int):
        return self._set("top_logprobs", value)

    def lora_name(self, value: str):
        return self._set("lora_name", value)

    def mm_info(self, info):
        return self._set("mm_info", info)

    with_mm_info = mm_info  # DashInfer's name

    def response_format(self, value):
        return self._set("response_format", value)

    def build(self) -> ASGenerationConfig:
        """A new validated ASGenerationConfig; the builder stays usable."""
        return ASGenerationConfig(**self._cfg)
