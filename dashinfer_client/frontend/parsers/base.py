"""What every output parser shares: a tool call, the registries, and the test that holds back a
tag split across tokens.

A parser is fed the answer's text piece by piece as it is decoded (whole characters, stop strings
already cut) and hands back what it can tell apart so far; text that may still turn out to be
the beginning of a tag stays with it until the next piece (or the end) says what it is, so a tag
never leaks into the content.
"""
import json
import math
import re
import uuid
from dataclasses import dataclass, field

# A forced call's JSON is written with json.dumps' separators and no other whitespace: free
# whitespace lets a small model wander (135M: newlines until max_tokens) before the arguments.
CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_BARE = re.compile(r"[0-9A-Za-z.+-]")  # a character of a number or a literal (true, false, null)
TOOL_PARSERS = {}       # name -> ToolParser subclass
REASONING_PARSERS = {}  # name -> reasoning parser class


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def arguments_dict(self) -> dict:
        """The arguments as an object; those of a call cut short (max_tokens) hold what was written whole."""
        value = json_prefix(self.arguments)
        return value if isinstance(value, dict) else {}

    def openai(self) -> dict:
        """As an entry of OpenAI's message.tool_calls."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ToolCallPart:
    """A piece of a tool call as it streams: the first piece of a call carries its id and name,
    later ones (name None) only more of its arguments' text; a call's pieces join into its final
    arguments. index: the call's place in the answer (OutputProcessor numbers them)."""
    id: str
    name: str = None
    arguments: str = ""
    index: int = None


class JsonDepth:
    """A JSON text's nesting, told character by character as the text comes: step(c) is 1 for an
    opening bracket, -1 for a closing one, 0 for anything else (brackets inside strings included)."""

    def __init__(self):
        self.in_string = self.escaped = False

    def step(self, c: str) -> int:
        if self.in_string:
            self.escaped, self.in_string = (False, True) if self.escaped else (c == "\\", c != '"')
            return 0
        if c == '"':
            self.in_string = True
            return 0
        return 1 if c in "{[" else -1 if c in "}]" else 0


class ArgumentsStream:
    """One call written as {"name": "...", "arguments": {...}} (`key`: the arguments' key), read
    while the model writes it: its name once the arguments' first brace is there, then the
    arguments' text as it comes, exactly as written (nothing is held back: the text inside the
    object is the arguments). A call written otherwise (another key first) is not streamed; its
    parser hands it out whole at its end."""
    HEAD = r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:%s)"\s*:\s*(?=\{)'

    def __init__(self, keys=("arguments",)):
        self.head = re.compile(self.HEAD % "|".join(keys))
        self.call = None                # the ToolCall, once its head is read
        self.start = self.end = None    # the arguments' span in the body (end: once they closed)
        self.scanned = self.sent = 0    # body characters scanned / handed out
        self.depth, self.json = 0, JsonDepth()

    def feed(self, body: str) -> list:
        """The ToolCallParts that the call's body so far adds (body: all of it, not the new piece)."""
        parts = []
        if self.call is None:
            head = self.head.match(body)
            if head is None:
                return parts
            self.call = ToolCall(json.loads(head.group(1)), "")
            self.start = self.scanned = self.sent = head.end()
            parts.append(ToolCallPart(self.call.id, self.call.name))
        while self.end is None and self.scanned < len(body):
            self.depth += self.json.step(body[self.scanned])
            self.scanned += 1
            if self.depth == 0:
                self.end = self.scanned
        stop = self.scanned if self.end is None else self.end
        if stop > self.sent:
            piece, self.sent = body[self.sent:stop], stop
            if parts:
                parts[0].arguments = piece
            else:
                parts.append(ToolCallPart(self.call.id, arguments=piece))
        return parts

    def result(self, body: str):
        """At the call's end (body: all of it, as last fed): the ToolCall once its name went out, else
        None. From then on it is a call, streamed or not, so that a stream and the whole answer agree:
        its arguments are the text handed out, all of them once they closed, or what was written when
        the answer was cut short (max_tokens); a malformed rest of the body never went out and is no
        part of it."""
        if self.call is None:
            return None
        self.call.arguments = body[self.start:self.sent]
        return self.call


