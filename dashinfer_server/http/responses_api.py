"""OpenAI's Responses API (POST /v1/responses) on the same front end, stateless (as vLLM serves it
without a store): a Responses body is translated into the chat body protocol.parse_chat takes, and
the Deltas generate() yields are shaped into a Response object or its stream of events. (The chat
and completions routes' bodies are responses.py's.)

    instructions                      -> a system message first
    input: a string                   -> a user message
    input items: message              -> a message (input_text / output_text parts joined)
                 function_call        -> a tool call of the assistant message before it (or of a new one)
                 function_call_output -> a tool message
                 reasoning            -> the reasoning of the assistant message or call after it (the
                                         template decides what it keeps, as on the chat route)
    tools (flat function tools)       -> tools[].function; tool_choice {type function, name} -> named
    max_output_tokens -> max_completion_tokens; text.format -> response_format;
    reasoning.effort -> reasoning_effort

The output items follow one another as the model writes them: a new item opens each time the output
changes kind (reasoning, message text, a function call), the same whole or streamed.
"""
import itertools
import json
import time
import uuid

from dashinfer_client.frontend import PromptError
from dashinfer_client.frontend.messages import REASONING_EFFORTS, arguments_object

from .errors import ApiError, bad_request
from .protocol import parse_chat

# Keys passed to the chat body as they are: the Responses API's own, and this server's sampling
# extensions under the chat route's names (timeout: the admission gate's deadline).
_PASSED = {"model", "temperature", "top_p", "parallel_tool_calls", "stream", "timeout", "top_k", "min_p",
           "repetition_penalty", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "stop",
           "chat_template_kwargs"}
# Keys that change nothing in an answer (store: nothing is kept, whatever it says, as vLLM without
# its store; the openai client sends it true by default in some versions).
_NO_EFFECT = {"metadata", "user", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
              "prompt_cache_options", "safety_identifier", "stream_options"}
# Keys that need responses kept on the server.
_STATEFUL = ("previous_response_id", "conversation", "background")
_KNOWN = _PASSED | _NO_EFFECT | {"input", "instructions", "tools", "tool_choice", "max_output_tokens", "text",
                                 "reasoning", "include", "truncation", "max_tool_calls", "top_logprobs", *_STATEFUL}
# include values that ask for nothing this server would leave out: the reasoning comes as text.
_INCLUDABLE = {"reasoning.encrypted_content"}
_TEXT_PARTS = ("input_text", "output_text")
_INCOMPLETE = {"length": "max_output_tokens", "timeout": "timeout"}  # finish reason -> incomplete_details.reason


