"""Qwen3-Coder (and Qwen3.5-style templates): each call is XML, its values raw text,

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

anywhere in the answer, content before it. A value is the text between its tags less one newline
on each side, read by its parameter's JSON-schema type as vLLM's qwen3_coder parser reads it: a
string (or a parameter the schema does not name) stays text; integer, number, boolean, object,
array and null are parsed (JSON, else a Python literal: the template writes True and False), and
a value that does not read as its type stays text. A value ends at </parameter>, or where the next
<parameter= or </function> begins. A call without the <tool_call> wrapper is read too.

The arguments are the JSON object of the values, json.dumps' spacing, streamed as the model writes
them: `{` with the name, each string value's characters as they come (escaped), any other value
whole at its end, `}` at </function>; the pieces join into the call's arguments, also where the
answer ends inside the call (max_tokens: the object unfinished)."""
import ast
import json

from ...lark_text import lark_text
from .base import ToolCall, ToolCallPart, ToolParser, lark_json, register_tool_parser, split_held

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
VALUE_ENDS = (PARAMETER_END, PARAMETER, FUNCTION_END)
TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict,
         "array": list, "null": type(None)}


@register_tool_parser
class Qwen3CoderToolParser(ToolParser):
    name = "qwen3_coder"
    markers = (FUNCTION, PARAMETER)  # its template holds <tool_call> too: chosen before hermes
    wrapper = (OPEN, CLOSE)  # what a call stands in (Seed-OSS's are its own)

    def __init__(self, functions=()):
        self.properties = {f["name"]: (f.get("parameters") or {}).get("properties") or {} for f in functions}
        self.held, self.state = "", "content"  # -> wrapper -> name -> params <-> key -> value -> after
        self.opened = ""        # the text of a call whose name is not out yet: content if it goes no further
        self.call, self.parts = None, []
        self.schema, self.value, self.count = None, "", 0  # the open parameter's schema (None: text), its raw text

    @classmethod
    def for_functions(cls, functions):
        return cls(functions)

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
        if self.state in ("wrapper", "name"):
            return self.opened + held, []
        return held, []

    def take_parts(self):
        parts, self.parts = self.parts, []
        return parts

    # Each state's step: True when it moved on, False when it waits for more text.
    def _content(self, content, calls):
        found = [(i, m) for m in (self.wrapper[0], FUNCTION) for i in (self.held.find(m),) if i >= 0]
        if not found:
            out, self.held = min((split_held(self.held, m) for m in (self.wrapper[0], FUNCTION)),
                                 key=lambda s: len(s[0]))
            content.append(out)
            return False
        at, marker = min(found)
        content.append(self.held[:at])
        self.opened, self.held = marker, self.held[at + len(marker):]
        self.state = "wrapper" if marker == self.wrapper[0] else "name"
        return True

    def _wrapper(self, content, calls):
        rest = self.held.lstrip()
        if rest.startswith(FUNCTION):
            self.opened += self.held[:len(self.held) - len(rest) + len(FUNCTION)]
            self.held, self.state = rest[len(FUNCTION):], "name"
            return True
        if FUNCTION.startswith(rest):
            return False
        content.append(self.opened)  # not a call: the text as written
        self.state = "content"
        return True

    def _name(self, content, calls):
        at = self.held.find(">")
        name = self.held[:at if at >= 0 else len(self.held)]
        if at < 0 and not any(c in name for c in "<\n"):
            return False
        if at < 0 or not name.strip() or any(c in name for c in "<\n"):
            content.append(self.opened)  # not a call: the text as written
            self.state = "content"
            return True
        self.call, self.count = ToolCall(name.strip(), "{"), 0
        self.parts.append(ToolCallPart(self.call.id, self.call.name, "{"))
        self.held, self.state = self.held[at + 1:], "params"
        return True

    def _params(self, content, calls):
        ends = (PARAMETER, FUNCTION_END, self.wrapper[1])
        found = [(i, m) for m in ends for i in (self.held.find(m),) if i >= 0]
        if not found:  # whitespace between the tags (anything else there is no part of a call)
            self.held = min((split_held(self.held, m) for m in ends),
                            key=lambda s: len(s[0]))[1]
            return False
        at, marker = min(found)
        self.held = self.held[at + len(marker):]
        if marker == PARAMETER:
            self.state = "key"
            return True
        self._send("}")
        calls.append(self.call)
        self.call, self.state = None, "after" if marker == FUNCTION_END else "content"
        return True

    def _key(self, content, calls):
        at = self.held.find(">")
        if at < 0:
            return False
        key, self.held = self.held[:at], self.held[at + 1:]
        schema = self.properties.get(self.call.name, {}).get(key)
        self.schema = None if schema is None or _is_text(schema) else schema
        self._send((", " if self.count else "") + json.dumps(key, ensure_ascii=False) + ": "
                   + ('"' if self.schema is None else ""))
        self.value, self.state = None, "value"  # None: its leading newline not yet passed
        return True

    def _value(self, content, calls):
        if self.value is None:
            if not self.held:
                return False
            self.held, self.value = self.held.removeprefix("\n"), ""
        found = [(i, m) for m in VALUE_ENDS for i in (self.held.find(m),) if i >= 0]
        if not found:
            out, self.held = min((split_held(self.held, m) for m in VALUE_ENDS), key=lambda s: len(s[0]))
            if out.endswith("\n"):  # maybe the newline before the closing tag: held until told
                out, self.held = out[:-1], "\n" + self.held
            self._add_value(out)
            return False
        at, marker = min(found)
        self._add_value(self.held[:at].removesuffix("\n"))
        self.held = self.held[at + len(marker):] if marker == PARAMETER_END else self.held[at:]
        self._send('"' if self.schema is None else json.dumps(_read(self.value, self.schema), ensure_ascii=False))
        self.count, self.state = self.count + 1, "params"
        return True

    def _after(self, content, calls):
        rest = self.held.lstrip()
        close = self.wrapper[1]
        if rest.startswith(close):
            self.held, self.state = rest[len(close):], "content"
            return True
        if close.startswith(rest):
            return False
        self.state = "content"
        return True

    def _add_value(self, text):
        """More of the open value: a text one streams (escaped), any other is read whole at its end."""
        if self.schema is None:
            self._send(json.dumps(text, ensure_ascii=False)[1:-1])
        else:
            self.value += text

    def _send(self, piece):
        if piece:
            self.call.arguments += piece
            self.parts.append(ToolCallPart(self.call.id, arguments=piece))

    @classmethod
    def grammar(cls, functions, parallel, added):
        """Each parameter in its schema's order, the required ones always; a text value within the
        schema's enum or length (its pattern or format is not enforced), any other value as JSON of
        its schema."""
        more = ' ("\\n" call)*' if parallel else ""
        rules = [f"start: call{more}",
                 f'call: {lark_text(cls.wrapper[0], added)} "\\n" ('
                 + " | ".join(f"fn_{k}" for k in range(len(functions))) + f') "\\n" {lark_text(cls.wrapper[1], added)}']
        for k, function in enumerate(functions):
            parameters = function.get("parameters") or {}
            required = set(parameters.get("required") or ())
            steps = []
            for j, (key, schema) in enumerate((parameters.get("properties") or {}).items()):
                head = json.dumps(f"{PARAMETER}{key}>\n", ensure_ascii=False)
                rules += _parameter_rules(f"p_{k}_{j}", head, schema, parameters)
                steps.append(f"p_{k}_{j}" + ("" if key in required else "?"))
            opening = json.dumps(f"{FUNCTION}{function['name']}>\n", ensure_ascii=False)
            rules.append(f'fn_{k}: {opening} {" ".join(steps)} "{FUNCTION_END}"')
        return "\n".join(rules) + "\n"

    @classmethod
    def text_of(cls, calls):
        return "\n".join(f"{cls.wrapper[0]}\n{FUNCTION}{c['name']}>\n" + "".join(
            f"{PARAMETER}{k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n{PARAMETER_END}\n"
            for k, v in c["arguments"].items()) + f"{FUNCTION_END}\n{cls.wrapper[1]}" for c in calls)



