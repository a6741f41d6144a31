"""gpt-oss's harmony format: the answer is messages, each a header and a body,

    <|channel|>analysis<|message|>...<|end|>                       reasoning
    <|start|>assistant<|channel|>final<|message|>...<|return|>     the answer
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
                                                                   a call of NAME (the recipient may
                                                                   also stand after the role)

The prompt ends at `<|start|>assistant`, so the first header begins at the role's end: with the
recipient there, the answer begins ` to=functions.NAME<|channel|>commentary ...`.

The markers are special tokens, so these parsers read the text with them kept (`special_tokens`;
the tokenizer's other special tokens stay skipped). The reasoning parser takes the analysis messages out and passes every other
message on as written; the tool parser, which runs on every answer of a harmony template (`always`:
it is what takes the markers out of the content), makes a message to `functions.NAME` a call,
its body the arguments as they stream, and any other body content. Text outside any header (a
model that writes no markers) is content.
"""
import json
import re

from ...lark_text import lark_text
from .base import ToolCall, ToolCallPart, ToolParser, first_of, lark_json, register_reasoning_parser, \
    register_tool_parser, split_held_any

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
CLOSERS = (END, CALL, RETURN)
OPENERS = (START, CHANNEL)
STRAY = (MESSAGE, CONSTRAIN)
MARKERS = CLOSERS + OPENERS + STRAY  # the special tokens these parsers read
FUNCTIONS = "functions."
RECIPIENT = re.compile(r"to=([^\s<]+)")
ROLE_RECIPIENT = "to="  # how the first header goes on after the prompt's role, when it names a recipient
CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")


class Messages:
    """Harmony text as it comes -> events (kind, raw text, channel, recipient):
        "open"    a header is complete (channel, recipient: None where it names none)
        "text"    more of the open message's body
        "close"   its end marker ("" where the answer ended, or a header began, without one)
        "rest"    a header the answer ended inside of (finish only)"""

    def __init__(self):
        self.held, self.state = "", "start"  # -> "between" -> "header" -> "body" -> "between"

    def feed(self, text: str) -> list:
        self.held += text
        events = []
        while True:
            if self.state == "start":  # the prompt's <|start|>assistant opened the first header
                head = self.held.lstrip()
                if not head or ROLE_RECIPIENT.startswith(head):
                    return events  # maybe a recipient in its role section: not told apart yet
                self.state = "header" if head.startswith(ROLE_RECIPIENT) else "between"
            if self.state == "between":
                head = self.held.lstrip()
                if not head or any(m.startswith(head) for m in OPENERS):
                    return events  # maybe a header: not told apart yet
                if head.startswith(OPENERS):
                    self.state = "header"
                else:  # text outside any header: a message of no channel
                    events.append(("open", "", None, None))
                    self.state = "body"
            if self.state == "header":
                at = self.held.find(MESSAGE)
                if at < 0:
                    return events
                channel, recipient = CHANNEL_NAME.search(self.held[:at]), RECIPIENT.search(self.held[:at])
                end = at + len(MESSAGE)
                events.append(("open", self.held[:end], channel and channel.group(1), recipient and recipient.group(1)))
                self.held, self.state = self.held[end:], "body"
            found = first_of(self.held, MARKERS)
            if found is None:
                out, self.held = split_held_any(self.held, MARKERS)
                if out:
                    events.append(("text", out, None, None))
                return events
            at, marker = found
            if at:
                events.append(("text", self.held[:at], None, None))
            if marker in STRAY:  # a header's marker inside a body says nothing: dropped
                self.held = self.held[at + len(marker):]
                continue
            closed = marker in CLOSERS  # else a new header began without an end marker
            events.append(("close", marker if closed else "", None, None))
            self.held, self.state = self.held[at + len(marker) if closed else at:], "between"

    def finish(self) -> list:
        held, self.held = self.held, ""
        if self.state == "start" and held.strip():  # text that might have begun a recipient, and ended
            return [("open", "", None, None), ("text", held, None, None), ("close", "", None, None)]
        if self.state == "body":
            return ([("text", held, None, None)] if held else []) + [("close", "", None, None)]
        return [("rest", held, None, None)] if held else []


