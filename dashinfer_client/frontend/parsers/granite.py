"""Granite 3.x: `<|tool_call|>` then a JSON list of {"name", "arguments"}, Mistral's shape under
another marker. <|tool_call|> is a special token of Granite's tokenizer, which the decoder skips: a
list alone is read as calls too. Granite's template renders the tools (an `available_tools` turn)
but not past calls: it writes a turn's content only, as IBM's granite-io does. Granite 3.3 thinks as
`<think>...</think><response>...</response>` (the `granite` reasoning parser)."""
from .base import register_reasoning_parser, register_tool_parser, split_held
from .mistral import MistralToolParser
from .think import ThinkReasoningParser

RESPONSE, RESPONSE_END = "<response>", "</response>"


@register_tool_parser
class GraniteToolParser(MistralToolParser):
    name = "granite"
    markers = ("<|tool_call|>",)
    prefix = "<|tool_call|>"



@register_reasoning_parser
class GraniteReasoningParser(ThinkReasoningParser):
    """Granite 3.3 thinking (its template's `thinking` system prompt asks for `<think>...</think>
    <response>...</response>`): the reasoning as `think` reads it, the content without its
    <response> wrapper, as IBM's granite-io reads it; an answer without the wrapper is content as
    written."""
    name = "granite"
    markers = (RESPONSE + RESPONSE_END,)  # the thinking prompt's words, "between <response></response>"
    closer = None  # a constrained answer gets no reasoning first: thinking, the answer is in <response>

    def __init__(self, inside=False):
        super().__init__(inside)
        self.wrapper, self.content = "start", ""  # wrapper -> "open" (its tag taken) -> "done"

    def feed(self, text):
        reasoning, content = super().feed(text)
        return reasoning, self._unwrapped(content, False)

    def finish(self):
        reasoning, content = super().finish()
        return reasoning, self._unwrapped(content, True)

    def _unwrapped(self, content, final) -> str:
        self.content += content
        if self.wrapper == "start":
            if not final and RESPONSE.startswith(self.content):
                return ""  # maybe the opening tag: not told apart yet
            self.wrapper = "open" if self.content.startswith(RESPONSE) else "done"
            if self.wrapper == "open":
                self.content = self.content[len(RESPONSE):]
        if self.wrapper == "open":
            end = self.content.find(RESPONSE_END)
            if end >= 0:
                self.content, self.wrapper = self.content[:end] + self.content[end + len(RESPONSE_END):], "done"
            elif not final:
                out, self.content = split_held(self.content, RESPONSE_END)
                return out
        out, self.content = self.content, ""
        return out
