"""MiniMax-M2 and M2.1 (MiniMaxM2ForCausalLM): calls are XML in a <minimax:tool_call> block, one
<invoke> per call, each argument in a <parameter> tag,

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="ARG">VALUE</parameter>
    ...
    </invoke>
    <invoke name="OTHER">...</invoke>
    </minimax:tool_call>

anywhere in the answer, content before it; a block may hold several invokes and an answer several
blocks. The template writes a string value as it is and any other as JSON, with no newline around
it, so a value is the raw text between its tags, nothing stripped, read by its parameter's JSON-schema
type (typed_values: a string, or a parameter the schema does not name, stays text; other types
parsed). vLLM's minimax_m2 parser strips the whitespace around every value; that would change a
string the template wrote exactly (a file's last newline), while around any other value the
whitespace is JSON's and is read away anyway, so nothing is stripped here.

A name or key is the attribute's text up to `>`, less its quotes. The block is a call only where an
<invoke name= with a name follows its opening tag (else it is content as written). A value ends at
</parameter>, or where the next <parameter name=, </invoke> or </minimax:tool_call> begins; an invoke
at </invoke>, or where the next invoke or the block's end begins. Text between the tags is no part
of a call. The arguments stream as typed_values says: `{` with the name, a text value as it comes,
any other value at its end, `}` at </invoke>.

The block's tags are added tokens of MiniMax's tokenizer: they are decoded (`special_tokens`) even
where a tokenizer marks them special."""
import json
import re

from ...lark_text import lark_text
from .base import first_of, register_tool_parser, split_held_any
from .typed_values import TypedValuesToolParser, function_rules, written

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, INVOKE_END = "<invoke name=", "</invoke>"
PARAMETER, PARAMETER_END = "<parameter name=", "</parameter>"
VALUE_ENDS = (PARAMETER_END, PARAMETER, INVOKE_END, CLOSE)
CALL_ENDS = (PARAMETER, INVOKE_END, INVOKE, CLOSE)  # what may follow a call's name or a value
NOT_NAME = re.compile(r"[\s<>\"']")  # what no function name holds: the tag is something else


def unquoted(text):
    """An attribute's value: the text less the quotes around it (the template writes "...")."""
    text = text.strip()
    return text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "\"'" else text


@register_tool_parser
class MinimaxM2ToolParser(TypedValuesToolParser):
    name = "minimax_m2"
    markers = (OPEN,)
    special_tokens = (OPEN, CLOSE)
    head_states = ("head", "name")  # -> params <-> key -> value; params -> between -> name
    value_ends = VALUE_ENDS  # typed_values' _value: raw text up to </parameter> or the next part's tag

    def _content(self, content, calls):
        return self._open(content, OPEN, "head")

    def _head(self, content, calls):
        """After the block's opening tag: a call where an invoke follows it."""
        return self._expect(content, INVOKE, "name")

    def _name(self, content, calls):
        at = self.held.find(">")
        text = self.held[:at if at >= 0 else len(self.held)]
        if at < 0 and not any(c in text for c in "<\n"):
            return False
        name = unquoted(text)
        if at < 0 or not name or NOT_NAME.search(name):
            return self._not_a_call(content)
        self._begin(name)
        self.held, self.state = self.held[at + 1:], "params"
        return True

    def _params(self, content, calls):
        found = first_of(self.held, CALL_ENDS)
        if found is None:  # whitespace between the tags (anything else there is no part of a call)
            self.held = split_held_any(self.held, CALL_ENDS)[1]
            return False
        at, tag = found
        self.held = self.held[at + len(tag):]
        if tag == PARAMETER:
            self.state = "key"
            return True
        self._end(calls)
        if tag == INVOKE:  # the next invoke without this one's </invoke>
            self.opened, self.state = INVOKE, "name"
        else:
            self.state = "between" if tag == INVOKE_END else "content"
        return True

    def _key(self, content, calls):
        at = self.held.find(">")
        if at < 0:
            return False
        self._open_value(unquoted(self.held[:at]))
        self.held, self.state = self.held[at + 1:], "value"
        return True

    def _between(self, content, calls):
        """After an </invoke>: the block's next invoke, or its end."""
        rest = self.held.lstrip()
        if rest.startswith(INVOKE):
            self.opened = self.held[:len(self.held) - len(rest)] + INVOKE
            self.held, self.state = rest[len(INVOKE):], "name"
            return True
        if rest.startswith(CLOSE):
            self.held, self.state = rest[len(CLOSE):], "content"
            return True
        if INVOKE.startswith(rest) or CLOSE.startswith(rest):
            return False
        self.state = "content"  # the block left unclosed: what follows is content
        return True

    @classmethod
    def grammar(cls, functions, parallel, added):
        """One block, its invokes one a line (several where parallel), spaced as the template writes
        them; each parameter in its schema's order, the required ones always; values as qwen3_coder's
        grammar writes them: text within the schema's enum or length, any other value as JSON."""
        call = ' ("\\n" call)*' if parallel else ""
        rules = [f'start: {lark_text(OPEN, added)} "\\n" call{call} "\\n" {lark_text(CLOSE, added)}',
                 f'call: fn "\\n{INVOKE_END}"']
        rules += function_rules(functions, lambda name: json.dumps(f'{INVOKE}"{name}">', ensure_ascii=False),
                                lambda key: json.dumps(f'\n{PARAMETER}"{key}">', ensure_ascii=False),
                                PARAMETER_END, VALUE_ENDS, added)
        return "\n".join(rules) + "\n"

    @classmethod
    def text_of(cls, calls):
        """The calls in one block, as the template writes them."""
        return f"{OPEN}\n" + "".join(f'{INVOKE}"{c["name"]}">\n' + "".join(
            f'{PARAMETER}"{k}">{written(v)}{PARAMETER_END}\n' for k, v in c["arguments"].items())
            + f"{INVOKE_END}\n" for c in calls) + CLOSE