@register_tool_parser
class SeedOssToolParser(Qwen3CoderToolParser):
    """Seed-OSS: Qwen3-Coder's calls, each within <seed:tool_call> ... </seed:tool_call>."""
    name = "seed_oss"
    markers = ("<seed:tool_call>",)
    wrapper = ("<seed:tool_call>", "</seed:tool_call>")

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


def _is_text(schema) -> bool:
    types = _types(schema)
    return not types or types <= {"string"}


def _is(value, type_name) -> bool:
    if type_name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, TYPES.get(type_name, ()))


def _read(text, schema):
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


def _parameter_rules(rule, head, schema, parameters) -> list:
    """The lark rules of one parameter, its tags included: JSON of the schema (its root's $defs kept),
    or text within the schema's enum / length, ended lazily at the first closing tag."""
    close = json.dumps(f"\n{PARAMETER_END}\n")
    if not _is_text(schema):
        defs = {k: parameters[k] for k in ("$defs", "definitions") if k in parameters}
        return [f"{rule}: {head} {lark_json(dict(schema, **defs))} {close}"]
    values = schema.get("enum") or ([schema["const"]] if "const" in schema else None)
    if values:
        return [f"{rule}: {head} (" + " | ".join(json.dumps(v, ensure_ascii=False) for v in values) + f") {close}"]
    lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
    tags = "|".join(_regex(t) for t in VALUE_ENDS)
    closer = _regex(f"\n{PARAMETER_END}\n")
    return [f"{rule}: {head} {rule}_text",
            f"{rule}_text[lazy]: /(?s:.{{{lo},{'' if hi is None else int(hi)}}}){closer}/ & "
            f"~/(?s:.*)({tags})(?s:.*){closer}/"]


def _regex(literal) -> str:
    """A tag as lark writes it inside /.../ (newlines as \\n)."""
    return literal.replace("/", "\\/").replace("\n", "\\n")
