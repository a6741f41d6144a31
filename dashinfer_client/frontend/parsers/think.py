"""Reasoning between `<think>` and `</think>` at the start of the answer (Qwen3, QwQ,
DeepSeek-R1 distills). A template that opens the tag in the prompt (the answer starts inside it)
is told by `inside`; an answer that never closes it is all reasoning."""
from .base import register_reasoning_parser, split_held

OPEN, CLOSE = "<think>", "</think>"


@register_reasoning_parser
class ThinkReasoningParser:
    name = "think"
    markers = (OPEN,)
    opener, closer = OPEN, CLOSE  # what opens and ends a reasoning (a constrained answer's bounds)
    answer_bounds = None  # the bounds depend on the prompt (Prompts.reasoning_bounds)
    special_tokens = ()
    boundary_tokens = (OPEN, CLOSE)  # not counted as reasoning where each is a token

    def __init__(self, inside=False):
        self.state = "inside" if inside else "start"  # -> "inside" -> "after_close" -> "content"
        self.held = ""

    def feed(self, text):
        """-> (reasoning, content) of this piece."""
        self.held += text
        reasoning = ""
        if self.state == "start":
            head = self.held.lstrip()
            if head.startswith(OPEN):
                self.state, self.held = "inside", head[len(OPEN):]
            elif OPEN.startswith(head):
                return "", ""  # maybe the tag: not told apart yet
            else:
                self.state = "content"
        if self.state == "inside":
            end = self.held.find(CLOSE)
            if end < 0:
                reasoning, self.held = split_held(self.held, CLOSE)
                return reasoning, ""
            reasoning, self.held, self.state = self.held[:end], self.held[end + len(CLOSE):], "after_close"
        if self.state == "after_close":  # the blank lines between the reasoning and the answer
            self.held = self.held.lstrip()
            if not self.held:
                return reasoning, ""
            self.state = "content"
        content, self.held = self.held, ""
        return reasoning, content

    def finish(self):
        held, self.held = self.held, ""
        return (held, "") if self.state == "inside" else ("", held if self.state != "after_close" else "")
