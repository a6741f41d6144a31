"""Reasoning between `<think>` and `</think>` at the start of the answer (Qwen3, QwQ,
DeepSeek-R1 distills, MiniMax-M2; Seed-OSS's `<seed:think>`; Hunyuan's, whose answer then sits in
`<answer>...</answer>`). A template that opens the tag in the prompt (the
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


class WrappedAnswerReasoningParser(ThinkReasoningParser):
    """The reasoning as `think` reads it, then the answer inside a wrapper (answer_tags: its opening
    and closing tags), the tags no part of the content; an answer without the wrapper is content as
    written. Granite 3.3's <response> (granite.py) and Hunyuan's <answer> are its two."""
    answer_tags = ("", "")

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
        opener, closer = self.answer_tags
        self.content += content
        if self.wrapper == "start":
            if not final and opener.startswith(self.content):
                return ""  # maybe the opening tag: not told apart yet
            self.wrapper = "open" if self.content.startswith(opener) else "done"
            if self.wrapper == "open":
                self.content = self.content[len(opener):]
        if self.wrapper == "open":
            end = self.content.find(closer)
            if end >= 0:
                self.content, self.wrapper = self.content[:end] + self.content[end + len(closer):], "done"
            elif not final:
                out, self.content = split_held(self.content, closer)
                return out
        out, self.content = self.content, ""
        return out


@register_reasoning_parser
class HunyuanReasoningParser(WrappedAnswerReasoningParser):
    """Hunyuan (A13B, the dense 0.5B-7B): <think>...</think>, then the answer in <answer>...</answer>
    (vLLM's hunyuan_a13b reads it so)."""
    name = "hunyuan"
    aliases = ("hunyuan_a13b",)
    markers = ("<answer>",)
    answer_tags = ("<answer>", "</answer>")