class CallObjects:
    """The call objects of a text of JSON calls as it grows (one object, objects one after another,
    or a list of them), each read by its own ArgumentsStream: their parts as they come, their
    calls at the end."""

    def __init__(self, keys):
        self.keys = keys
        self.spans = []     # [start, end or None, its ArgumentsStream] of each object begun
        self.level = None   # the depth at which a call object opens: 0, or 1 inside a list
        self.depth, self.scanned, self.json = 0, 0, JsonDepth()

    def feed(self, body: str) -> list:
        """The ToolCallParts the body so far adds (body: all of it)."""
        fed = next((k for k, span in enumerate(self.spans) if span[1] is None), len(self.spans))
        while self.scanned < len(body):
            c, at = body[self.scanned], self.scanned
            self.scanned += 1
            step = self.json.step(c)
            if step == 1 and self.level is None:
                self.level = 1 if c == "[" else 0
            if step == 1 and c == "{" and self.depth == self.level:
                self.spans.append([at, None, ArgumentsStream(self.keys)])
            self.depth += step
            if step == -1 and c == "}" and self.depth == self.level and self.spans:
                self.spans[-1][1] = self.scanned
        parts = []
        for start, end, stream in self.spans[fed:]:
            parts += stream.feed(body[start:end])
        return parts

    def calls(self, body: str, parsed) -> list:
        """The body's calls at the answer's end. parsed: the ToolCalls of its whole parse, in order, or
        None when it did not parse as calls (cut short by max_tokens, or malformed). Each streamed call
        is as streamed (its id, its arguments as written); with a whole parse the others are as
        parsed; without one, the streamed calls alone: what a stream sent is the answer's, and an
        object that had not begun to stream (the start of another call) is dropped."""
        streamed = [stream.result(body[start:end]) for start, end, stream in self.spans]
        if parsed is not None and len(parsed) == len(streamed):
            return [s if s is not None else p for s, p in zip(streamed, parsed)]
        if parsed is not None and not any(streamed):
            return parsed
        return [s for s in streamed if s is not None]


def register_tool_parser(cls):
    for name in (cls.name, *vars(cls).get("aliases", ())):  # a subclass is not known by its base's aliases
        TOOL_PARSERS[name] = cls
    return cls


def register_reasoning_parser(cls):
    for name in (cls.name, *vars(cls).get("aliases", ())):
        REASONING_PARSERS[name] = cls
    return cls


def split_held(text: str, tag: str):
    """(what can be handed out, the end of text that may begin `tag`: held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return text[:-n], text[-n:]
    return text, ""


def first_of(text: str, tags):
    """(where, tag) of the first of `tags` in text; None where none is."""
    found = [(i, t) for t in tags for i in (text.find(t),) if i >= 0]
    return min(found) if found else None


def split_held_any(text: str, tags):
    """split_held over several tags: what no tag may begin, and the longest ending that may."""
    return min((split_held(text, t) for t in tags), key=lambda split: len(split[0]))


def call_from(obj, argument_keys=("arguments", "parameters")):
    """The ToolCall an object {"name": str, "arguments": {...}} stands for, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in argument_keys:
        if isinstance(obj.get(key), dict):
            return ToolCall(obj["name"], json.dumps(obj[key], ensure_ascii=False))
    if not any(key in obj for key in argument_keys):
        return ToolCall(obj["name"], "{}")  # a function without parameters
    return None


def json_prefix(text: str):
    """The JSON value of a text that may be cut short: what was written whole, open containers closed;
    a string, number or literal the cut fell inside is left out, with its key (as the anthropic SDK
    reads a cut stream of input_json_delta, jiter's partial mode). None when nothing of it is JSON.
    NaN and infinities (NaN, Infinity, 1e999), which a JSON answer cannot carry, are null, as
    JavaScript's JSON.stringify writes them."""
    try:
        return _json_finite(text)
    except ValueError:
        pass
    cuts, open_, state = [], [], JsonDepth()  # cuts: (where no token is open, the closers there)
    for at, c in enumerate(text + " "):
        if not state.in_string and not (at and _BARE.match(text[at - 1]) and _BARE.match(c)):
            cuts.append((at, "".join(reversed(open_))))
        if at < len(text):
            step = state.step(c)
            if step == 1:
                open_.append("}" if c == "{" else "]")
            elif step == -1 and open_:
                open_.pop()
    for at, closers in reversed(cuts):
        head = text[:at].rstrip()
        try:
            return _json_finite(head.removesuffix(",") + closers)
        except ValueError:
            continue
    return None


def _json_finite(text: str):
    """json.loads with NaN and infinities read as None."""
    return json.loads(text, parse_constant=lambda _: None,
                      parse_float=lambda number: value if math.isfinite(value := float(number)) else None)


def json_values(text: str):
    """The JSON values text holds one after another (separated by whitespace, ',' or ';'), or None
    when anything else is in it."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n,;":
            i += 1
        if i == len(text):
            return values
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        values.append(value)


def function_schema(function: dict, name_key="name", arguments_key="arguments") -> dict:
    """The JSON schema of one call of `function` ({"name", "parameters"}) in a format's own keys."""
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {name_key: {"const": function["name"]}, arguments_key: parameters},
            "required": [name_key, arguments_key], "additionalProperties": False}


