"""A new request, checked against the model that will run it, then built as one Sequence.

The values of the generation options are checked once, by
dashinfer_client.generation_config.check_generation (the builder, the built config and this
module all call it); what this module adds is what depends on the engine: the vocabulary, the
engine's max_length, the KV cache, and the options this runtime does not implement.
"""
from dataclasses import dataclass

import numpy as np

from dashinfer_client.generation_config import check_generation
from dashinfer_client.types import AsStatus

from .guided import GrammarError
from .sequence import Sequence


class RequestError(Exception):
    """A refused request: the AsStatus to answer and the reason."""

    def __init__(self, status: AsStatus, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int
    max_length: int    # the engine's: prompt + generated tokens of any request
    kv_capacity: int   # tokens the whole KV pool holds


def new_request(input_ids, generate_config, limits: ModelLimits, grammars=None) -> Sequence:
    """The Sequence of a request, or RequestError saying why it cannot run on this model.
    grammars: the model's guided.Grammars, which compiles a response_format (None: refused)."""
    prompt = check_prompt(input_ids, limits)
    params = check_options(generate_config, limits, len(prompt))
    return Sequence.start(prompt, params, new_guide(params, grammars))


def new_guide(params: dict, grammars):
    """The request's guided.Guide (its response_format compiled), or None without one."""
    if params["response_format"] is None:
        return None
    if grammars is None:
        raise RequestError(AsStatus.ALLSPARK_PARAM_ERROR, "response_format: this engine has no "
                                                          "grammar compiler for the model")
    try:
        return grammars.guide(params["response_format"], eos_ids(params))
    except GrammarError as e:
        raise RequestError(AsStatus.ALLSPARK_PARAM_ERROR, str(e)) from e


def eos_ids(params: dict) -> list:
    """The eos_token_id option as a list."""
    eos = params["eos_token_id"]
    return eos if isinstance(eos, list) else [eos]


def check_prompt(input_ids, limits: ModelLimits) -> list:
    """input_ids (a list, an array or a tensor of one sequence) -> a list of ints."""
    try:
        arr = np.asarray(input_ids.tolist() if hasattr(input_ids, "tolist") else input_ids)
    except Exception:
        arr = None
    if arr is None or (arr.dtype.kind not in "iu" and arr.size):
        raise RequestError(AsStatus.ALLSPARK_PARAM_ERROR, "input_ids must be a list of integers")
    arr = arr.reshape(-1) if arr.ndim == 2 and arr.shape[0] == 1 else arr
    if arr.ndim != 1:
        raise RequestError(AsStatus.ALLSPARK_PARAM_ERROR,
                           f"input_ids must be one sequence of ids, got shape {arr.shape}")
    if arr.size == 0:
        raise RequestError(AsStatus.ALLSPARK_EMPTY_REQUEST, "input_ids is empty")
    vocab = limits.vocab_size
    bad = arr[(arr < 0) | (arr >= vocab)]
    if bad.size:
        raise RequestError(AsStatus.ALLSPARK_PARAM_ERROR,
                           f"input id {int(bad[0])} is outside the vocabulary [0, {vocab})")
    if arr.size >= limits.max_length:
        raise RequestError(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                           f"prompt of {arr.size} tokens leaves no room under max_length {limits.max_length}")
    if arr.size + 1 > limits.kv_capacity:
        raise RequestError(AsStatus.ALLSPARK_CACHE_MEMORY_OUT,
                           f"prompt of {arr.size} tokens can never fit the KV cache of "
                           f"{limits.kv_capacity} tokens")
    return [int(i) for i in arr]


# Options this runtime does not implement, refused unless at their neutral value:
# key -> (neutral, status, reason).
_UNSUPPORTED = {
    "lora_name": ("", AsStatus.ALLSPARK_LORA_NOT_LOADED, "this runtime loads no LoRA adapters"),
    "mm_info": (None, AsStatus.ALLSPARK_PARAM_ERROR, "mm_info is not supported: this runtime has no "
                                                     "multimodal input"),
    "length_penalty": (1.0, AsStatus.ALLSPARK_PARAM_ERROR,
                       "length_penalty is not supported: DashInfer applies it in beam search only, and "
                       "generation here samples one sequence; use 1.0"),
    "enable_tensors_from_model_inference": (False, AsStatus.ALLSPARK_PARAM_ERROR,
                                            "not supported: this runtime returns no hidden states"),
}


def check_options(generate_config: dict, limits: ModelLimits, prompt_len: int) -> dict:
    """A built generation config (a dict: the API builds builders and refuses other types) -> its
    checked options (a new plain dict, so later changes to the user's config do not reach the
    running request)."""
    try:
        params = check_generation(generate_config)
    except ValueError as e:
        raise RequestError(AsStatus.ALLSPARK_PARAM_ERROR, f"generate_config: {e}") from e
    for key, (neutral, status, why) in _UNSUPPORTED.items():
        if params[key] != neutral:
            raise RequestError(status, f"{key}={params[key]!r}: {why}")
    if params["max_length"] > limits.max_length:
        raise RequestError(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                           f"generation max_length {params['max_length']} exceeds the engine's {limits.max_length}")
    if params["max_length"] <= prompt_len:
        raise RequestError(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                           f"generation max_length {params['max_length']} leaves no room after the "
                           f"{prompt_len}-token prompt")
    for key, ids in (("eos_token_id", eos_ids(params)),
                     ("stop_words_ids", [i for word in params["stop_words_ids"] for i in word]),
                     ("bad_words_ids", [i for word in params["bad_words_ids"] for i in word]),
                     ("vocab", (params["vocab"] or {}).values()),
                     ("logit_bias", params["logit_bias"])):
        if any(i >= limits.vocab_size for i in ids):
            raise RequestError(AsStatus.ALLSPARK_PARAM_ERROR,
                               f"{key} has an id outside the vocabulary 0..{limits.vocab_size - 1}")
    return params