def parse_responses(body, served) -> list:
    """The request's one choice, as a list (app.py runs every route's choices through Choices)."""
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    for key in _STATEFUL:
        if body.get(key) not in (None, False):
            raise bad_request(f"'{key}' needs responses kept on the server, and this server keeps none: send the "
                              f"whole conversation in 'input'", key)
    for key, neutral in (("truncation", "disabled"), ("max_tool_calls", None), ("top_logprobs", 0)):
        if body.get(key) not in (None, neutral):
            raise bad_request(f"'{key}' is not supported by this server" +
                              (f" (only {neutral!r})" if neutral is not None else ""), key)
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(v, str) and v in _INCLUDABLE for v in include):
        raise bad_request(f"'include' may only hold {', '.join(sorted(_INCLUDABLE))} here, got {include!r}", "include")
    chat = {k: body[k] for k in _PASSED if body.get(k) is not None}
    chat["messages"] = _instructions(body.get("instructions")) + _messages(body.get("input"))
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise bad_request("'max_output_tokens' must be an integer of at least 1", "max_output_tokens")
        chat["max_completion_tokens"] = limit
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text_format = _response_format(body.get("text"))
    if text_format is not None:
        chat["response_format"] = text_format
    effort = _effort(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    job = parse_chat(chat, served)
    job.settings = {
        "instructions": body.get("instructions"), "max_output_tokens": limit, "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False, "previous_response_id": None,
        "reasoning": {"effort": effort, "summary": None}, "store": False,
        "temperature": job.generation["temperature"], "top_p": job.generation["top_p"],
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
        "truncation": "disabled", "user": body.get("user")}
    return [job]


def _instructions(instructions) -> list:
    if instructions is None:
        return []
    if not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string", "instructions")
    return [{"role": "system", "content": instructions}]


def _messages(items) -> list:
    """'input' -> chat messages: a function_call joins the assistant message it follows."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("'input' must be a string or a non-empty list of items", "input")
    out, reasoning = [], None  # reasoning: an item's text, for the assistant output it precedes
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None) if isinstance(item, dict) else None
        if kind == "message":
            if item.get("role") not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}: role must be 'user', 'system', 'developer' or 'assistant'", "input")
            out.append({"role": item["role"], "content": _text(item.get("content"), where)})
            if item["role"] == "assistant" and reasoning is not None:
                out[-1]["reasoning"], reasoning = reasoning, None
        elif kind == "function_call":
            call_id, name, arguments = (item.get(k) for k in ("call_id", "name", "arguments"))
            if not all(isinstance(v, str) for v in (call_id, name, arguments)):
                raise bad_request(f"{where}: a function_call needs 'call_id', 'name' and 'arguments' strings", "input")
            try:
                arguments_object(arguments, where)
            except PromptError as e:
                raise bad_request(str(e), "input") from None
            if not out or out[-1]["role"] != "assistant" or (reasoning is not None and "reasoning" in out[-1]):
                out.append({"role": "assistant", "content": None})
            if reasoning is not None:
                out[-1]["reasoning"], reasoning = reasoning, None
            out[-1].setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where}: a function_call_output needs its 'call_id'", "input")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _text(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, where)
        else:
            raise bad_request(f"{where}: items of type {kind!r} are not supported here (message, function_call, "
                              f"function_call_output, reasoning)", "input")
    return out


def _reasoning_text(item, where) -> str:
    """A reasoning item's text: its reasoning_text content, else its summary (encrypted_content,
    which only OpenAI can read, is no text)."""
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key) or []
        if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                  and p.get("type") == part_type for p in parts):
            raise bad_request(f"{where}.{key} must be a list of {part_type} parts", "input")
        if parts:
            return "".join(p["text"] for p in parts)
    return None


def _text(content, where) -> str:
    """A string, or a list of text parts, as one string (a refusal part, as OpenAI's answers hold
    them, is what the assistant said: its text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: content must be a string or a list of {' / '.join(_TEXT_PARTS)} parts", "input")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("refusal" if kind == "refusal" else "text") if kind in (*_TEXT_PARTS, "refusal") else None
        if not isinstance(text, str):
            raise bad_request(f"{where}.content[{k}]: only text parts ({', '.join(_TEXT_PARTS)}, refusal) are served "
                              f"here, got {kind!r}", "input")
        texts.append(text)
    return "".join(texts)


def _tools(tools):
    """The Responses API's flat function tools -> the chat route's; any other kind is a 400."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of {'type': 'function', 'name', 'description', 'parameters'}",
                          "tools")
    others = sorted({str(t.get("type")) if isinstance(t, dict) else repr(t) for t in tools} - {"function"})
    if others:
        raise bad_request(f"tools of type {', '.join(others)} are not supported here: only 'function' tools", "tools")
    for k, tool in enumerate(tools):
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"tools[{k}]: a function tool needs its 'name'", "tools")
    return [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                              if t.get(k) is not None}} for t in tools]


def _tool_choice(choice):
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request("'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
                      "tool_choice")


def _response_format(text):
    """text.format -> the chat route's response_format."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise bad_request("'text' must be {'format': {...}}", "text")
    if text.get("verbosity") is not None:
        raise bad_request("'text.verbosity' is not supported by this server", "text")
    form = text.get("format")
    kind = form.get("type") if isinstance(form, dict) else None
    if form is None or kind in ("text", "json_object"):
        return form and {"type": kind}
    if kind == "json_schema" and isinstance(form.get("schema"), dict):
        return {"type": "json_schema", "json_schema": {k: form[k] for k in ("name", "description", "schema", "strict")
                                                       if form.get(k) is not None}}
    raise bad_request("'text.format' must be {'type': 'text' | 'json_object'} or {'type': 'json_schema', "
                      "'name': ..., 'schema': {...}}", "text")


def _effort(reasoning):
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict) or set(reasoning) - {"effort", "summary", "generate_summary"}:
        raise bad_request("'reasoning' must be {'effort': ..., 'summary': ...}", "reasoning")
    effort = reasoning.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad_request(f"'reasoning.effort' must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}",
                          "reasoning")
    return effort


