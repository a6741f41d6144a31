"""OpenAI request bodies -> what the engine takes: the prompt's token ids and a generation config.

Only the shape of a body is checked here (what is a string, a list, a message); every value the
engine knows about is passed on as it came, so the engine refuses it with its own AsStatus and
message (errors.STATUS_TO_HTTP turns that into the HTTP answer). OpenAI options the engine has no
key for are refused here unless they are at their neutral value: none is silently ignored.
"""
from dataclasses import dataclass, field

from dashinfer_client.frontend import PromptError

from .errors import bad_request
from .openai_tools import ToolSettings, chat_messages, name_tool_results, tool_settings

# OpenAI name -> the engine's (ASGenerationConfigBuilder) name, passed through unchanged.
# response_format: OpenAI's forms ("text", "json_object", "json_schema") are the engine's own
# (dashinfer_server/guided.py compiles them), so /v1/completions takes it too.
_SAME_MEANING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
                 "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                 "repetition_penalty": "repetition_penalty", "n": "num_return_sequences",
                 "response_format": "response_format"}
# OpenAI options with no counterpart here: accepted only when absent or neutral.
_UNSUPPORTED = {"functions": None, "function_call": "none", "logit_bias": None, "suffix": None, "echo": False,
                "best_of": 1}

# OpenAI's defaults where the engine's differ (DashInfer samples with top_k 50 by default).
_OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


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
    tools: ToolSettings = field(default_factory=ToolSettings)
    prompt_text: str = ""     # a chat prompt's text (its end may open the reasoning)


def parse_chat(body: dict, served) -> Job:
    messages = name_tool_results(chat_messages(body.get("messages")))
    tools = tool_settings(body)
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    try:
        text = served.prompts.chat_text(messages, tools.functions, template_kwargs)
    except PromptError as e:
        raise bad_request(str(e), "messages") from None
    ids = served.prompts.text_ids(text, special=False)
    logprobs = _count(body, "top_logprobs", 0) if _flag(body, "logprobs") else None
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    job = _job("chat", body, served, ids, max_tokens, logprobs)
    if logprobs is None and body.get("top_logprobs") is not None:
        job.generation["top_logprobs"] = body["top_logprobs"]  # the engine refuses it without logprobs
    job.tools, job.prompt_text = tools, text
    if tools.forced:  # required or a named function: the output is only calls, by grammar
        if body.get("response_format") not in (None, {"type": "text"}):
            raise bad_request("'response_format' and a forced 'tool_choice' cannot go together", "response_format")
        grammar = served.prompts.tool_format.grammar(tools.functions, tools.parallel)
        job.generation["response_format"] = {"type": "grammar", "grammar": grammar}
    return job


def parse_completion(body: dict, served) -> Job:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = served.prompts.text_ids(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = prompt  # token ids: the engine checks them against the vocabulary
    elif isinstance(prompt, list):
        raise bad_request("'prompt' must be a string or a list of token ids; a batch of several "
                          "prompts is not supported: send one request per prompt", "prompt")
    else:
        raise bad_request("'prompt' must be a string or a list of token ids", "prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _count(body, "logprobs", 0)
    return _job("text", body, served, ids, body.get("max_tokens"), logprobs)


def _job(kind, body, served, ids, max_tokens, logprobs) -> Job:
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("'model' must be a string (GET /v1/models lists them)", "model")
    for key, neutral in _UNSUPPORTED.items():
        if body.get(key) not in (None, neutral, {}, []):
            raise bad_request(f"'{key}' is not supported by this server", key)
    generation = dict(_OPENAI_DEFAULTS)
    for key, engine_key in _SAME_MEANING.items():
        if body.get(key) is not None:
            generation[engine_key] = body[key]
    if generation["temperature"] == 0:  # OpenAI's greedy
        generation["do_sample"] = False
    # Token counts after the prompt -> the engine's lengths, which count the prompt too.
    if max_tokens is not None:
        generation["max_length"] = len(ids) + _int(max_tokens, "max_tokens")  # the engine checks it
    else:
        generation["max_length"] = served.max_length
    if body.get("min_tokens") is not None:
        generation["min_length"] = len(ids) + _int(body["min_tokens"], "min_tokens")
    if logprobs is not None:
        generation.update(logprobs=True, top_logprobs=logprobs)
    stop = _stop(body.get("stop"))
    if stop:
        generation["stop_words_ids"] = served.prompts.word_ids(stop)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    return Job(kind, model, list(ids), generation, max_tokens, stop, _flag(body, "stream"),
               bool(options.get("include_usage")), logprobs)


def _stop(stop) -> list:
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("'stop' must be a non-empty string or a list of them", "stop")
    return stop


def _flag(body, key) -> bool:
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
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{key}' must be an integer", key)
    return value
