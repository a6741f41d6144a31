"""Config builders with DashInfer's names: AsModelRuntimeConfigBuilder -> AsModelRuntimeConfig (how a
model is served, in runtime_config.py, re-exported here) and ASGenerationConfigBuilder ->
ASGenerationConfig (how one request generates).

Both built objects are plain dataclasses, validated when constructed, with to_dict()/from_dict()
for the gRPC wire. A bad value fails where it is set, with a ValueError naming the key and what it
accepts; keys nobody knows are refused rather than ignored.
"""
import numbers
import random
from dataclasses import dataclass, field, fields

from .runtime_config import AsModelRuntimeConfig, AsModelRuntimeConfigBuilder  # noqa: F401 (re-export)
# The generation checks below use the shared value checks under these short names.
from .values import (check_bool as _bool, check_float as _float, check_ids as _ids, check_int as _int,
                     check_keys as _check_keys, check_str as _str)

_SEED_MAX = 2**31 - 1  # DashInfer draws default seeds from [1, int32 max]


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
