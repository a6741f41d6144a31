"""Anthropic's Messages API on the same front end: a /v1/messages body is translated into the
OpenAI chat body protocol.parse_chat takes (messages, tools, tool_choice, stop, sampling), and the
Deltas generate() yields are shaped into a Message or its stream of events.

    system                    -> a system message
    content blocks            text; tool_use (assistant) -> tool_calls; tool_result (user) -> tool messages;
                              thinking (assistant) -> reasoning, as vLLM's (the template decides what it
                              keeps: Anthropic's own keeps a tool-use loop's); redacted_thinking dropped
    a final assistant message -> continue_final_message (the answer continues it: a prefill)
    stop_sequences            -> stop (stop_reason "stop_sequence", stop_sequence the one met)
    tools[].input_schema      -> tools[].function.parameters
    tool_choice auto/any/tool/none (+ disable_parallel_tool_use) -> auto/required/named/none
    thinking enabled/disabled -> chat_template_kwargs.enable_thinking; reasoning -> thinking blocks
    output_config.format      -> response_format json_schema (structured outputs: the text is the JSON)
    output_config.effort      -> reasoning_effort
"""
import json
import uuid

from .errors import ApiError, bad_request
from .generate import Usage
from .protocol import parse_chat

# HTTP status -> Anthropic's error type.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# Keys of a Messages body that change nothing here: who asks, where and how fast it is billed to
# run, and cache_control (the prefix cache keeps every prompt's blocks anyway).
_IGNORED = {"metadata", "service_tier", "cache_control", "inference_geo", "speed", "user_profile_id",
            "workspace_id", "diagnostics"}
# timeout: DashInfer's deadline, read by the admission gate as on the OpenAI routes.
_KNOWN = {"model", "max_tokens", "messages", "system", "stop_sequences", "stream", "temperature", "top_p",
          "top_k", "tools", "tool_choice", "thinking", "output_config", "timeout"} | _IGNORED
_EFFORTS = ("low", "medium", "high", "xhigh", "max")  # Anthropic's; the template's are REASONING_EFFORTS


def is_route(path) -> bool:
    return path.startswith("/v1/messages")


def error_body(e: ApiError) -> dict:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.http_status, "api_error"), "message": e.message}}


def parse_messages(body, served) -> list:
    """The request's one choice, as a list (app.py runs every route's choices through Choices)."""
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise bad_request("'max_tokens' is required: an integer", "max_tokens")
    return [parse_chat(_openai_body(body), served)]


def parse_count_tokens(body, served):
    return parse_chat(dict(_openai_body(body), max_tokens=None), served)


def _openai_body(body) -> dict:
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise bad_request(f"unknown field(s) {', '.join(unknown)}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects")
    out = {"model": body.get("model"), "max_tokens": body.get("max_tokens"),
           "messages": _system(body.get("system")) + [m for i, msg in enumerate(messages)
                                                      for m in _message(i, msg)]}
    final = out["messages"][-1]
    if final["role"] == "assistant":  # the answer continues it, as Anthropic's prefill
        if final["content"] != final["content"].rstrip():
            raise bad_request("messages: final assistant content cannot end with trailing whitespace")
        out["continue_final_message"] = True
    for key in ("temperature", "top_p", "top_k", "stream"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences") is not None:
        if not isinstance(body["stop_sequences"], list):  # OpenAI's stop takes a lone string; this does not
            raise bad_request("'stop_sequences' must be a list of strings", "stop_sequences")
        out["stop"] = body["stop_sequences"]
    if body.get("tools") is not None:
        out["tools"] = _tools(body["tools"])
        out["tool_choice"], out["parallel_tool_calls"] = _tool_choice(body.get("tool_choice"))
    elif body.get("tool_choice") is not None:
        raise bad_request("'tool_choice' needs 'tools'")
    thinking = body.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled", "adaptive"):
            raise bad_request("'thinking' must be {'type': 'enabled' | 'disabled' | 'adaptive', ...}")
        if thinking["type"] != "adaptive":  # adaptive: the model decides, so the template's default
            out["chat_template_kwargs"] = {"enable_thinking": thinking["type"] == "enabled"}
    if body.get("output_config") is not None:
        out.update(_output_config(body["output_config"]))
    return out


def _output_config(config) -> dict:
    """output_config -> the OpenAI body's response_format and reasoning_effort."""
    shape = "'output_config' must be {'effort': ..., 'format': {'type': 'json_schema', 'schema': {...}}}"
    if not isinstance(config, dict) or set(config) - {"effort", "format"}:
        raise bad_request(shape, "output_config")
    out = {}
    if config.get("effort") is not None:
        if config["effort"] not in _EFFORTS:
            raise bad_request(f"'output_config.effort' must be one of {', '.join(_EFFORTS)}, got {config['effort']!r}",
                              "output_config")
        out["reasoning_effort"] = config["effort"]
    fmt = config.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict) \
                or set(fmt) - {"type", "schema"}:
            raise bad_request(shape, "output_config")
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"],
                                                                         "strict": True}}
    return out