class ResponseAnswer:
    """The Response of one request, whole or as the Responses API's stream of events."""

    def __init__(self, job, served):
        self.job = job
        self.id = "resp_" + uuid.uuid4().hex
        self.created_at = int(time.time())
        self.sequence = itertools.count()

    def _response(self, status, output, usage, reason=None) -> dict:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "background": False, "error": None, "incomplete_details": reason and {"reason": reason},
                "model": self.job.model, "output": output, "usage": usage and _usage(usage), **self.job.settings}

    def whole(self, answers, usage) -> dict:
        """answers: [(Job, its Deltas)] of the one choice (Choices.whole)."""
        [(_, deltas)] = answers
        items = _Items()
        for delta in deltas:
            list(items.add(delta))
        list(items.finish(deltas[-1] if deltas else None))
        return self._response(items.status, items.output, usage, items.reason)

    async def events(self, choices, firsts):
        """The stream of the one choice of `choices` (a Choices), whose first Delta is firsts[0]."""
        [first], [deltas] = firsts, choices.streams
        started = self._response("in_progress", [], None)
        yield self._event("response.created", {"response": started})
        yield self._event("response.in_progress", {"response": started})
        items, last = _Items(), None
        try:
            if first is not None:
                last = first
                for kind, body in items.add(first):
                    yield self._event(kind, body)
            async for delta in deltas:
                last = delta
                for kind, body in items.add(delta):
                    yield self._event(kind, body)
        except ApiError as e:  # the request was interrupted mid-stream (a rank failed)
            yield self._event("error", {"code": e.code, "message": e.message, "param": e.param})
            return
        finally:  # the request ends with the stream (a client that leaves ends it too)
            await choices.close()
        for kind, body in items.finish(last):
            yield self._event(kind, body)
        final = self._response(items.status, items.output, choices.usage(), items.reason)
        yield self._event("response.completed" if items.status == "completed" else "response.incomplete",
                          {"response": final})

    def _event(self, kind, body) -> str:
        data = dict(type=kind, sequence_number=next(self.sequence), **body)
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _usage(usage) -> dict:
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


class _Items:
    """The output items of an answer as its Deltas come, and the events that stream them: one item
    open at a time, a new one each time the output changes kind."""

    def __init__(self):
        self.output = []           # the items so far, the open one last
        self.open = None           # the open item, or None
        self.status, self.reason = "completed", None

    def add(self, delta):
        """(event type, body) of each event the Delta makes: its reasoning, the rest of the call
        already open (written before any text of this step), its text, then the calls it begins."""
        if delta.reasoning:
            yield from self._write("reasoning", delta.reasoning)
        parts = delta.tool_call_parts
        begun = next((k for k, p in enumerate(parts) if p.name is not None), len(parts))
        for part in parts[:begun]:
            yield from self._arguments(part.arguments)
        if delta.text:
            yield from self._write("message", delta.text)
        for part in parts[begun:]:  # an item per call, its arguments' JSON in pieces
            if part.name is not None:
                yield from self._close("completed")
                yield from self._start({"type": "function_call", "id": "fc_" + uuid.uuid4().hex,
                                        "call_id": part.id, "name": part.name, "arguments": ""})
            yield from self._arguments(part.arguments)

    def finish(self, last):
        """The events that close the answer, whose last Delta is `last` (None: it had none). An
        answer with no output at all still has its (empty) message, as output_text reads it."""
        self.reason = _INCOMPLETE.get(last.finish_reason) if last is not None else None
        self.status = "incomplete" if self.reason else "completed"
        if not self.output:
            yield from self._start(_EMPTY["message"]())
        yield from self._close(self.status)

    def _arguments(self, text):
        if text:
            self.open["arguments"] += text
            yield "response.function_call_arguments.delta", dict(self._where(), delta=text)

    def _write(self, kind, text):
        if self.open is None or self.open["type"] != kind:
            yield from self._close("completed")
            yield from self._start(_EMPTY[kind]())
        part = self.open["content"][0]
        part["text"] += text
        yield f"response.{part['type']}.delta", dict(self._where(), content_index=0, delta=text,
                                                    **_LOGPROBS.get(kind, {}))

    def _start(self, item):
        self.open = item
        self.output.append(item)
        shown = dict(item, status="in_progress")
        if "content" in item:
            shown["content"] = []
        yield "response.output_item.added", {"output_index": len(self.output) - 1, "item": shown}
        if "content" in item:
            yield "response.content_part.added", dict(self._where(), content_index=0, part=dict(item["content"][0]))

    def _close(self, status):
        item, self.open = self.open, None
        if item is None:
            return
        item["status"] = status
        where = {"item_id": item["id"], "output_index": len(self.output) - 1}
        if item["type"] == "function_call":
            yield "response.function_call_arguments.done", dict(where, name=item["name"],
                                                                 arguments=item["arguments"])
        else:
            part = item["content"][0]
            yield f"response.{part['type']}.done", dict(where, content_index=0, text=part["text"],
                                                       **_LOGPROBS.get(item["type"], {}))
            yield "response.content_part.done", dict(where, content_index=0, part=part)
        yield "response.output_item.done", {"output_index": len(self.output) - 1, "item": item}

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.output) - 1}


# A new item of each kind with text, before its first piece.
_EMPTY = {
    "reasoning": lambda: {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex, "summary": [],
                          "content": [{"type": "reasoning_text", "text": ""}], "status": None},
    "message": lambda: {"type": "message", "id": "msg_" + uuid.uuid4().hex, "role": "assistant", "status": None,
                        "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]},
}
_LOGPROBS = {"message": {"logprobs": []}}  # output_text events carry their (absent) logprobs
