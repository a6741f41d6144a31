"""What every output parser shares: a tool call, the registries, and the test that holds back a
tag split across tokens.

A parser is fed the answer's text piece by piece as it is decoded (whole characters, stop strings
already cut) and hands back what it can tell apart so far; text that may still turn out to be
the beginning of a tag stays with it until the next piece (or the end) says what it is, so a tag
never leaks into the content.
"""
import json
import re
import uuid
from dataclasses import dataclass, field

# A forced call's JSON is written with json.dumps' separators and no other whitespace: free
# whitespace lets a small model wander (135M: newlines until max_tokens) before the arguments.
CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TOOL_PARSERS = {}       # name -> ToolParser subclass
REASONING_PARSERS = {}  # name -> reasoning parser class


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def arguments_dict(self) -> dict:
        return json.loads(self.arguments)

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


class ArgumentsStream:
    """One call written as {"name": "...", "arguments": {...}}, read while the model writes it:
    its name once the arguments' first brace is there, then the arguments' text as it comes, exactly
    as written (nothing is held back: the text inside the object is the arguments). A call written
    otherwise (another key first) is not streamed; its parser hands it out whole at its end."""
    HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')

    def __init__(self):
        self.call = None                # the ToolCall, once its head is read
        self.start = self.end = None    # the arguments' span in the body (end: once they closed)
        self.scanned = self.sent = 0    # body characters scanned / handed out
        self.depth, self.in_string, self.escaped = 0, False, False

    def feed(self, body: str) -> list:
        """The ToolCallParts that the call's body so far adds (body: all of it, not the new piece)."""
        parts = []
        if self.call is None:
            head = self.HEAD.match(body)
            if head is None:
                return parts
            self.call = ToolCall(json.loads(head.group(1)), "")
            self.start = self.scanned = self.sent = head.end()
            parts.append(ToolCallPart(self.call.id, self.call.name))
        while self.end is None and self.scanned < len(body):
            c = body[self.scanned]
            self.scanned += 1
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (c == "\\", c != '"')
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                self.end = self.scanned if self.depth == 0 else None
        stop = self.scanned if self.end is None else self.end
        if stop > self.sent:
            piece, self.sent = body[self.sent:stop], stop
            if parts:
                parts[0].arguments = piece
            else:
                parts.append(ToolCallPart(self.call.id, arguments=piece))
        return parts

    def result(self, body: str):
        """At the call's end (body: all of it): the ToolCall, its arguments as streamed, when the body
        is that call and the arguments a JSON object; else None."""
        if self.end is None:
            return None
        try:
            whole, arguments = json.loads(body), json.loads(body[self.start:self.end])
        except ValueError:
            return None
        if not isinstance(whole, dict) or whole.get("name") != self.call.name or not isinstance(arguments, dict):
            return None
        self.call.arguments = body[self.start:self.end]
        return self.call


def register_tool_parser(cls):
    TOOL_PARSERS[cls.name] = cls
    return cls


def register_reasoning_parser(cls):
    REASONING_PARSERS[cls.name] = cls
    return cls


def split_held(text: str, tag: str):
    """(what can be handed out, the end of text that may begin `tag`: held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return text[:-n], text[-n:]
    return text, ""


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
    """One model family's tool-call format. name: as --tool-call-parser takes it; markers: strings
    whose presence in a chat template says the template speaks this format. Subclasses implement
    feed/finish over their own state, grammar() for tool_choice required / a named function, and
    text_of() to write past calls back into a prompt when the template cannot."""
    name = ""
    markers = ()
    template_renders_tools = True  # False: the prompt describes the tools (the template cannot)

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
    def grammar(cls, functions, parallel: bool) -> str:
        """A lark grammar (llguidance) of an answer that is only calls of `functions`."""
        raise NotImplementedError

    @classmethod
    def text_of(cls, calls) -> str:
        """An answer made of these calls ([{"name", "arguments": dict}]) as this format writes it."""
        raise NotImplementedError


class WholeJsonToolParser(ToolParser):
    """Formats whose answer is either calls as JSON, from its first character (after `prefix`), or
    plain content: an answer that begins like one is held until its end, then parsed; one that does
    not flows through unchanged."""
    prefix = ""              # a marker before the JSON ("" for none)
    openers = ("{", "[")     # the JSON's first character
    argument_keys = ("arguments", "parameters")

    def __init__(self):
        self.head, self.mode = "", "deciding"  # -> "calls" (holding the whole answer) or "content"

    def feed(self, text):
        if self.mode == "content":
            return text, []
        if self.mode == "calls":
            self.head += text
            return "", []
        self.head += text
        body = self.head.lstrip()
        if self.prefix and body.startswith(self.prefix):
            body = body[len(self.prefix):].lstrip()
        elif self.prefix and self.prefix.startswith(body):
            return "", []  # maybe the marker: not told apart yet
        if not body:
            return "", []
        if body[0] in self.openers:
            self.mode = "calls"
            return "", []
        self.mode, text, self.head = "content", self.head, ""
        return text, []

    def finish(self):
        text, self.head = self.head, ""
        if self.mode == "content" or not text:
            return text, []
        body = text.lstrip()
        if self.prefix and body.startswith(self.prefix):
            body = body[len(self.prefix):]
        values = json_values(body)
        if values and len(values) == 1 and isinstance(values[0], list):
            values = values[0]
        calls = [call_from(v, self.argument_keys) for v in values or ()]
        if not calls or None in calls:
            return text, []  # not calls after all: the answer is content
        return "", calls
