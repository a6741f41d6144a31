"""OpenAI chat messages, tools and tool_choice -> the front end's normalized messages and the
request's tool settings (dashinfer_client/frontend/messages.py reads them; here its refusals
become 400s)."""
from dataclasses import dataclass

from dashinfer_client.frontend.messages import PromptError, tool_functions
from dashinfer_client.frontend.messages import chat_messages as frontend_messages

from .errors import bad_request


@dataclass
class ToolSettings:
    """functions: the offered functions ({"name", "description", "parameters"}), None for none;
    forced: None (the model decides), "required" (at least one call) or a function's name;
    parallel: several calls allowed in one answer."""
    functions: list = None
    forced: str = None
    parallel: bool = True


def chat_messages(messages) -> list:
    """The conversation, normalized (dashinfer_client/frontend/messages.py); a 400 for a malformed one."""
    try:
        return frontend_messages(messages)
    except PromptError as e:
        raise bad_request(str(e), "messages") from None


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
