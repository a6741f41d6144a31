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
on each side, read by its parameter's JSON-schema type (typed_values: a string stays text, other
types parsed). A value ends at </parameter>, or where the next <parameter= or </function> begins.
A call without the <tool_call> wrapper is read too. The arguments stream as typed_values says:
`{` with the name, a text value as it comes, any other value at its end, `}` at </function>."""
import json

from ...lark_text import lark_text
from .base import first_of, register_tool_parser, split_held_any
from .typed_values import TypedValuesToolParser, function_rules, written

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
VALUE_ENDS = (PARAMETER_END, PARAMETER, FUNCTION_END)


@register_tool_parser
class Qwen3CoderToolParser(TypedValuesToolParser):
    name = "qwen3_coder"
    markers = (FUNCTION, PARAMETER)  # its template holds <tool_call> too: chosen before hermes
    wrapper = (OPEN, CLOSE)  # what a call stands in (Seed-OSS's are its own)
    head_states = ("wrapper", "name")  # -> params <-> key -> value -> after

    def _content(self, content, calls):
        found = first_of(self.held, (self.wrapper[0], FUNCTION))
        if found is None:
            out, self.held = split_held_any(self.held, (self.wrapper[0], FUNCTION))
            content.append(out)
            return False
        at, marker = found
        content.append(self.held[:at])
        self.opened, self.held = marker, self.held[at + len(marker):]
        self.state = "wrapper" if marker == self.wrapper[0] else "name"
        return True

    def _wrapper(self, content, calls):
        return self._expect(content, FUNCTION, "name")

    def _name(self, content, calls):
        at = self.held.find(">")
        name = self.held[:at if at >= 0 else len(self.held)]
        if at < 0 and not any(c in name for c in "<\n"):
            return False
        if at < 0 or not name.strip() or any(c in name for c in "<\n"):
            return self._not_a_call(content)
        self._begin(name.strip())
        self.held, self.state = self.held[at + 1:], "params"
        return True

    def _params(self, content, calls):
        ends = (PARAMETER, FUNCTION_END, self.wrapper[1])
        found = first_of(self.held, ends)
        if found is None:  # whitespace between the tags (anything else there is no part of a call)
            self.held = split_held_any(self.held, ends)[1]
            return False
        at, marker = found
        self.held = self.held[at + len(marker):]
        if marker == PARAMETER:
            self.state = "key"
            return True
        self._end(calls)
        self.state = "after" if marker == FUNCTION_END else "content"
        return True

    def _key(self, content, calls):
        at = self.held.find(">")
        if at < 0:
            return False
        key, self.held = self.held[:at], self.held[at + 1:]
        self._open_value(key)
        self.value, self.state = None, "value"  # None: its leading newline not yet passed
        return True

    def _value(self, content, calls):
        if self.value is None:
            if not self.held:
                return False
            self.held, self.value = self.held.removeprefix("\n"), ""
        found = first_of(self.held, VALUE_ENDS)
        if found is None:
            out, self.held = split_held_any(self.held, VALUE_ENDS)
            if out.endswith("\n"):  # maybe the newline before the closing tag: held until told
                out, self.held = out[:-1], "\n" + self.held
            self._add_value(out)
            return False
        at, marker = found
        self._add_value(self.held[:at].removesuffix("\n"))
        self.held = self.held[at + len(marker):] if marker == PARAMETER_END else self.held[at:]
        self._close_value()
        self.state = "params"
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

    @classmethod
    def grammar(cls, functions, parallel, added):
        """Each parameter in its schema's order, the required ones always; a text value within the
        schema's enum or length (its pattern or format is not enforced), any other value as JSON of
        its schema."""
        more = ' ("\\n" call)*' if parallel else ""
        rules = [f"start: call{more}", f'call: {lark_text(cls.wrapper[0], added)} "\\n" fn "{FUNCTION_END}" "\\n" '
                                       f'{lark_text(cls.wrapper[1], added)}']
        rules += function_rules(functions, lambda name: json.dumps(f"{FUNCTION}{name}>\n", ensure_ascii=False),
                                lambda key: json.dumps(f"{PARAMETER}{key}>\n", ensure_ascii=False),
                                f"\n{PARAMETER_END}\n", VALUE_ENDS, added)
        return "\n".join(rules) + "\n"

    @classmethod
    def text_of(cls, calls):
        return "\n".join(f"{cls.wrapper[0]}\n{FUNCTION}{c['name']}>\n" + "".join(
            f"{PARAMETER}{k}>\n{written(v)}\n{PARAMETER_END}\n" for k, v in c["arguments"].items())
            + f"{FUNCTION_END}\n{cls.wrapper[1]}" for c in calls)


@register_tool_parser
class SeedOssToolParser(Qwen3CoderToolParser):
    """Seed-OSS: Qwen3-Coder's calls, each within <seed:tool_call> ... </seed:tool_call>."""
    name = "seed_oss"
    markers = ("<seed:tool_call>",)
    wrapper = ("<seed:tool_call>", "</seed:tool_call>")
