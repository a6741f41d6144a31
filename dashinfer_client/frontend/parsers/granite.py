"""Granite 3.x: `<|tool_call|>` then a JSON list of {"name", "arguments"}, Mistral's shape under
another marker. <|tool_call|> is a special token of Granite's tokenizer, which the decoder skips: a
list alone is read as calls too. Granite's template renders the tools (an `available_tools` turn)
but not past calls: it writes a turn's content only, as IBM's granite-io does."""
from .base import register_tool_parser
from .mistral import MistralToolParser


@register_tool_parser
class GraniteToolParser(MistralToolParser):
    name = "granite"
    markers = ("<|tool_call|>",)
    prefix = "<|tool_call|>"

