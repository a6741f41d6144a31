"""What a front door takes from its caller before the chat template: OpenAI-shaped conversations,
tools and template options, checked, into the front end's normalized forms (prompts.py says
them). The HTTP server (which answers a PromptError as a 400) and the pipeline (where it is the
ValueError raised) read conversations here, so a tool round trip has one shape everywhere:

    {"role": "assistant", "content": str | None, "reasoning_content": str,
     "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": JSON text | dict}}]}
    {"role": "tool", "tool_call_id": str, "content": str}

An assistant turn's reasoning, which a template may write back (Qwen3's during a tool-call loop,
gpt-oss's before a call), is taken under any of REASONING_KEYS.
"""
import json
import uuid

ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI's reasoning efforts -> what a chat template takes (gpt-oss's "Reasoning: low | medium |
# high"): the ones past those ends are the nearest end. "none" also turns thinking off where a
# template reads enable_thinking (Qwen3's), unless the request names enable_thinking itself.
REASONING_EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
                     "xhigh": "high", "max": "high"}
# An assistant turn's reasoning: vLLM's name, its earlier one (this server's answers, DeepSeek's
# API), transformers' (gpt-oss's template); the first one given counts.
REASONING_KEYS = ("reasoning", "reasoning_content", "thinking")


class PromptError(ValueError):
    """The conversation cannot be made into a prompt (the message says why; param: the option
    at fault, where it is not the conversation)."""

    def __init__(self, message, param=None):
        super().__init__(message)
        self.param = param


def chat_messages(messages, where="messages") -> list:
    """A conversation -> normalized messages (developer is system; content parts joined; past calls'
    arguments as objects; each tool result named after the call it answers)."""
    if not isinstance(messages, list) or not messages:
        raise PromptError(f"'{where}' must be a non-empty list of {{role, content}} objects")
    out = [_message(f"{where}[{i}]", m) for i, m in enumerate(messages)]
    names = {c["id"]: c["name"] for m in out for c in m.get("tool_calls", ())}
    for m in out:  # templates name a result's function (those that know no tools say it in words)
        if m["role"] == "tool" and "name" not in m and m["tool_call_id"] in names:
            m["name"] = names[m["tool_call_id"]]
    return out


def _message(where, m) -> dict:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise PromptError(f"{where} must be an object with a 'role' in {', '.join(ROLES)}")
    role = "system" if m["role"] == "developer" else m["role"]
    if m.get("content") is None and role != "assistant":  # an assistant's turn may be only calls
        raise PromptError(f"{where}: a {m['role']} message needs its 'content'")
    out = {"role": role, "content": _content(m.get("content"), where)}
    reasoning = next((k for k in REASONING_KEYS if m.get(k) is not None), None) if role == "assistant" else None
    if reasoning is not None:
        if not isinstance(m[reasoning], str):
            raise PromptError(f"{where}.{reasoning} must be a string")
        out["reasoning"] = m[reasoning]
    if role == "assistant" and m.get("tool_calls") is not None:
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            raise PromptError(f"{where}.tool_calls must be a list")
        out["tool_calls"] = [_past_call(f"{where}.tool_calls[{k}]", c) for k, c in enumerate(calls)]
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise PromptError(f"{where}: a tool message needs its 'tool_call_id' string")
        out["tool_call_id"] = m["tool_call_id"]
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def _content(content, where) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise PromptError(f"{where}.content: only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    if not isinstance(content, str):
        raise PromptError(f"{where}.content must be a string or a list of text parts")
    return content


def _past_call(where, call) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise PromptError(f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}")
    return {"id": call.get("id") if isinstance(call.get("id"), str) else "call_" + uuid.uuid4().hex[:24],
            "name": function["name"], "arguments": arguments_object(function.get("arguments", "{}"), where)}


def template_kwargs(chat_template_kwargs=None, enable_thinking=None, reasoning_effort=None) -> dict:
    """What goes to the chat template beside the conversation: chat_template_kwargs, with
    enable_thinking and reasoning_effort (REASONING_EFFORTS) where it names neither."""
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise PromptError(f"chat_template_kwargs must be a dict (an object), got {chat_template_kwargs!r}",
                          "chat_template_kwargs")
    if enable_thinking is not None and not isinstance(enable_thinking, bool):
        raise PromptError(f"enable_thinking must be a bool, got {enable_thinking!r}", "enable_thinking")
    if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
        raise PromptError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {reasoning_effort!r}",
                          "reasoning_effort")
    kwargs = dict(chat_template_kwargs or {})
    if reasoning_effort == "none" and enable_thinking is None:
        enable_thinking = False
    for name, value in (("enable_thinking", enable_thinking),
                        ("reasoning_effort", REASONING_EFFORTS.get(reasoning_effort))):
        if value is not None:
            kwargs.setdefault(name, value)
    return kwargs


def tool_functions(tools) -> list:
    """OpenAI's tools ([{"type": "function", "function": {"name", "description", "parameters"}}]) ->
    the functions a chat template renders: each as given (its keys in their order, as transformers
    renders it), parameters added where it has none; PromptError for the first malformed one."""
    if not isinstance(tools, list) or not tools:
        raise PromptError("'tools' must be a non-empty list of {'type': 'function', 'function': {...}}")
    functions = [_function(k, t) for k, t in enumerate(tools)]
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise PromptError("'tools': function names must be unique")
    return functions


def _function(k, tool) -> dict:
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise PromptError(f"tools[{k}] must be {{'type': 'function', 'function': {{'name': str, ...}}}}")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise PromptError(f"tools[{k}].function.parameters must be a JSON schema object")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise PromptError(f"tools[{k}].function.description must be a string")
    return dict(function, parameters=parameters)


def arguments_object(text, where) -> dict:
    """A call's arguments (JSON text, as OpenAI sends them) -> the object, or PromptError."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError as e:
        raise PromptError(f"{where}: arguments are not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise PromptError(f"{where}: arguments must be a JSON object")
    return value