@register_reasoning_parser
class HarmonyReasoningParser:
    """The analysis channel is the reasoning; every other message passes on as written."""
    name = "harmony"
    aliases = ("openai_gptoss",)  # vLLM's name
    markers = (CHANNEL,)
    special_tokens = boundary_tokens = MARKERS
    closer = None  # a prompt never opens a message
    # A constrained (JSON) answer's bounds, as vLLM constrains the final channel alone: an optional
    # analysis message, then the final channel's header; the markers go to the grammar as tokens
    answer_bounds = {"reasoning_start": CHANNEL + "analysis" + MESSAGE, "reasoning_end": END + START + "assistant",
                     "answer_start": CHANNEL + "final" + MESSAGE}

    def __init__(self, inside=False):  # inside: harmony's prompt ends at the role, never in a message
        self.messages, self.analysis = Messages(), False

    def feed(self, text):
        """-> (reasoning, the rest as written) of this piece."""
        return self._split(self.messages.feed(text))

    def finish(self):
        return self._split(self.messages.finish())

    def _split(self, events):
        reasoning, rest = [], []
        for kind, raw, channel, recipient in events:
            if kind == "open":
                self.analysis = channel == "analysis" and recipient is None
            if kind == "text" and self.analysis:
                reasoning.append(raw)
            elif kind == "rest" or not self.analysis:
                rest.append(raw)
        return "".join(reasoning), "".join(rest)


@register_tool_parser
class HarmonyToolParser(ToolParser):
    name = "harmony"
    aliases = ("openai",)  # vLLM's name
    markers = (CHANNEL,)
    special_tokens = MARKERS
    always = True
    reasoning_or_content = True  # as llama.cpp's gpt-oss prompt drops such a turn's content

    def __init__(self):
        self.messages, self.call, self.parts = Messages(), None, []

    def feed(self, text):
        return self._read(self.messages.feed(text))

    def finish(self):
        return self._read(self.messages.finish())

    def take_parts(self):
        parts, self.parts = self.parts, []
        return parts

    def _read(self, events):
        content, calls = [], []
        for kind, raw, _, recipient in events:
            if kind == "open":
                recipient = recipient or ""
                self.call = ToolCall(recipient[len(FUNCTIONS):], "") if recipient.startswith(FUNCTIONS) else None
                if self.call is not None:
                    self.parts.append(ToolCallPart(self.call.id, self.call.name))
            elif kind == "text" and self.call is not None:
                self.call.arguments += raw
                self.parts.append(ToolCallPart(self.call.id, arguments=raw))
            elif kind == "text":
                content.append(raw)
            elif kind == "close" and self.call is not None:
                calls.append(self.call)
                self.call = None
        return "".join(content), calls

    @classmethod
    def grammar(cls, functions, parallel, added):
        """One call (its <|call|> ends the turn, so harmony has no parallel calls)."""
        channel, constrain, message, call = (lark_text(m, added) for m in (CHANNEL, CONSTRAIN, MESSAGE, CALL))
        rules = [f"call_{k}: {channel} {json.dumps('commentary to=' + FUNCTIONS + f['name'] + ' ')} {constrain} "
                 f"\"json\" {message} {lark_json(f.get('parameters') or {'type': 'object'})} {call}"
                 for k, f in enumerate(functions)]
        return "start: " + " | ".join(f"call_{k}" for k in range(len(functions))) + "\n" + "\n".join(rules) + "\n"

    @classmethod
    def text_of(cls, calls):
        return "".join(f"{START}assistant{CHANNEL}commentary to={FUNCTIONS}{c['name']} {CONSTRAIN}json{MESSAGE}"
                       f"{json.dumps(c['arguments'], ensure_ascii=False)}{CALL}" for c in calls)
