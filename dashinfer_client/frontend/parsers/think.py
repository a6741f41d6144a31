"""Reasoning between `<think>` and `</think>` at the start of the answer (Qwen3, QwQ,
DeepSeek-R1 distills, MiniMax-M2; Seed-OSS's `<seed:think>`). A template that opens the tag in the prompt (the
answer starts inside it) is told by `inside`; an answer that never closes it is all reasoning."""
from .base import register_reasoning_parser, split_held

OPEN, CLOSE = "<think>", "</think>"


@register_reasoning_parser
class ThinkReasoningParser:
    name = "think"
    aliases = ("qwen3", "deepseek_r1", "glm45", "ernie45", "minimax_m2")  # vLLM's names of the same format
    markers = (OPEN,)
    opener, closer = OPEN, CLOSE  # what opens and ends a reasoning (a constrained answer's bounds)
    answer_bounds = None  # the bounds depend on the prompt (Prompts.reasoning_bounds)
    special_tokens = ()
    tags = boundary_tokens = (OPEN, CLOSE)  # what it reads; not counted as reasoning where each is a token

    def __init__(self, inside=False):
        self.state = "inside" if inside else "start"  # -> "inside" -> "after_close" -> "content"
        self.held = ""

    def feed(self, text):
        """-> (reasoning, content) of this piece."""
        self.held += text
        reasoning = ""
        if self.state == "start":
            head = self.held.lstrip()
            if head.startswith(self.tags[0]):
                self.state, self.held = "inside", head[len(self.tags[0]):]
            elif self.tags[0].startswith(head):
                return "", ""  # maybe the tag: not told apart yet
            else:
                self.state = "content"
        if self.state == "inside":
            close = self.tags[1]
            end = self.held.find(close)
            if end < 0:
                reasoning, self.held = split_held(self.held, close)
                return reasoning, ""
            reasoning, self.held, self.state = self.held[:end], self.held[end + len(close):], "after_close"
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


@register_reasoning_parser
class SeedThinkReasoningParser(ThinkReasoningParser):
    """Seed-OSS: the same, between <seed:think> and </seed:think> (its thinking budget's reflections,
    <seed:cot_budget_reflect>, are reasoning text)."""
    name = "seed_oss"
    markers = ("<seed:think>",)
    opener, closer = "<seed:think>", "</seed:think>"
    tags = boundary_tokens = (opener, closer)
