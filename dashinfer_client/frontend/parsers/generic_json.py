"""For chat templates that know no tools (SmolLM2's): the prompt describes the tools in a system
message, and the answer is a call as JSON, {"name": ..., "arguments": {...}}, or a list of them."""
import json

from .base import JsonToolParser, calls_schema, lark_json, register_tool_parser

INSTRUCTIONS = ("You can call these functions (JSON schemas of their parameters):\n{functions}\n"
                "To call one, answer with only a JSON object {{\"name\": <function name>, \"arguments\": "
                "<its arguments as an object>}}, or a JSON list of such objects for several calls. "
                "Otherwise answer normally.")


@register_tool_parser
class GenericJsonToolParser(JsonToolParser):
    name = "json"
    template_renders_tools = False

    @classmethod
    def grammar(cls, functions, parallel, added):
        return f"start: {lark_json(calls_schema(functions, parallel=parallel))}\n"

    @classmethod
    def text_of(cls, calls):
        return json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)

    @staticmethod
    def describe(functions) -> str:
        """The system prompt that tells the model about `functions`."""
        return INSTRUCTIONS.format(functions="\n".join(json.dumps(_described(f), ensure_ascii=False) for f in functions))


def _described(function) -> dict:
    """A function as the system message lists it: name, parameters, then its description if any."""
    out = {"name": function["name"], "parameters": function["parameters"]}
    if function.get("description"):
        out["description"] = function["description"]
    return out
