"""Mistral: `[TOOL_CALLS]` then a JSON list of {"name", "arguments"}. [TOOL_CALLS] is a special
token of Mistral's tokenizers, which the decoder skips: a list alone is read as calls too."""
import json

from ...lark_text import lark_text
from .base import JsonToolParser, calls_schema, lark_json, register_tool_parser

MARKER = "[TOOL_CALLS]"


@register_tool_parser
class MistralToolParser(JsonToolParser):
    name = "mistral"
    markers = (MARKER,)
    prefix = MARKER
    openers = ("[",)

    @classmethod
    def grammar(cls, functions, parallel, added):
        """The marker (the special token where the tokenizer has it), then the list."""
        schema = calls_schema(functions, parallel=True)
        if not parallel:
            schema["maxItems"] = 1
        return f"start: {lark_text(cls.prefix, added)} {lark_json(schema)}\n"

    @classmethod
    def text_of(cls, calls):
        return cls.prefix + json.dumps(calls, ensure_ascii=False)