def calls_schema(functions, arguments_key="arguments", parallel=False) -> dict:
    """A call of any of `functions` (a list of them when parallel)."""
    options = [function_schema(f, arguments_key=arguments_key) for f in functions]
    one = options[0] if len(options) == 1 else {"anyOf": options}
    return {"type": "array", "items": one, "minItems": 1} if parallel else one


def lark_json(schema) -> str:
    """A lark rule body: a JSON value of `schema` (llguidance's %json) written as CALL_JSON says."""
    return "%json " + json.dumps(dict(schema, **{"x-guidance": CALL_JSON}), ensure_ascii=False)


class ToolParser:
    """One model family's tool-call format. name: as --tool-call-parser takes it (aliases: other names
    it goes by there); markers: strings whose presence in a chat template says the template speaks
    this format. Subclasses implement feed/finish over their own state, grammar() for tool_choice
    required / a named function, and text_of() to write past calls back into a prompt when the
    template cannot."""
    name = ""
    aliases = ()
    markers = ()
    template_renders_tools = True  # False: the prompt describes the tools (the template cannot)
    special_tokens = ()  # the special tokens the format's markers are: the decoder keeps these for it
    always = False  # True: parses every chat answer, tools offered or not (the format marks up content too)
    # True: the template writes a call turn's reasoning or its content as the call's analysis and refuses
    # both (gpt-oss's); where both come back (a commentary preamble as content), the reasoning is kept
    reasoning_or_content = False

    @classmethod
    def for_functions(cls, functions):
        """A fresh parser of an answer to a request offering `functions` ({"name", "parameters"}); a
        format that reads values by their schema (qwen3_coder's) keeps them."""
        return cls()

    def feed(self, text: str):
        """-> (content, [ToolCall]) of this piece."""
        raise NotImplementedError

    def finish(self):
        """-> (content, [ToolCall]) of what was held back at the end of the answer."""
        raise NotImplementedError

    def take_parts(self) -> list:
        """The ToolCallParts of calls streamed since the last take (a format that streams its calls'
        arguments); the output side streams any other call whole, in one part."""
        return []

    @classmethod
    def grammar(cls, functions, parallel: bool, added: dict) -> str:
        """A lark grammar (llguidance) of an answer that is only calls of `functions`; added: the
        tokenizer's added tokens, text -> id (its markers are written as these, lark_text)."""
        raise NotImplementedError

    @classmethod
    def text_of(cls, calls) -> str:
        """An answer made of these calls ([{"name", "arguments": dict}]) as this format writes it."""
        raise NotImplementedError


class JsonToolParser(ToolParser):
    """Formats whose answer is either calls as JSON, from its first character (after `prefix`), or
    plain content: an answer that begins like one is held as calls, each call's arguments streamed
    as the model writes them (CallObjects), and parsed whole at its end; one that does not flows
    through unchanged. An answer that began like calls but does not parse as calls (cut short by
    max_tokens, or malformed) is the calls that streamed, or content when none did."""
    prefix = ""              # a marker before the JSON ("" for none)
    openers = ("{", "[")     # the JSON's first character
    argument_keys = ("arguments", "parameters")

    def __init__(self):
        self.head, self.mode = "", "deciding"  # -> "calls" (holding the whole answer) or "content"
        self.body_at = 0  # where the JSON begins in head
        self.objects, self.parts = CallObjects(self.argument_keys), []

    def feed(self, text):
        if self.mode == "content":
            return text, []
        self.head += text
        if self.mode == "deciding":
            body = self.head.lstrip()
            if self.prefix and body.startswith(self.prefix):
                body = body[len(self.prefix):].lstrip()
            elif self.prefix and self.prefix.startswith(body):
                return "", []  # maybe the marker: not told apart yet
            if not body:
                return "", []
            if body[0] not in self.openers:
                self.mode, text, self.head = "content", self.head, ""
                return text, []
            self.mode, self.body_at = "calls", len(self.head) - len(body)
        self.parts += self.objects.feed(self.head[self.body_at:])
        return "", []

    def finish(self):
        text, self.head = self.head, ""
        if self.mode != "calls":
            return text, []
        body = text[self.body_at:]
        values = json_values(body)
        if values and len(values) == 1 and isinstance(values[0], list):
            values = values[0]
        parsed = [call_from(v, self.argument_keys) for v in values or ()]
        calls = self.objects.calls(body, parsed if parsed and None not in parsed else None)
        return ("", calls) if calls else (text, [])  # no call, none streamed: the answer is content

    def take_parts(self):
        parts, self.parts = self.parts, []
        return parts
