"""How one request generates: ASGenerationConfigBuilder -> ASGenerationConfig, DashInfer's keys.

OPTIONS below is the one declaration of the generation options: each key's default, the check
of its value, and what it means. The builder's setters, the built config and the engine's
reading of a config all go through check_generation(), so the limits cannot disagree.

As in DashInfer, build() returns a dict (ASGenerationConfig is a dict subclass whose entries also
read as attributes): users set cfg["key"] = value, copy it, json.dumps it. Because a dict can be
changed after build(), an engine checks the config again when it reads it.
"""
import json
import numbers
import random

from .checks import brief, check_bool, check_enum, check_float, check_ids, check_int, check_keys, check_str
from .options import VocabType

SEED_MAX = 2**31 - 1   # DashInfer draws default seeds from [1, int32 max]
MAX_TOP_LOGPROBS = 10  # DashInfer's engine limit


def _eos(key, v):
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return check_int(key, v, 0)
    ids = check_ids(key, v)
    if not ids:
        raise ValueError(f"{key} must be a token id or a non-empty list of them, got {brief(v)}")
    return ids


def _id_sequences(key, v):
    if v is None and key == "bad_words_ids":  # transformers' and DashInfer's "none"
        return []
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise ValueError(f"{key} must be a list of lists of token ids, got {brief(v)}")
    try:
        v = list(v)
    except Exception:  # an iterable that fails to iterate is a bad value like the others
        raise ValueError(f"{key} must be a list of lists of token ids, got {brief(v)}") from None
    out = [check_ids(f"{key}[{i}]", words) for i, words in enumerate(v)]
    if any(not words for words in out):
        raise ValueError(f"{key}: each sequence needs at least one token id, got {brief(v)}")
    return out


def _response_format(key, v):
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError(f"{key} must be a dict (e.g. {{'type': 'json_object'}}) or None, got {brief(v)}")
    response_format_schema(v, key)
    return dict(v)


