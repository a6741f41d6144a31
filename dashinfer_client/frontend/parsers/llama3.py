"""Llama 3.1 and later (JSON tool calling): the answer is `{"name": ..., "parameters": {...}}`,
after the `<|python_tag|>` token when the model writes one (a special token: skipped by the
decoder)."""
import json

from .base import JsonToolParser, calls_schema, lark_json, register_tool_parser


@register_tool_parser
class Llama3JsonToolParser(JsonToolParser):
    name = "llama3_json"
    markers = ("<|python_tag|>", "Given the following functions")
    prefix = "<|python_tag|>"
    openers = ("{",)

    @classmethod
    def grammar(cls, functions, parallel, added):
        more = ' ("; " call)*' if parallel else ""
        return f"start: call{more}\ncall: {lark_json(calls_schema(functions, arguments_key='parameters'))}\n"

    @classmethod
    def text_of(cls, calls):
        return "; ".join(json.dumps({"name": c["name"], "parameters": c["arguments"]}, ensure_ascii=False)
                         for c in calls)