def _system(system) -> list:
    if system is None:
        return []
    return [{"role": "system", "content": _text(system, "system")}]


def _text(content, where) -> str:
    """A string, or a list of text blocks, as one string."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" and
                                         isinstance(b.get("text"), str) for b in content):
        return "".join(b["text"] for b in content)
    raise bad_request(f"{where} must be a string or a list of text blocks")


def _message(i, m) -> list:
    """One Anthropic message -> OpenAI messages (tool results become tool messages)."""
    where = f"messages.{i}"
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise bad_request(f"{where}: role must be 'user' or 'assistant'")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of content blocks")
    texts, thoughts, calls, results = [], [], [], []
    for k, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.content.{k}"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and m["role"] == "assistant":
            if not isinstance(block.get("thinking"), str):
                raise bad_request(f"{at}: a thinking block needs its 'thinking' text")
            thoughts.append(block["thinking"])
        elif kind == "redacted_thinking" and m["role"] == "assistant":
            continue  # encrypted by Anthropic: nothing a template could write
        elif kind == "tool_use" and m["role"] == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or \
                    not isinstance(block.get("input"), dict):
                raise bad_request(f"{at}: a tool_use block needs 'id', 'name' and an 'input' object")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
        elif kind == "tool_result" and m["role"] == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise bad_request(f"{at}: a tool_result block needs its 'tool_use_id'")
            result = block.get("content", "")
            text = _text(result, f"{at}.content") if result is not None else ""
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": ("Error: " + text) if block.get("is_error") else text})
        else:
            raise bad_request(f"{at}: a {m['role']} message takes text"
                              f"{', thinking, tool_use' if m['role'] == 'assistant' else ', tool_result'} blocks, "
                              f"got {kind!r}")
    out = results
    if texts or thoughts or calls or not results:
        message = {"role": m["role"], "content": "".join(texts)}
        if thoughts:
            message["reasoning"] = "".join(thoughts)
        if calls:
            message["tool_calls"] = calls
        out = out + [message]
    return out


def _tools(tools) -> list:
    if not isinstance(tools, list) or not tools:
        raise bad_request("'tools' must be a non-empty list of {name, description, input_schema}")
    out = []
    for k, t in enumerate(tools):
        if isinstance(t, dict) and t.get("type") not in (None, "custom"):  # Anthropic runs those itself
            raise bad_request(f"tools.{k}: server tool {t.get('type')!r} is not supported here: only custom tools "
                              "(name, description, input_schema), which the client runs")
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("input_schema"), dict):
            raise bad_request(f"tools.{k} must be {{'name': str, 'description': str, 'input_schema': {{...}}}}")
        function = {"name": t["name"], "parameters": t["input_schema"]}
        if t.get("description") is not None:
            function["description"] = t["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice):
    """-> (OpenAI tool_choice, parallel_tool_calls)."""
    if choice is None:
        return "auto", True
    kind = choice.get("type") if isinstance(choice, dict) else None
    parallel = not choice.get("disable_parallel_tool_use", False) if isinstance(choice, dict) else True
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise bad_request("'tool_choice' must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}")


class MessageAnswer:
    """The Message of one request, whole or as Anthropic's stream of events."""

    def __init__(self, job, served):
        self.job = job
        self.id = "msg_" + uuid.uuid4().hex

    def _message(self, content, stop_reason, stop_sequence, usage) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.job.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "usage": _usage(usage)}

    def whole(self, answers, usage) -> dict:
        """answers: [(Job, its Deltas)] of the one choice (Choices.whole)."""
        [(_, deltas)] = answers
        reasoning = "".join(d.reasoning for d in deltas)
        text = "".join(d.text for d in deltas)
        content = [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []
        if text:  # an empty answer has no block (Anthropic's "content": []), as its stream opens none
            content.append({"type": "text", "text": text})
        content += [_tool_use(c) for d in deltas for c in d.tool_calls]
        return self._message(content, *_stop(deltas[-1]), usage)

    async def events(self, choices, firsts):
        """The stream of the one choice of `choices` (a Choices), whose first Delta is firsts[0]."""
        [first], [deltas], [usage] = firsts, choices.streams, choices.usages
        # what message_start counts: the prompt (the first delta is taken already, not yet sent)
        yield _event("message_start", {"message": self._message([], None, None, Usage(usage.prompt_tokens, 0,
                                                                                       usage.cached_tokens))})
        yield _event("ping", {})
        blocks = _Blocks()
        last = None
        try:
            if first is not None:
                last = first
                for event in blocks.add(first):
                    yield event
            async for delta in deltas:
                last = delta
                for event in blocks.add(delta):
                    yield event
        except ApiError as e:  # the request was interrupted mid-stream (a rank failed)
            yield _event("error", {"error": error_body(e)["error"]})
            return
        finally:  # the request ends with the stream (a client that leaves ends it too)
            await choices.close()
        for event in blocks.close():
            yield event
        stop_reason, stop_sequence = _stop(last) if last is not None else ("end_turn", None)
        yield _event("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                       "usage": _usage(usage)})
        yield _event("message_stop", {})


def _usage(usage) -> dict:
    """Anthropic's: input_tokens are the prompt's tokens the prefix cache did not give
    (cache_read_input_tokens); the reasoning's tokens are thinking_tokens, markers not counted."""
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"thinking_tokens": usage.reasoning_tokens}}


