"""What the formats that write each argument as raw text in tags share (qwen3_coder's
<parameter=ARG>VALUE</parameter>, glm45's <arg_key>ARG</arg_key><arg_value>VALUE</arg_value>,
minimax_m2's <parameter name="ARG">VALUE</parameter>): a
value read by its parameter's JSON-schema type as vLLM's qwen3_coder parser reads it, the
arguments streamed as a JSON object while the values come, and the forced-call grammar of each
function's values.

A value is read by its type: a string (or a parameter the schema does not name, of a tool the request
does not offer) stays text; integer, number, boolean, object, array and null are parsed (JSON, else
a Python literal: Qwen3-Coder's template writes True and False), and a value that does not read as
its type stays text, as does one holding NaN or an infinity, which JSON cannot write.

The arguments are the JSON object of the values, json.dumps' spacing: `{` with the name, each text
value's characters as they come (escaped), any other value whole at its end, `}` at the call's end;
the pieces join into the call's arguments, also where the answer ends inside the call (max_tokens:
the object unfinished)."""
import ast
import json

from ...lark_text import added_pieces, lark_text
from .base import ToolCall, ToolCallPart, ToolParser, first_of, lark_json, split_held, split_held_any

TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict,
         "array": list, "null": type(None)}


class TypedValuesToolParser(ToolParser):
    """A state machine over the answer's text: subclasses write each state `s` as a step
    `_s(content, calls)`, True when it moved on, False when it waits for more text; the answer
    starts in "content". head_states: the states in which the call's opening tag and name are still
    text (`opened`), content where the answer ends there. value_ends: a raw value's closing tag, then
    the tags that begin the call's next part (a value missing its closing tag ends where they begin)."""
    head_states = ()
    value_ends = ()

    def __init__(self, functions=()):
        self.properties = {f["name"]: (f.get("parameters") or {}).get("properties") or {} for f in functions}
        self.held, self.state = "", "content"
        self.opened = ""        # the text of a call whose name is not out yet: content if it goes no further
        self.call, self.parts = None, []
        self.schema, self.value, self.count = None, "", 0  # the open value's schema (None: text), its raw text

    @classmethod
    def for_functions(cls, functions):
        return cls(functions)

    def _open(self, content, tag, then):
        """Content up to `tag`, which opens a call (held back while the text may begin it): the
        state after it is `then`."""
        at = self.held.find(tag)
        if at < 0:
            out, self.held = split_held(self.held, tag)
            content.append(out)
            return False
        content.append(self.held[:at])
        self.opened, self.held, self.state = tag, self.held[at + len(tag):], then
        return True

    def _expect(self, content, tag, then):
        """`tag` after any whitespace (the state after it `then`); where it cannot come, the call's
        text so far is content as written."""
        rest = self.held.lstrip()
        if rest.startswith(tag):
            self.opened += self.held[:len(self.held) - len(rest) + len(tag)]
            self.held, self.state = rest[len(tag):], then
            return True
        if tag.startswith(rest):
            return False
        return self._not_a_call(content)

    def _not_a_call(self, content):
        """What the tag opened is no call: its text so far is content as written (state "content")."""
        content.append(self.opened)
        self.state = "content"
        return True

    def feed(self, text):
        self.held += text
        content, calls = [], []
        while getattr(self, "_" + self.state)(content, calls):
            pass
        return "".join(content), calls

    def finish(self):
        held, self.held = self.held, ""
        if self.call is not None:  # the answer ended inside the call: it is what streamed
            call, self.call = self.call, None
            return "", [call]
        if self.state in self.head_states:
            return self.opened + held, []
        return held, []

    def take_parts(self):
        parts, self.parts = self.parts, []
        return parts

    def _begin(self, name):
        """The call is one: its name goes out, with the arguments' opening brace."""
        self.call, self.count = ToolCall(name, "{"), 0
        self.parts.append(ToolCallPart(self.call.id, self.call.name, "{"))

    def _open_value(self, key):
        schema = self.properties.get(self.call.name, {}).get(key)
        self.schema = None if schema is None or is_text(schema) else schema
        self._send((", " if self.count else "") + json.dumps(key, ensure_ascii=False) + ": "
                   + ('"' if self.schema is None else ""))
        self.value = ""

    def _add_value(self, text):
        """More of the open value: a text one streams (escaped), any other is read whole at its end."""
        if self.schema is None:
            self._send(json.dumps(text, ensure_ascii=False)[1:-1])
        else:
            self.value += text

    def _close_value(self):
        self._send('"' if self.schema is None else json.dumps(read_value(self.value, self.schema), ensure_ascii=False))
        self.count += 1

    def _value(self, content, calls):
        """A value's raw text, nothing stripped, streamed as it comes: up to its closing tag (passed) or the
        next part's tag (left for the "params" state, which reads the next part)."""
        found = first_of(self.held, self.value_ends)
        if found is None:
            out, self.held = split_held_any(self.held, self.value_ends)
            self._add_value(out)
            return False
        at, tag = found
        self._add_value(self.held[:at])
        self.held = self.held[at + len(tag):] if tag == self.value_ends[0] else self.held[at:]
        self._close_value()
        self.state = "params"
        return True

    def _end(self, calls):
        self._send("}")
        calls.append(self.call)
        self.call = None

    def _send(self, piece):
        if piece:
            self.call.arguments += piece
            self.parts.append(ToolCallPart(self.call.id, arguments=piece))


