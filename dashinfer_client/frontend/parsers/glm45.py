"""GLM-4.5, GLM-4.6 and GLM-4.7 (zai-org): each call is the function's name after <tool_call>, then
each argument as a key and a value in tags,

    <tool_call>NAME
    <arg_key>ARG</arg_key>
    <arg_value>VALUE</arg_value>
    ...
    </tool_call>

anywhere in the answer, content before it; GLM-4.7 writes the same without the newlines. The
template writes a string value as it is and any other as JSON, so a value is the raw text between
its tags (nothing stripped), read by its parameter's JSON-schema type (typed_values: a string, or a
parameter the schema does not name, stays text; other types parsed). The name ends at the line's
end or the next tag, and the text is a call only where an <arg_key> or </tool_call> follows it
(else it is content as written). A value ends at </arg_value>, or where the next <arg_key> or
</tool_call> begins; a key with no <arg_value> after it is left out. The arguments stream as
typed_values says: `{` with the name, a text value as it comes, any other value at its end, `}` at
</tool_call>.

The tags are added tokens of GLM's tokenizer: they are decoded (`special_tokens`) even where a
tokenizer marks them special, as vLLM's GLM parsers decode them."""
import json
import re

from ...lark_text import lark_text
from .base import first_of, register_tool_parser, split_held_any
from .typed_values import TypedValuesToolParser, function_rules, written

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_END = "<arg_key>", "</arg_key>"
VALUE, VALUE_END = "<arg_value>", "</arg_value>"
VALUE_ENDS = (VALUE_END, KEY, CLOSE)
NOT_NAME = re.compile(r'[\s<>{}\[\]"]')  # what no function name holds: JSON or another format after the tag


@register_tool_parser
class Glm45ToolParser(TypedValuesToolParser):
    name = "glm45"
    aliases = ("glm47",)
    markers = (KEY,)  # its template holds <tool_call> too: chosen before hermes
    special_tokens = (OPEN, CLOSE, KEY, KEY_END, VALUE, VALUE_END)
    head_states = ("name", "head")  # -> params <-> key -> pair -> value
    value_ends = VALUE_ENDS

    def _content(self, content, calls):
        return self._open(content, OPEN, "name")

    def _name(self, content, calls):
        found = first_of(self.held, ("\n", "<"))
        name = self.held[:found[0] if found else len(self.held)].strip()
        if found is None and not NOT_NAME.search(name):
            return False
        if found is None or not name or NOT_NAME.search(name):
            return self._not_a_call(content)
        self.opened += self.held[:found[0]]
        self.function, self.held, self.state = name, self.held[found[0]:], "head"
        return True

    def _head(self, content, calls):
        """After the name: a call where its first argument or its end follows."""
        rest = self.held.lstrip()
        if rest.startswith(KEY) or rest.startswith(CLOSE):
            self._begin(self.function)
            self.held, self.state = rest, "params"
            return True
        if KEY.startswith(rest) or CLOSE.startswith(rest):
            return False
        return self._not_a_call(content)

    def _params(self, content, calls):
        found = first_of(self.held, (KEY, CLOSE))
        if found is None:  # whitespace between the tags (anything else there is no part of a call)
            self.held = split_held_any(self.held, (KEY, CLOSE))[1]
            return False
        at, tag = found
        self.held = self.held[at + len(tag):]
        if tag == CLOSE:
            self._end(calls)
            self.state = "content"
        else:
            self.state = "key"
        return True

    def _key(self, content, calls):
        at = self.held.find(KEY_END)
        if at < 0:
            return False
        self.key, self.held, self.state = self.held[:at].strip(), self.held[at + len(KEY_END):], "pair"
        return True

    def _pair(self, content, calls):
        """Between a key and its value."""
        rest = self.held.lstrip()
        if rest.startswith(VALUE):
            self._open_value(self.key)
            self.held, self.state = rest[len(VALUE):], "value"
            return True
        if VALUE.startswith(rest):
            return False
        self.state = "params"  # a key without a value: left out
        return True

    @classmethod
    def grammar(cls, functions, parallel, added):
        """Each parameter in its schema's order, the required ones always, a newline before each tag
        or not (GLM-4.5's spacing or GLM-4.7's, as the model was trained); values as qwen3_coder's
        grammar writes them: text within the schema's enum or length, any other value as JSON."""
        tag, line = (lambda t: lark_text(t, added)), '"\\n"?'
        rules = ["start: call" + (f" ({line} call)*" if parallel else ""), f"call: {tag(OPEN)} fn {line} {tag(CLOSE)}"]
        rules += function_rules(functions, lambda name: json.dumps(name, ensure_ascii=False),
                                lambda key: f"{line} {tag(KEY)} {json.dumps(key, ensure_ascii=False)} {tag(KEY_END)} "
                                            f"{line} {tag(VALUE)}", VALUE_END, VALUE_ENDS, added)
        return "\n".join(rules) + "\n"

    @classmethod
    def text_of(cls, calls):
        """GLM-4.5's spacing."""
        return "\n".join(f"{OPEN}{c['name']}\n" + "".join(
            f"{KEY}{k}{KEY_END}\n{VALUE}{written(v)}{VALUE_END}\n" for k, v in c["arguments"].items()) + CLOSE
            for c in calls)