class _Blocks:
    """The content blocks of a streamed Message: one open at a time, each a new index."""

    def __init__(self):
        self.index, self.open = -1, None  # the open block's kind: "thinking", "text" or None

    def add(self, delta):
        if delta.reasoning:
            yield from self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            yield self._delta({"type": "thinking_delta", "thinking": delta.reasoning})
        if delta.text:
            yield from self._switch("text", {"type": "text", "text": ""})
            yield self._delta({"type": "text_delta", "text": delta.text})
        for part in delta.tool_call_parts:  # a block per call, its input's JSON in pieces
            if part.name is not None:
                yield from self.close()
                yield from self._switch("tool_use", {"type": "tool_use", "id": _tool_use_id(part.id),
                                                     "name": part.name, "input": {}})
            if part.arguments:
                yield self._delta({"type": "input_json_delta", "partial_json": part.arguments})

    def close(self):
        if self.open is not None:
            yield _event("content_block_stop", {"index": self.index})
            self.open = None

    def _switch(self, kind, block):
        if self.open == kind:
            return
        yield from self.close()
        self.index, self.open = self.index + 1, kind
        yield _event("content_block_start", {"index": self.index, "content_block": block})

    def _delta(self, delta):
        return _event("content_block_delta", {"index": self.index, "delta": delta})


def _tool_use(call) -> dict:
    return {"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name, "input": call.arguments_dict()}


def _tool_use_id(call_id) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _stop(last):
    """(stop_reason, stop_sequence) of the answer's last Delta."""
    if last.stop_string is not None:
        return "stop_sequence", last.stop_string
    return _STOP_REASONS.get(last.finish_reason, "end_turn"), None


def _event(kind, body) -> str:
    return f"event: {kind}\ndata: {json.dumps(dict(type=kind, **body), ensure_ascii=False)}\n\n"