def written(value) -> str:
    """A value as these templates write it: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _types(schema) -> set:
    """The JSON types a schema allows (its type, a list of them, its anyOf / oneOf, its enum's values)."""
    if not isinstance(schema, dict):
        return set()
    declared = schema.get("type")
    types = set(declared) if isinstance(declared, list) else {declared} if isinstance(declared, str) else set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            types |= _types(sub)
    values = schema.get("enum") or ([schema["const"]] if "const" in schema else [])
    if not types:
        types = {t for v in values for t, kind in TYPES.items() if _is(v, t)}
    return types


def is_text(schema) -> bool:
    types = _types(schema)
    return not types or types <= {"string"}


def _is(value, type_name) -> bool:
    if type_name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, TYPES.get(type_name, ()))


def read_value(text, schema):
    """A value's text as its schema's type (not text): JSON, else a Python literal, else the text.
    A value holding NaN or an infinity (1e999) stays text: the arguments must be JSON, which has none."""
    types = _types(schema)
    for reading in (json.loads, ast.literal_eval):
        try:
            value = reading(text)
            json.dumps(value, allow_nan=False)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if value is None or any(_is(value, t) for t in types):
            return value
    return text


def function_rules(functions, opening, head, close, ends, added) -> list:
    """The lark rules of the call of any of `functions` (rule `fn`): opening(name) (lark items), then
    each parameter in its schema's order, the required ones always: head(key) (lark items), its value,
    `close` (text)."""
    rules = ["fn: " + " | ".join(f"fn_{k}" for k in range(len(functions)))]
    for k, function in enumerate(functions):
        parameters = function.get("parameters") or {}
        required = set(parameters.get("required") or ())
        steps = []
        for j, (key, schema) in enumerate((parameters.get("properties") or {}).items()):
            rules += _value_rules(f"p_{k}_{j}", head(key), close, ends, schema, parameters, added)
            steps.append(f"p_{k}_{j}" + ("" if key in required else "?"))
        rules.append(f"fn_{k}: {opening(function['name'])} {' '.join(steps)}")
    return rules


def _value_rules(rule, head, close, ends, schema, parameters, added) -> list:
    """One parameter's rules, its tags included: JSON of the schema (its root's $defs kept), or text
    within the schema's enum / length that holds none of `ends`. Where `close` begins with an added
    token the text ends at that token (which no text can hold); else lazily, at the first `close`."""
    closer = lark_text(close, added)
    if not is_text(schema):
        defs = {k: parameters[k] for k in ("$defs", "definitions") if k in parameters}
        return [f"{rule}: {head} {lark_json(dict(schema, **defs))} {closer}"]
    values = schema.get("enum") or ([schema["const"]] if "const" in schema else None)
    if values:
        return [f"{rule}: {head} (" + " | ".join(json.dumps(v, ensure_ascii=False) for v in values) + f") {closer}"]
    lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
    text, tags = f"(?s:.{{{lo},{'' if hi is None else int(hi)}}})", "|".join(_regex(t) for t in ends)
    if added_pieces(close, added)[0] in added:  # a greedy lexeme (upper case: llguidance's & takes lexemes only)
        return [f"{rule}: {head} {rule.upper()}_TEXT {closer}",
                f"{rule.upper()}_TEXT: /{text}/ & ~/(?s:.*)({tags})(?s:.*)/"]
    return [f"{rule}: {head} {rule}_text",
            f"{rule}_text[lazy]: /{text}{_regex(close)}/ & ~/(?s:.*)({tags})(?s:.*){_regex(close)}/"]


def _regex(literal) -> str:
    """A tag as lark writes it inside /.../ (newlines as \\n)."""
    return literal.replace("/", "\\/").replace("\n", "\\n")
