"""Qwen2.5, Qwen3 and Hermes: each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
anywhere in the answer, content around it."""
import json

from .base import ToolParser, call_from, calls_schema, lark_json, register_tool_parser, split_held

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@register_tool_parser
class HermesToolParser(ToolParser):
    name = "hermes"
    markers = (OPEN,)

    def __init__(self):
        self.held, self.inside = "", False

    def feed(self, text):
        content, calls = [], []
        self.held += text
        while True:
            if self.inside:
                end = self.held.find(CLOSE)
                if end < 0:
                    return "".join(content), calls
                body, self.held, self.inside = self.held[:end], self.held[end + len(CLOSE):], False
                call = _call(body)
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
            self.held, self.inside = self.held[start + len(OPEN):], True

    def finish(self):
        held, self.held = self.held, ""
        if not self.inside:
            return held, []
        call = _call(held)  # an answer that ended before </tool_call> (a stop word, eos)
        return ("", [call]) if call is not None else (OPEN + held, [])

    @classmethod
    def grammar(cls, functions, parallel):
        more = ' ("\\n" call)*' if parallel else ""
        return f'start: call{more}\ncall: "{OPEN}\\n" {lark_json(calls_schema(functions))} "\\n{CLOSE}"\n'

    @classmethod
    def text_of(cls, calls):
        return "\n".join(f"{OPEN}\n{json.dumps(c, ensure_ascii=False)}\n{CLOSE}" for c in calls)


def _call(body):
    try:
        return call_from(json.loads(body), ("arguments",))
    except ValueError:
        return None