def response_format_schema(response_format, key="response_format"):
    """The JSON schema a response_format constrains the output to (a dict), or None for none.
    Forms: {"type": "text"} (none); {"type": "json_object"} (any object); DashInfer's
    {"type": "json_object", "json_schema": S}; OpenAI's {"type": "json_schema", "json_schema":
    {"name": ..., "schema": S, "strict": ...}}; S a dict or its JSON text. ValueError if malformed
    (whether the grammar compiler takes the schema is the engine's to say)."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "grammar":  # constrains the output, but to no JSON schema
        response_format_grammar(response_format, key)
        return None
    extra = set(response_format) - {"type", "json_schema", *REASONING_BOUNDS}
    if extra:
        raise ValueError(f"{key}: unknown key(s) {sorted(extra)}; it takes 'type', 'json_schema', "
                         f"'reasoning_start', 'reasoning_end' and 'answer_start'")
    if kind == "text":
        if response_format.get("json_schema") is not None or set(REASONING_BOUNDS) & set(response_format):
            raise ValueError(f"{key}: type 'text' takes no json_schema, reasoning_start, reasoning_end or answer_start")
        return None
    response_format_reasoning(response_format, key)
    if kind not in ("json_object", "json_schema"):
        raise ValueError(f"{key}: type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    schema = response_format.get("json_schema")
    if kind == "json_schema":
        if not isinstance(schema, (dict, str)):
            raise ValueError(f"{key}: type 'json_schema' needs a json_schema object "
                             f"({{'name': ..., 'schema': {{...}}}}), got {schema!r}")
        if isinstance(schema, dict):
            schema = schema.get("schema")
    if schema is None:
        return {"type": "object"}
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ValueError(f"{key}: the JSON schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"{key}: the JSON schema must be a JSON object, got {schema!r}")
    return schema


REASONING_BOUNDS = ("reasoning_start", "reasoning_end", "answer_start")
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range: -100 bans a token, 100 all but forces it


def _logit_bias(key, v):
    """{token id: bias}; ids as ints or their decimal strings (JSON object keys, OpenAI's form)."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"{key} must be a dict of token id -> bias, got {type(v).__name__} {brief(v)}")
    out = {}
    for token, bias in v.items():
        if isinstance(token, str) and token.isascii() and token.isdigit():
            token = int(token)
        token = check_int(f"{key} token id", token, 0)
        out[token] = check_float(f"{key}[{token}]", bias, lambda x: abs(x) <= LOGIT_BIAS_LIMIT,
                                 f"in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}]")
    return out


def response_format_grammar(response_format, key="response_format"):
    """The lark grammar (llguidance's dialect) of DashInfer's form {"type": "grammar", "grammar":
    LARK}, or None for the other forms. ValueError if malformed. The front end constrains forced
    tool calls with it (dashinfer_client/frontend/parsers)."""
    if response_format is None or response_format.get("type") != "grammar":
        return None
    extra = set(response_format) - {"type", "grammar", *REASONING_BOUNDS}
    if extra:
        raise ValueError(f"{key}: unknown key(s) {sorted(extra)}; type 'grammar' takes 'grammar', "
                         f"'reasoning_start', 'reasoning_end' and 'answer_start'")
    grammar = response_format.get("grammar")
    if not isinstance(grammar, str) or not grammar.strip():
        raise ValueError(f"{key}: type 'grammar' needs a 'grammar' string (lark)")
    response_format_reasoning(response_format, key)
    return grammar


def response_format_reasoning(response_format, key="response_format"):
    """(reasoning_start, reasoning_end, answer_start) of a json or grammar form (DashInfer's keys),
    each None when left out. With reasoning_end the output is free up to its first occurrence,
    constrained after it, as a reasoning model thinks before its structured answer; with
    reasoning_start too, that free part is optional and begins with it (a model that opens its
    reasoning itself, or answers at once); answer_start opens the constrained part, reasoning or not
    (harmony's final channel header). The HTTP server sets them from the chat template's reasoning
    format. ValueError unless non-empty strings, and reasoning_start or answer_start without
    reasoning_end."""
    bounds = tuple((response_format or {}).get(k) for k in REASONING_BOUNDS)
    for name, text in zip(REASONING_BOUNDS, bounds):
        if text is not None and (not isinstance(text, str) or not text):
            raise ValueError(f"{key}: {name} must be a non-empty string, got {brief(text)}")
    start, end, answer = bounds
    if end is None and (start is not None or answer is not None):
        raise ValueError(f"{key}: {'reasoning_start' if start is not None else 'answer_start'} needs reasoning_end")
    return bounds


def _vocab(key, v):
    if v is None:
        return None
    if not isinstance(v, dict) or not all(isinstance(t, str) for t in v):
        raise ValueError(f"{key} must be a dict of token text -> id, got {type(v).__name__}")
    return {t: check_int(f"{key}[{t!r}]", i, 0) for t, i in v.items()}


def _vocab_type(key, v):
    return None if v is None else check_enum(key, VocabType, v)


def _prompt_logprobs(key, v):
    return None if v is None else check_int(key, v, 0, MAX_TOP_LOGPROBS)


def _number(ok, allowed):
    return lambda key, v: check_float(key, v, ok, allowed)


def _count(lo, hi=None):
    return lambda key, v: check_int(key, v, lo, hi)


# key: (default, check(key, value) -> normal value, meaning). Defaults are DashInfer's; a default
# that is a function is called for each config (a fresh seed, a fresh list).
OPTIONS = {
    "do_sample": (True, check_bool,
                  "sample the next token; off (or temperature 0) = greedy"),
    "temperature": (1.0, _number(lambda x: x >= 0, ">= 0 (0 = greedy)"),
                    "divides the logits before top-k / top-p; 0 = greedy"),
    "top_k": (50, _count(0), "keep the k most likely tokens; 0 = no cut"),
    # [0, 1] as DashInfer's engine, transformers' TopPLogitsWarper and OpenAI take it
    "top_p": (1.0, _number(lambda x: 0 <= x <= 1, "in [0, 1]"),
              "keep the most likely tokens whose probability exceeds top_p (0: only the most likely); 1 = no cut"),
    "max_length": (20, _count(1), "prompt + generated tokens, the hard stop"),
    "min_length": (0, _count(0), "no eos before prompt + generated tokens reach this length"),
    "early_stopping": (True, check_bool, "an eos_token_id ends the request; off = eos is an ordinary token"),
    "stop_words_ids": (list, _id_sequences, "token sequences that end the request when generated"),
    "bad_words_ids": (list, _id_sequences, "token sequences never generated: a sequence's last token is "
                      "banned where the tokens before it were just generated (transformers' rule)"),
    "eos_token_id": (0, _eos, "the end-of-sequence id, or a list of them"),
    "no_repeat_ngram_size": (0, _count(0), "no n-gram of this size occurs twice; 0 = off"),
    # > 0 as transformers requires (a penalty divides or multiplies logits); DashInfer sets no cap
    "repetition_penalty": (1.0, _number(lambda x: x > 0, "> 0 (1 = off)"),
                           "penalize tokens already in prompt + output (transformers' rule); 1 = off"),
    "length_penalty": (1.0, check_float, "DashInfer's beam-search length penalty; 1 = off"),
    # any finite value, as DashInfer; OpenAI's [-2, 2] is a rule of the HTTP API, not of the engine
    "presence_penalty": (0.0, check_float, "subtracted from every token generated so far; 0 = off"),
    # OpenAI's definition and range (DashInfer names the key but gives it no range)
    "frequency_penalty": (0.0, _number(lambda x: -2 <= x <= 2, "in [-2, 2]"),
                          "times the count of each token generated so far, subtracted from its logit; 0 = off"),
    "logit_bias": (dict, _logit_bias, "{token id: bias in [-100, 100]} added to the logits after the "
                   "penalties; -100 bans a token"),
    "min_p": (0.0, _number(lambda x: 0 <= x <= 1, "in [0, 1]"),
              "after top-k / top-p, drop tokens less probable than min_p times the most probable; 0 = off"),
    "suppress_repetition_in_generation": (False, check_bool,
                                          "the repetition penalty looks at generated tokens only"),
    "seed": (lambda: random.randint(1, SEED_MAX), _count(0, 2**64 - 1),
             "the sampling seed: the same seed gives the same tokens"),
    "logprobs": (False, check_bool, "return the log-probability of each token"),
    "top_logprobs": (0, _count(0, MAX_TOP_LOGPROBS), "also the most likely alternatives per token"),
    "prompt_logprobs": (None, _prompt_logprobs, "the log-probability of each prompt token after the first, with "
                        "this many (0..10) most likely alternatives (vLLM's prompt_logprobs); None = off"),
    "lora_name": ("", check_str, "a LoRA adapter (none loads here)"),
    "mm_info": (None, lambda key, v: v, "multimedia input (none here)"),
    "response_format": (None, _response_format, "guided decoding (a JSON schema), e.g. {'type': 'json_object'}"),
    "uuid": ("", check_str, "the caller's id of the request, returned in its statistics (RequestStatInfo's uuid)"),
    "vocab": (None, _vocab, "DashInfer's JSON-mode vocabulary (token text -> id); ids are checked "
              "against the model, whose own tokenizer is what the engine reads"),
    "vocab_type": (None, _vocab_type, "the tokenizer kind of vocab (a VocabType)"),
    "enable_tensors_from_model_inference": (False, check_bool, "return hidden states in "
                                            "tensors_from_model_inference (not here)"),
}

# DashInfer keys with no effect here, accepted at their neutral value only: key -> (neutral, why).
NEUTRAL_ONLY = {
    "num_beams": (1, "beam search is not implemented"),
    "num_return_sequences": (1, "one sequence per request"),
}


def default(key):
    value = OPTIONS[key][0]
    return value() if callable(value) else value


def check_value(key, value):
    """The normal form of one option's value (a neutral-only key: None), or ValueError."""
    if key in NEUTRAL_ONLY:
        neutral, why = NEUTRAL_ONLY[key]
        if value == neutral or (neutral is None and not value):
            return None
        raise ValueError(f"{key}={brief(value)} is not supported ({why}); only {neutral!r} is accepted")
    return OPTIONS[key][1](key, value)


def check_generation(config, what="generate_config") -> dict:
    """The one check of a generation config's values: a new plain dict with every option, each
    value checked and in its normal form, the missing ones at their defaults. Unknown keys, bad
    values and contradictions raise ValueError (the engine's own limits are checked there)."""
    check_keys(what, config, list(OPTIONS) + list(NEUTRAL_ONLY))
    checked = {key: check_value(key, value) for key, value in config.items()}  # neutral-only: refused unless neutral
    out = {key: value for key, value in checked.items() if key not in NEUTRAL_ONLY}
    for key in OPTIONS.keys() - out.keys():
        out[key] = default(key)
    if out["min_length"] > out["max_length"]:
        raise ValueError(f"min_length ({out['min_length']}) must be <= max_length ({out['max_length']})")
    if out["top_logprobs"] and not out["logprobs"]:
        raise ValueError(f"top_logprobs={out['top_logprobs']} needs logprobs=True")
    return out


class ASGenerationConfig(dict):
    """A checked generation config (see OPTIONS): a dict of every option, whose entries also read
    and write as attributes (cfg.top_k). ASGenerationConfig(d, **kw) checks d's keys and values and
    fills in the defaults; after changes, validate() checks it again."""

    def __init__(self, config=None, **kw):
        super().__init__(check_generation(dict(config or {}, **kw), "ASGenerationConfig"))

    def __getattr__(self, name):
        if name in OPTIONS:
            return self.get(name)
        raise AttributeError(f"ASGenerationConfig has no option {name!r}")

    def __setattr__(self, name, value):
        if name not in OPTIONS:
            raise AttributeError(f"ASGenerationConfig has no option {name!r}")
        self[name] = value

    def validate(self) -> dict:
        """check_generation of the current content (it may have changed since build())."""
        return check_generation(self)

    def to_dict(self) -> dict:
        return dict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ASGenerationConfig":
        check_keys("ASGenerationConfig.from_dict", d, list(OPTIONS))
        return cls(d)


# transformers GenerationConfig attributes DashInfer reads; everything else there is ignored, as
# in DashInfer (max_length included: it is the user's per-request choice here).
_HF_KEYS = ("top_k", "top_p", "temperature", "repetition_penalty", "length_penalty", "min_length",
            "no_repeat_ngram_size")


class ASGenerationConfigBuilder:
    """Fluent builder of ASGenerationConfig: one setter per option of OPTIONS (named after it),
    each checking its value and returning self; update() sets several at once.

    ASGenerationConfigBuilder(hf_gen_config=None, seed=None, eos_token_id=0): empty (DashInfer's
    defaults), or from a transformers GenerationConfig or a dict of its keys (the content of
    generation_config.json). From Hugging Face, as DashInfer does: top_k, top_p, temperature,
    repetition/length penalties, min_length, no_repeat_ngram_size and eos_token_id are taken when
    set (a list of eos ids: eos_token_id is the first, stop_words_ids has each), num_return_sequences other than 1 is refused, and do_sample and early_stopping are turned
    on. seed: None draws one at random.
    """

    def __init__(self, hf_gen_config=None, seed=None, eos_token_id=0):
        self._cfg = {}
        self.eos_token_id(eos_token_id)
        self.seed(default("seed") if seed is None else seed)
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
        for key in _HF_KEYS:
            if get(key) is not None:
                self._set(key, get(key))
        eos = get("eos_token_id")
        if isinstance(eos, (list, tuple)):  # as DashInfer: the first is eos, each one a stop word
            self.update({"eos_token_id": eos[0] if eos else 0, "stop_words_ids": [[e] for e in eos]})
        elif eos is not None:
            self._set("eos_token_id", eos)
        self.do_sample().early_stopping()

    def _set(self, key, value):
        self._cfg[key] = check_value(key, value)
        return self

    def update(self, update_fields: dict) -> "ASGenerationConfigBuilder":
        """Set several keys at once; an unknown key or bad value raises before anything changes.
        DashInfer's num_beams and num_return_sequences are accepted at their neutral values only."""
        check_keys("ASGenerationConfigBuilder.update", update_fields, list(OPTIONS) + list(NEUTRAL_ONLY))
        checked = {key: check_value(key, value) for key, value in update_fields.items()}
        self._cfg.update({k: v for k, v in checked.items() if k not in NEUTRAL_ONLY})
        return self

    def do_sample(self, flag: bool = True):
        return self._set("do_sample", flag)

    def early_stopping(self, flag: bool = True):
        return self._set("early_stopping", flag)

    def logprobs(self, flag: bool = True):
        return self._set("logprobs", flag)

    def suppress_repetition_in_generation(self, flag: bool = True):
        return self._set("suppress_repetition_in_generation", flag)

    def log_probs(self, enable_logprobs: bool, top_logprobs: int = 0):
        """Return logprobs, with the top_logprobs (0..10) most likely alternatives per token."""
        return self.update({"logprobs": enable_logprobs, "top_logprobs": top_logprobs})

    def build(self) -> ASGenerationConfig:
        """A new checked ASGenerationConfig; the builder stays usable."""
        return ASGenerationConfig(self._cfg)


def _setter(key):
    def set_option(self, value):
        return self._set(key, value)
    set_option.__name__ = key
    set_option.__doc__ = OPTIONS[key][2]
    return set_option


for _key in OPTIONS:  # the other setters: one per option, value required
    if not hasattr(ASGenerationConfigBuilder, _key):
        setattr(ASGenerationConfigBuilder, _key, _setter(_key))
ASGenerationConfigBuilder.with_mm_info = ASGenerationConfigBuilder.mm_info  # DashInfer's name
