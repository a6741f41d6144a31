"""OpenAI request bodies -> what the engine takes: the prompt's token ids and a generation config.

Only the shape of a body is checked here (what is a string, a list, a message); every value the
engine knows about is passed on as it came, so the engine refuses it with its own AsStatus and
message (errors.STATUS_TO_HTTP turns that into the HTTP answer). OpenAI options the engine has no
key for are refused here unless they are at their neutral value: none is silently ignored.
"""
import dataclasses
import hashlib
from dataclasses import dataclass, field

from dashinfer_client.frontend import PromptError
from dashinfer_client.frontend.messages import template_kwargs

from .errors import ApiError, bad_request

from .openai_tools import ToolSettings, chat_messages, tool_settings

# OpenAI name -> the engine's (ASGenerationConfigBuilder) name, passed through unchanged.
# response_format: OpenAI's forms ("text", "json_object", "json_schema") are the engine's own
# (dashinfer_server/guided.py compiles them), so /v1/completions takes it too.
_SAME_MEANING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "seed": "seed", "presence_penalty": "presence_penalty",
                 "frequency_penalty": "frequency_penalty", "repetition_penalty": "repetition_penalty",
                 "logit_bias": "logit_bias", "response_format": "response_format"}
# OpenAI options with no counterpart here: accepted only when absent or neutral.
_UNSUPPORTED = {"functions": None, "function_call": "none", "suffix": None, "best_of": 1,
                "modalities": ["text"], "audio": None, "verbosity": None, "web_search_options": None}
# OpenAI options that change nothing in an answer (bookkeeping, caching hints; a prediction only
# speeds up generation): accepted and unused.
_NO_EFFECT = {"user", "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
              "prompt_cache_options", "safety_identifier", "prediction"}
# Every key a body may have: the options of both routes, this server's extensions (vLLM's names:
# top_k, min_p, repetition_penalty, min_tokens, chat_template_kwargs, continue_final_message,
# add_generation_prompt, prompt_logprobs; DashInfer's deadline, timeout, read by the admission gate).
# Anything else is refused as OpenAI does: never silently ignored.
_COMMON = {"model", "n", "stream", "stream_options", "stop", "max_tokens", "min_tokens", "logprobs", "timeout",
           "prompt_logprobs", *_SAME_MEANING, *_UNSUPPORTED, *_NO_EFFECT}
_KEYS = {"chat": _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                            "parallel_tool_calls", "chat_template_kwargs", "reasoning_effort", "echo",
                            "continue_final_message", "add_generation_prompt"},
         "text": _COMMON | {"prompt", "echo"}}
# What a request that leaves sampling out gets: OpenAI's neutral values (DashInfer's own top_k is
# 50), under the model's generation_config.json where it names these keys, as vLLM does.
_OPENAI_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
_MODEL_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
MAX_CHOICES = 128  # n times the prompts of one request: more is a 400, not a flood of requests


def sampling_defaults(generation_config: dict) -> dict:
    """The sampling options of a request that names none, from the model's generation_config."""
    named = {k: generation_config[k] for k in _MODEL_SAMPLING_KEYS if generation_config.get(k) is not None}
    return dict(_OPENAI_SAMPLING, **named)


@dataclass
class Job:
    """One parsed request: what to run and how to answer."""
    kind: str                 # "chat" or "text"
    model: str
    prompt_ids: list
    generation: dict          # keys of ASGenerationConfigBuilder.update, checked by the engine
    max_tokens: int = None    # None: up to the model's length limit
    stop: list = field(default_factory=list)   # stop strings, cut from the answer
    stream: bool = False
    include_usage: bool = False
    logprobs: int = None      # None: no logprobs; else the top alternatives per token
    index: int = 0            # the choice's index in the answer
    prompt_index: int = 0     # which prompt of a batch (usage counts each prompt once)
    echo: str = ""            # text put before the answer (/v1/completions' echo)
    echo_logprobs: bool = False  # the echoed prompt's tokens lead the logprobs (echo with logprobs)
    prompt_logprobs: int = None  # vLLM's prompt_logprobs: None, or the top alternatives per prompt token
    tools: ToolSettings = field(default_factory=ToolSettings)
    prompt_text: str = ""     # a chat prompt's text (its end may open the reasoning)
    settings: dict = None     # what the answer repeats of its request (a Responses API Response does)


