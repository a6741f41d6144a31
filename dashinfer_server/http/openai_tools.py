"""OpenAI chat messages, tools and tool_choice -> the front end's normalized messages and the
request's tool settings (dashinfer_client/frontend/prompts.py says the normalized form)."""
import uuid
from dataclasses import dataclass

from dashinfer_client.frontend.prompts import PromptError, arguments_object, tool_functions

from .errors import bad_request

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class ToolSettings:
    """functions: the offered functions ({"name", "description", "parameters"}), None for none;
    forced: None (the model decides), "required" (at least one call) or a function's name;
    parallel: several calls allowed in one answer."""
    functions: list = None
    forced: str = None
    parallel: bool = True


def chat_messages(messages) -> list:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects", "messages")
    return [_message(i, m) for i, m in enumerate(messages)]


def _message(i, m) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise bad_request(f"{where} must be an object with a 'role' in {', '.join(ROLES)}", "messages")
    role = "system" if m["role"] == "developer" else m["role"]
    out = {"role": role, "content": _content(m.get("content"), where)}
    if role == "assistant" and m.get("tool_calls") is not None:
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            raise bad_request(f"{where}.tool_calls must be a list", "messages")
        out["tool_calls"] = [_past_call(f"{where}.tool_calls[{k}]", c) for k, c in enumerate(calls)]
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise bad_request(f"{where}: a tool message needs its 'tool_call_id' string", "messages")
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
                raise bad_request(f"{where}.content: only text parts are supported", "messages")
            texts.append(part["text"])
        return "".join(texts)
    if not isinstance(content, str):
        raise bad_request(f"{where}.content must be a string or a list of text parts", "messages")
    return content


def _past_call(where, call) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_request(f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}",
                          "messages")
    try:
        arguments = arguments_object(function.get("arguments", "{}"), where)
    except PromptError as e:
        raise bad_request(str(e), "messages") from None
    return {"id": call.get("id") if isinstance(call.get("id"), str) else "call_" + uuid.uuid4().hex[:24],
            "name": function["name"], "arguments": arguments}


def name_tool_results(messages) -> list:
    """Tool results name the function of the call they answer (templates that know no tools say it)."""
    names = {c["id"]: c["name"] for m in messages for c in m.get("tool_calls", ())}
    for m in messages:
        if m["role"] == "tool" and "name" not in m and m["tool_call_id"] in names:
            m["name"] = names[m["tool_call_id"]]
    return messages


def tool_settings(body) -> ToolSettings:
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return ToolSettings()
    try:
        functions = tool_functions(tools)
    except PromptError as e:
        raise bad_request(str(e), "tools") from None
    names = [f["name"] for f in functions]
    forced = _forced(choice, names)
    if forced == "none":
        return ToolSettings()
    return ToolSettings(functions if not forced or forced == "required" else
                        [f for f in functions if f["name"] == forced], forced, parallel is not False)


def _forced(choice, names):
    """None (auto), "none", "required" or a function's name."""
    if choice in (None, "auto"):
        return None
    if choice in ("none", "required"):
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and \
        choice.get("type") == "function" and isinstance(choice.get("function"), dict) else None
    if not isinstance(name, str):
        raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                          "{'type': 'function', 'function': {'name': ...}}", "tool_choice")
    if name not in names:
        raise bad_request(f"'tool_choice' names {name!r}, which is not among 'tools' ({', '.join(names)})",
                          "tool_choice")
    return name
