"""GenerationConfig (LMDeploy's names and defaults) and its translation into DashInfer's
generation options for one prompt.

  do_sample                          scripts for either LMDeploy run as written there:
                                     True: sampling (top_k left unset: 50, LMDeploy >= 0.6's default);
                                     False: greedy whatever else is set, no repetition penalty
                                     (LMDeploy >= 0.6);
                                     None (unset): LMDeploy < 0.6's rule: greedy when top_k is 1 or
                                     left unset (its default top_k=1), else sampling
  top_k / top_p / temperature / min_p  sampling with these (top_k 0 = no cut); top_k 1 or
                                     temperature 0 is greedy
  max_new_tokens                     max_length = prompt + max_new_tokens, at most session_len
  min_new_tokens                     min_length = prompt + min_new_tokens (no eos before)
  ignore_eos                         early_stopping off: eos is an ordinary token
  stop_words / bad_words             strings, each encoded by the model's tokenizer into one token
                                     sequence: generating it ends the request / it is never generated
  stop_token_ids / bad_token_ids     single ids, the same
  random_seed                        the request's sampling seed
  logprobs                           N: the log-probability of each token and its N most likely
                                     alternatives (N <= 10)
  response_format                    LMDeploy's guided decoding: {"type": "json_schema", "json_schema":
                                     {"name", "schema"}} or {"type": "regex_schema", "regex_schema": R}
                                     (the answer matches the regular expression R)
"""
import dataclasses
from dataclasses import dataclass
from typing import List, Optional

from ..generation_config import MAX_TOP_LOGPROBS, check_value

# top_k left unset (None): LMDeploy >= 0.6's default when do_sample=True, else LMDeploy < 0.6's
# (its GenerationConfig had no do_sample: top_k=1, greedy, was how it was asked for).
SAMPLING_TOP_K = 50
LEGACY_TOP_K = 1

# pipe(...)'s deprecated per-call keywords -> GenerationConfig field.
DEPRECATED = {"request_output_len": "max_new_tokens", "top_k": "top_k", "top_p": "top_p",
              "temperature": "temperature", "repetition_penalty": "repetition_penalty",
              "ignore_eos": "ignore_eos"}


