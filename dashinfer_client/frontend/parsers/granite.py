"""Granite 3.x: `<|tool_call|>` then a JSON list of {"name", "arguments"}, Mistral's shape under
another marker. <|tool_call|> is a special token of Granite's tokenizer, which the decoder skips: a
list alone is read as calls too. Granite's template renders the tools (an `available_tools` turn)
but not past calls: it writes a turn's content only, as IBM's granite-io does. Granite 3.3 thinks as
`<think>...</think><response>...</response>` (the `granite` reasoning parser)."""
from .base import register_reasoning_parser, register_tool_parser
from .mistral import MistralToolParser
from .think import WrappedAnswerReasoningParser

RESPONSE, RESPONSE_END = "<response>", "</response>"


@register_tool_parser
class GraniteToolParser(MistralToolParser):
    name = "granite"
    markers = ("<|tool_call|>",)
    prefix = "<|tool_call|>"



@register_reasoning_parser
class GraniteReasoningParser(WrappedAnswerReasoningParser):
    """Granite 3.3 thinking (its template's `thinking` system prompt asks for `<think>...</think>
    <response>...</response>`): the reasoning as `think` reads it, the content without its
    <response> wrapper, as IBM's granite-io reads it; an answer without the wrapper is content as
    written."""
    name = "granite"
    markers = (RESPONSE + RESPONSE_END,)  # the thinking prompt's words, "between <response></response>"
    closer = None  # a constrained answer gets no reasoning first: thinking, the answer is in <response>
    answer_tags = (RESPONSE, RESPONSE_END)
