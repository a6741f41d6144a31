"""Qwen2.5, Qwen3 and Hermes: each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
anywhere in the answer, content around it. A call's arguments stream as the model writes them
(ArgumentsStream): the joined pieces are the call's arguments, as written, also where the answer
ends inside the call (max_tokens) or the call turns out malformed."""
import json

from ...lark_text import lark_text
from .base import (ArgumentsStream, ToolCallPart, ToolParser, call_from, calls_schema, lark_json,
                   register_tool_parser, split_held)

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@register_tool_parser
class HermesToolParser(ToolParser):
    name = "hermes"
    markers = (OPEN,)

    def __init__(self):
        self.held, self.inside = "", False
        self.stream, self.parts = None, []  # the open call's ArgumentsStream; parts not yet taken

    def feed(self, text):
        content, calls = [], []
        self.held += text
        while True:
            if self.inside:
                end = self.held.find(CLOSE)
                if end < 0:
                    self.parts += self.stream.feed(self.held)
                    return "".join(content), calls
                body, self.held, self.inside = self.held[:end], self.held[end + len(CLOSE):], False
                call = self._close(body)
                if call is None:  # not a call after all: keep the text as the model wrote it
                    content.append(OPEN + body + CLOSE)
                else:
                    calls.append(call)
                continue
            start = self.held.find(OPEN)
            if start < 0:
                out, self.held = split_held(self.held, OPEN)
                content.append(out)
                return "".join(content), calls
            content.append(self.held[:start])
            self.held, self.inside, self.stream = self.held[start + len(OPEN):], True, ArgumentsStream()

    def finish(self):
        held, self.held = self.held, ""
        if not self.inside:
            return held, []
        call = self._close(held)  # an answer that ended before </tool_call> (a stop word, eos, max_tokens)
        return ("", [call]) if call is not None else (OPEN + held, [])

    def take_parts(self):
        parts, self.parts = self.parts, []
        return parts

    def _close(self, body):
        """The call `body` holds, its arguments as streamed; one that was not streamed (written in
        another key order) is read whole and handed out in one part."""
        self.parts += self.stream.feed(body)
        if self.stream.call is not None:
            return self.stream.result(body)
        call = _call(body)
        if call is not None:
            self.parts.append(ToolCallPart(call.id, call.name, call.arguments))
        return call

    @classmethod
    def grammar(cls, functions, parallel, added):
        more = ' ("\\n" call)*' if parallel else ""
        return (f'start: call{more}\ncall: {lark_text(OPEN, added)} "\\n" {lark_json(calls_schema(functions))} "\\n" '
                f'{lark_text(CLOSE, added)}\n')

    @classmethod
    def text_of(cls, calls):
        return "\n".join(f"{OPEN}\n{json.dumps(c, ensure_ascii=False)}\n{CLOSE}" for c in calls)


def _call(body):
    try:
        return call_from(json.loads(body), ("arguments",))
    except ValueError:
        return None