@dataclass
class GenerationConfig:
    n: int = 1
    max_new_tokens: int = 512
    top_p: float = 1.0
    top_k: Optional[int] = None  # None: SAMPLING_TOP_K with do_sample=True, else LEGACY_TOP_K
    temperature: float = 0.8
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    random_seed: Optional[int] = None
    stop_words: Optional[List[str]] = None
    bad_words: Optional[List[str]] = None
    min_new_tokens: Optional[int] = None
    skip_special_tokens: bool = True
    logprobs: Optional[int] = None
    stop_token_ids: Optional[List[int]] = None
    bad_token_ids: Optional[List[int]] = None
    do_sample: Optional[bool] = None  # None: a script for LMDeploy < 0.6, which had no do_sample
    min_p: float = 0.0
    response_format: Optional[dict] = None

    def __post_init__(self):
        if self.n != 1:
            raise ValueError(f"GenerationConfig.n={self.n!r}: only n=1 is supported (one answer per prompt); "
                             "pass the prompt several times with different random_seed values instead")
        for name in ("top_p", "temperature", "repetition_penalty", "min_p"):  # the engine's own limits
            try:
                check_value(name, getattr(self, name))
            except ValueError as e:
                raise ValueError(f"GenerationConfig.{e}") from None
        _positive("max_new_tokens", self.max_new_tokens, 1)
        _positive("min_new_tokens", self.min_new_tokens, 0, none_ok=True)
        _positive("top_k", self.top_k, 0, none_ok=True)
        if self.do_sample is not None and not isinstance(self.do_sample, bool):
            raise ValueError(f"GenerationConfig.do_sample must be a bool or None, got {self.do_sample!r}")
        _positive("logprobs", self.logprobs, 0, none_ok=True, hi=MAX_TOP_LOGPROBS)
        _positive("random_seed", self.random_seed, 0, none_ok=True)
        for name in ("stop_words", "bad_words"):
            words = getattr(self, name)
            if words is not None and (isinstance(words, str) or not all(isinstance(w, str) and w for w in words)):
                raise ValueError(f"GenerationConfig.{name} must be a list of non-empty strings, got {words!r}")
        for name in ("stop_token_ids", "bad_token_ids"):
            ids = getattr(self, name)
            if ids is not None and (isinstance(ids, (str, bytes)) or not all(
                    isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
                raise ValueError(f"GenerationConfig.{name} must be a list of token ids, got {ids!r}")
        if self.response_format is not None and not isinstance(self.response_format, dict):
            raise ValueError(f"GenerationConfig.response_format must be a dict or None, got {self.response_format!r}")
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GenerationConfig.{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def sampling_top_k(self) -> int:
        """top_k as the engine takes it (0 = no cut)."""
        if self.top_k is not None:
            return self.top_k
        return SAMPLING_TOP_K if self.do_sample else LEGACY_TOP_K

    @property
    def greedy(self) -> bool:
        return self.do_sample is False or self.sampling_top_k == 1 or self.temperature == 0

    def with_deprecated(self, kwargs) -> "GenerationConfig":
        """A copy with pipe()'s deprecated keywords applied; anything else raises TypeError."""
        unknown = sorted(set(kwargs) - set(DEPRECATED))
        if unknown:
            raise TypeError(f"pipe() got unknown keyword argument(s) {', '.join(unknown)}; generation "
                            f"options go in gen_config=GenerationConfig(...)")
        return dataclasses.replace(self, **{DEPRECATED[k]: v for k, v in kwargs.items()}) if kwargs else self


def _positive(name, value, lo, none_ok=False, hi=None):
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"GenerationConfig.{name} must be an int {bound}"
                         f"{' or None' if none_ok else ''}, got {value!r}")


def encode_words(prompts, words, ids):
    """Token sequences of the strings `words` (prompts: the front end's Prompts) and of the single
    ids `ids`."""
    return prompts.word_ids(words) + [[i] for i in ids or ()]


def request_options(gen: GenerationConfig, prompt_len: int, session_len: int, stop_words_ids,
                    bad_words_ids) -> dict:
    """DashInfer generation options (ASGenerationConfigBuilder.update) for one prompt."""
    max_length = min(session_len, prompt_len + gen.max_new_tokens)
    options = {
        "max_length": max_length,
        "early_stopping": not gen.ignore_eos,
        # LMDeploy >= 0.6 drops the penalty of a do_sample=False config along with its sampling
        "repetition_penalty": 1.0 if gen.do_sample is False else gen.repetition_penalty,
        "stop_words_ids": stop_words_ids,
        "bad_words_ids": bad_words_ids,
    }
    if gen.greedy:
        options.update(do_sample=False, top_k=0, top_p=1.0)
    else:
        options.update(do_sample=True, temperature=gen.temperature, top_k=gen.sampling_top_k, top_p=gen.top_p,
                       min_p=gen.min_p)
    if gen.min_new_tokens:
        options["min_length"] = min(max_length, prompt_len + gen.min_new_tokens)
    if gen.random_seed is not None:
        options["seed"] = gen.random_seed
    if gen.logprobs is not None:
        options.update(logprobs=True, top_logprobs=gen.logprobs)
    if gen.response_format is not None:
        options["response_format"] = _engine_response_format(gen.response_format)
    return options


def _engine_response_format(response_format: dict) -> dict:
    """LMDeploy's response_format as the engine's (dashinfer_server/guided.py): a regex_schema
    becomes a lark grammar of that one regular expression; the others are the engine's own forms."""
    if response_format.get("type") != "regex_schema":
        return response_format
    regex = response_format.get("regex_schema")
    if not isinstance(regex, str) or not regex:
        raise ValueError("GenerationConfig.response_format: regex_schema must be a non-empty string")
    return {"type": "grammar", "grammar": "start: /" + regex.replace("/", "\\/") + "/\n"}