def check_model(body: dict, served) -> None:
    """A named model must be the served one (404 otherwise, as OpenAI answers); its type is
    checked where the model is required."""
    model = body.get("model")
    if isinstance(model, str) and model != served.name:
        raise ApiError(404, f"model {model!r} does not exist; this server serves {served.name!r}",
                       param="model", code="model_not_found")


def chat_choices(body: dict, served) -> list:
    """A /v1/chat/completions request's choices, one Job each, in index order."""
    n = _choice_count(body, 1)
    return _choices([parse_chat(body, served)], n)


def chat_prompt(body: dict, served):
    """The conversation of a chat body through the model's chat template, its tools described as
    the template wants them -> (prompt text, ToolSettings). /tokenize reads it the same way.
    vLLM's continue_final_message (false) leaves the final message, the assistant's, open for the
    model to continue (a prefill) instead of opening a new turn (add_generation_prompt: true unless
    continuing)."""
    messages = chat_messages(body.get("messages"))
    tools = tool_settings(body)
    continue_final = flag(body, "continue_final_message")
    open_turn = flag(body, "add_generation_prompt") if body.get("add_generation_prompt") is not None else \
        not continue_final
    if continue_final and open_turn:
        raise bad_request("'continue_final_message' continues the final message: 'add_generation_prompt', which "
                          "opens a new turn, cannot be true with it", "add_generation_prompt")
    try:
        options = template_kwargs(body.get("chat_template_kwargs"), reasoning_effort=body.get("reasoning_effort"))
        return served.prompts.chat_text(messages, tools.functions, options, continue_final, open_turn), tools
    except PromptError as e:
        raise bad_request(str(e), e.param or "messages") from None


JSON_FORMS = ("json_object", "json_schema")


def parse_chat(body: dict, served) -> Job:
    """A chat request as one Job (its first choice)."""
    text, tools = chat_prompt(body, served)
    ids = served.prompts.text_ids(text, special=False)
    logprobs = _count(body, "top_logprobs", 0) if flag(body, "logprobs") else None
    max_tokens = body.get("max_completion_tokens")  # OpenAI's name now; max_tokens the deprecated one
    max_tokens = body.get("max_tokens") if max_tokens is None else max_tokens
    job = _job("chat", body, served, ids, max_tokens, logprobs)
    if logprobs is None and body.get("top_logprobs") is not None:
        job.generation["top_logprobs"] = body["top_logprobs"]  # the engine refuses it without logprobs
    if body.get("echo") not in (None, False):
        raise bad_request("'echo' is an option of /v1/completions", "echo")
    job.tools, job.prompt_text = tools, text
    if tools.forced:  # required or a named function: the output is only calls, by grammar
        if body.get("response_format") not in (None, {"type": "text"}):
            raise bad_request("'response_format' and a forced 'tool_choice' cannot go together", "response_format")
        grammar = served.prompts.forced_call_grammar(tools.functions, tools.parallel)
        job.generation["response_format"] = {"type": "grammar", "grammar": grammar}
    # JSON answers and forced calls may be reasoned first, as in vLLM; a client's own lark grammar
    # (DashInfer's form) is the whole answer as written, its reasoning included
    constrained = job.generation.get("response_format")
    bounds = served.prompts.reasoning_bounds(text, calls=tools.forced)
    if bounds and isinstance(constrained, dict) and (tools.forced or constrained.get("type") in JSON_FORMS):
        job.generation["response_format"] = dict(constrained, **bounds)
    return job


def completion_choices(body: dict, served) -> list:
    """A /v1/completions request's choices, one Job each: n per prompt, in OpenAI's order (prompt by prompt)."""
    prompts = _prompts(body.get("prompt"))
    n = _choice_count(body, len(prompts))  # before tokenizing them all
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _count(body, "logprobs", 0)
    echo = flag(body, "echo")
    jobs = []
    for i, prompt in enumerate(prompts):
        ids = served.prompts.text_ids(prompt) if isinstance(prompt, str) else prompt  # ids: the engine checks them
        job = _job("text", body, served, ids, body.get("max_tokens"), logprobs)
        job.prompt_index = i
        if echo:
            job.echo = prompt if isinstance(prompt, str) else served.tokenizer.decode(prompt)
        if echo and logprobs is not None:  # the prompt's tokens scored too (lm-evaluation-harness' loglikelihood)
            job.echo_logprobs = True
            job.generation["prompt_logprobs"] = max(logprobs, job.prompt_logprobs or 0)
        jobs.append(job)
    return _choices(jobs, n)


def _prompts(prompt) -> list:
    """/v1/completions' prompt: a string, token ids, or a batch of either -> a list of prompts."""
    def is_ids(p):  # empty: the engine refuses it (ALLSPARK_EMPTY_REQUEST)
        return isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
    if isinstance(prompt, str) or is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p) for p in prompt):
        return prompt
    raise bad_request("'prompt' must be a string, a list of token ids, or a non-empty list of either "
                      "(a batch)", "prompt")


def _choice_count(body, prompts) -> int:
    n = _count(body, "n", 1)
    if not 1 <= n or n * prompts > MAX_CHOICES:
        raise bad_request(f"'n' times the prompts must be in [1, {MAX_CHOICES}], got n={n} for "
                          f"{prompts} prompt(s)", "n")
    return n


def _choices(jobs, n) -> list:
    """n choices of each job, indexed in order. With a seed, choice i > 0 of a prompt samples with
    a seed derived from it: the choices differ, and the same request gives the same choices."""
    out = []
    for job in jobs:
        for i in range(n):
            generation = dict(job.generation)
            if i and _is_int(generation.get("seed")):
                generation["seed"] = choice_seed(generation["seed"], i)
            out.append(dataclasses.replace(job, generation=generation, index=len(out)))
    return out


def choice_seed(seed: int, i: int) -> int:
    """The seed of choice i of a request seeded with `seed` (an int the engine takes: < 2**63)."""
    digest = hashlib.blake2b(f"{seed}/{i}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _job(kind, body, served, ids, max_tokens, logprobs) -> Job:
    unknown = sorted(set(body) - _KEYS[kind])
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("'model' must be a string (GET /v1/models lists them)", "model")
    presence = body.get("presence_penalty")
    if isinstance(presence, (int, float)) and not isinstance(presence, bool) and not -2 <= presence <= 2:
        raise bad_request("'presence_penalty' must be in [-2, 2]", "presence_penalty")  # OpenAI's range, not the engine's
    for key, neutral in _UNSUPPORTED.items():
        if body.get(key) not in (None, neutral, {}, []):
            raise bad_request(f"'{key}' is not supported by this server", key)
    generation = dict(served.sampling_defaults)
    for key, engine_key in _SAME_MEANING.items():
        if body.get(key) is not None:
            generation[engine_key] = body[key]
    if generation["temperature"] == 0:  # OpenAI's greedy
        generation["do_sample"] = False
    # Token counts after the prompt -> the engine's lengths, which count the prompt too. An echoed
    # prompt may be scored alone (max_tokens 0, as OpenAI took it): the engine's one token is not shown.
    if max_tokens is not None:  # the engine checks the length against the model's
        least = 0 if kind == "text" and flag(body, "echo") else 1
        generation["max_length"] = len(ids) + max(_at_least(max_tokens, least, "max_tokens"), 1)
    else:
        generation["max_length"] = served.max_length
    if body.get("min_tokens") is not None:
        generation["min_length"] = len(ids) + _at_least(body["min_tokens"], 0, "min_tokens")
    if logprobs is not None:
        generation.update(logprobs=True, top_logprobs=logprobs)
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is not None:  # vLLM's; its range is the engine's to check
        generation["prompt_logprobs"] = _int(prompt_logprobs, "prompt_logprobs")
        if flag(body, "stream"):  # vLLM's rule and words
            raise bad_request("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
    stop = _stop(body.get("stop"))
    if stop:
        generation["stop_words_ids"] = served.prompts.word_ids(stop)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    if body.get("stream_options") is not None and not flag(body, "stream"):
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
    return Job(kind, model, list(ids), generation, max_tokens, stop, flag(body, "stream"),
               bool(options.get("include_usage")), logprobs, prompt_logprobs=prompt_logprobs)


def _stop(stop) -> list:
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("'stop' must be a non-empty string or a list of them", "stop")
    return stop


def flag(body, key) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{key}' must be true or false", key)
    return value


def _count(body, key, default) -> int:
    value = body.get(key)
    return default if value is None else _int(value, key)  # its range is the engine's to check


def _int(value, key) -> int:
    if not _is_int(value):
        raise bad_request(f"'{key}' must be an integer", key)
    return value


def _at_least(value, low, key) -> int:
    if _int(value, key) < low:
        raise bad_request(f"'{key}' must be at least {low}, got {value}", key)
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
