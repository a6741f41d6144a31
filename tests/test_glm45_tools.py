"""GLM-4.5 / 4.6 / 4.7's tool calls (parsers/glm45.py): `<tool_call>NAME`, then `<arg_key>ARG</arg_key>
<arg_value>VALUE</arg_value>` per argument, on lines of their own in 4.5 and 4.6, run together in 4.7.
The answers below are written by hand as GLM's template writes a call (a string value as it is, any
other as JSON); the references are those values read back by their parameter's schema type (a
string stays text even where it looks like a number, nothing of it stripped), json.dumps of them for
the arguments' text, transformers' apply_chat_template for the prompts, llguidance and jsonschema
for the grammars of forced calls."""
import json

import pytest

from dashinfer_client.frontend import OutputProcessor, Prompts
from dashinfer_client.frontend.parsers import REASONING_PARSERS, TOOL_PARSERS
from dashinfer_client.tokenizer import Tokenizer, added_tokens
from tests.chat_templates import GLM45, GLM45_ADDED, GLM45_SPECIAL
from tests.helpers import build_tiny_tokenizer
from tests.output_helpers import (FUNCTIONS, RUN, assert_cut_anywhere_streams_its_calls,
                                  assert_forced_answers_meet_the_schema, assert_read_split_everywhere, elements,
                                  grammar_accepts, run_parser)

CODE = '  def f(x):\n    return x < 3 and "q" \\ {}\n\n'  # spaces and newlines of its own at both ends

# (answer, expected content, expected calls as (name, arguments))
ANSWERS = [
    # GLM-4.5's spacing, content before the call, a value of each type
    ("I will write it.\n<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>007</arg_value>\n"
     f"<arg_key>content</arg_key>\n<arg_value>{CODE}</arg_value>\n<arg_key>mode</arg_key>\n<arg_value>644</arg_value>\n"
     "<arg_key>force</arg_key>\n<arg_value>true</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"a\", \"b\"]"
     "</arg_value>\n<arg_key>meta</arg_key>\n<arg_value>{\"n\": 1}</arg_value>\n<arg_key>level</arg_key>\n"
     "<arg_value>high</arg_value>\n<arg_key>ratio</arg_key>\n<arg_value>null</arg_value>\n</tool_call>",
     "I will write it.\n", [("write_file", {"path": "007", "content": CODE, "mode": 644, "force": True,
                                             "tags": ["a", "b"], "meta": {"n": 1}, "level": "high", "ratio": None})]),
    # GLM-4.7's: no newlines; two calls; a value that does not read as its type stays text, as does a
    # parameter the schema does not name
    ("<tool_call>run<arg_key>cmd</arg_key><arg_value>ls -l</arg_value></tool_call><tool_call>write_file"
     "<arg_key>path</arg_key><arg_value>12</arg_value><arg_key>mode</arg_key><arg_value>rw</arg_value>"
     "<arg_key>ratio</arg_key><arg_value>0.5</arg_value><arg_key>extra</arg_key><arg_value>42</arg_value></tool_call>",
     "", [("run", {"cmd": "ls -l"}), ("write_file", {"path": "12", "mode": "rw", "ratio": 0.5, "extra": "42"})]),
    # a tool the request did not offer (its values text), a call without arguments, content after them
    ("<tool_call>search\n<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n</tool_call>\n<tool_call>run\n"
     "</tool_call>\nDone.", "\n\nDone.", [("search", {"limit": "5"}), ("run", {})]),
    # text that only mentions the tag, JSON (another family's call) after it, a name no tag follows: content
    ('Use <tool_call> tags, as <tool_call>{"name": "run"}</tool_call> or <tool_call>run\nwould.',
     'Use <tool_call> tags, as <tool_call>{"name": "run"}</tool_call> or <tool_call>run\nwould.', []),
    # a value ended by the next tag, its </arg_value> left out; a key with no value after it is no argument
    ("<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>a.py\n<arg_key>skip</arg_key>\n"
     "<arg_key>mode</arg_key>\n<arg_value>7</arg_value>\n</tool_call>", "",
     [("write_file", {"path": "a.py\n", "mode": 7})]),
    # numbers JSON has no spelling for stay text: the arguments are JSON
    ("<tool_call>write_file<arg_key>ratio</arg_key><arg_value>NaN</arg_value><arg_key>tags</arg_key>"
     "<arg_value>[1e999]</arg_value></tool_call>", "", [("write_file", {"ratio": "NaN", "tags": "[1e999]"})]),
]


@pytest.mark.parametrize("answer, content, calls", ANSWERS)
def test_glm_calls_read_whole_and_split_everywhere(answer, content, calls):
    assert_read_split_everywhere(TOOL_PARSERS["glm45"], FUNCTIONS, answer, content, calls)


def test_glm47_is_the_same_parser():
    assert TOOL_PARSERS["glm47"] is TOOL_PARSERS["glm45"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer(build_tiny_tokenizer(str(tmp_path_factory.mktemp("tok"))))


@pytest.fixture(scope="module")
def glm_tokenizer(tmp_path_factory):
    """GLM's roles as special tokens and its call tags as added ones, under its template."""
    return Tokenizer(build_tiny_tokenizer(str(tmp_path_factory.mktemp("glm-tok")), GLM45, GLM45_SPECIAL, GLM45_ADDED))


def test_an_answer_cut_anywhere_streams_the_calls_it_answers(tokenizer):
    assert_cut_anywhere_streams_its_calls(tokenizer, lambda: TOOL_PARSERS["glm45"].for_functions(FUNCTIONS),
                                          ANSWERS[1][0])


@pytest.mark.parametrize("special", [False, True])
def test_reasoning_then_a_call_token_by_token(tmp_path, glm_tokenizer, special):
    """GLM answers <think>...</think>, then its call: the think parser takes the reasoning, the call is
    read from the tags' tokens, also where a tokenizer marks them special (they are decoded for the
    parser; its other special tokens, <|observation|> here, are still skipped)."""
    tok = Tokenizer(build_tiny_tokenizer(str(tmp_path), GLM45, GLM45_SPECIAL + GLM45_ADDED)) if special else glm_tokenizer
    answer = "<think>Look first.</think>\n<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>"
    ids = tok(answer + "<|observation|>", add_special_tokens=False)["input_ids"]
    assert (tok.convert_tokens_to_ids("<arg_key>") in ids) and tok.convert_tokens_to_ids("<|observation|>") == ids[-1]
    out = OutputProcessor(tok, reasoning=REASONING_PARSERS["think"](), tools=TOOL_PARSERS["glm45"].for_functions([RUN]))
    deltas = [out.push(elements([i])) for i in ids] + [out.finish("length")]
    assert "".join(d.reasoning for d in deltas) == "Look first." and "".join(d.text for d in deltas) == ""
    [call] = [c for d in deltas for c in d.tool_calls]
    assert (call.name, call.arguments) == ("run", '{"cmd": "ls"}')
    assert "".join(p.arguments for d in deltas for p in d.tool_call_parts) == call.arguments


def test_prompts_are_transformers_ids_and_the_templates_calls_read_back(tmp_path):
    """The template picks glm45 (its <arg_key>, though it holds hermes' <tool_call> too) and think; the
    prompts are transformers' ids; a call as the template writes it (GLM-4.5's lines, and run
    together as GLM-4.7 writes it) reads back as the arguments given, each of its type."""
    from transformers import AutoTokenizer
    path = build_tiny_tokenizer(str(tmp_path), GLM45, GLM45_SPECIAL, GLM45_ADDED)
    prompts, reference = Prompts(Tokenizer(path)), AutoTokenizer.from_pretrained(path)
    assert (prompts.tool_format.name, prompts.reasoning_format.name) == ("glm45", "think")
    arguments = {"path": "420", "content": "x = 1\n", "mode": 420, "force": True, "tags": ["a"], "meta": {"n": 2}}
    ask = [{"role": "user", "content": "Write a.py"}]
    turn = {"role": "assistant", "content": "", "reasoning": "Write it.",
            "tool_calls": [{"id": "c1", "name": "write_file", "arguments": arguments}]}
    result = {"role": "tool", "tool_call_id": "c1", "name": "write_file", "content": "written"}
    hf_turn = {"role": "assistant", "content": "", "reasoning_content": "Write it.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": arguments}}]}
    tools = [{"type": "function", "function": f} for f in FUNCTIONS]
    for mine, theirs in [(ask, ask), (ask + [turn, result], ask + [hf_turn, result])]:
        expected = reference.apply_chat_template(theirs, tools=tools, tokenize=False, add_generation_prompt=True)
        assert prompts.chat_ids(mine, FUNCTIONS) == reference(expected, add_special_tokens=False)["input_ids"]
    text = prompts.chat_text(ask + [turn, result], FUNCTIONS)
    assert ("<think>Write it.</think>\n<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>420</arg_value>\n"
            "<arg_key>content</arg_key>\n<arg_value>x = 1\n</arg_value>\n<arg_key>mode</arg_key>\n<arg_value>420"
            "</arg_value>\n<arg_key>force</arg_key>\n<arg_value>true</arg_value>\n<arg_key>tags</arg_key>\n"
            '<arg_value>["a"]</arg_value>\n<arg_key>meta</arg_key>\n<arg_value>{"n": 2}</arg_value>\n</tool_call>'
            "<|observation|>\n<tool_response>\nwritten\n</tool_response><|assistant|>") in text
    written = text[text.rindex("<tool_call>"):text.rindex("</tool_call>") + len("</tool_call>")]
    for form in (written, written.replace("write_file\n", "write_file").replace(">\n<", "><")):
        _, [call], _ = run_parser(TOOL_PARSERS["glm45"].for_functions(FUNCTIONS), [form])
        assert call.name == "write_file" and json.loads(call.arguments) == arguments, form
    assert TOOL_PARSERS["glm45"].text_of([{"name": "write_file", "arguments": arguments}]) == written


@pytest.mark.parametrize("tags_are_tokens", [False, True])
@pytest.mark.parametrize("parallel", [False, True])
def test_a_forced_answer_of_any_tokens_is_calls_that_meet_the_schema(tokenizer, glm_tokenizer, tags_are_tokens,
                                                                     parallel):
    """Where the tags are GLM's added tokens a text value ends at the </arg_value> token, else at its text."""
    tok = glm_tokenizer if tags_are_tokens else tokenizer
    assert_forced_answers_meet_the_schema(tok, TOOL_PARSERS["glm45"], FUNCTIONS, RUN, parallel)


GOOD = [
    "<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>a.py</arg_value>\n<arg_key>content</arg_key>\n"
    "<arg_value>x <b> y\n\n</arg_value>\n<arg_key>mode</arg_key>\n<arg_value>7</arg_value>\n<arg_key>level</arg_key>\n"
    "<arg_value>low</arg_value>\n</tool_call>",
    "<tool_call>run<arg_key>cmd</arg_key><arg_value>ls</arg_value></tool_call>",  # GLM-4.7's spacing
]
BAD = [
    "<tool_call>run\n</tool_call>",  # a required parameter left out
    "<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>much too long</arg_value>\n</tool_call>",
    "<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>a</arg_value>\n<arg_key>content</arg_key>\n"
    "<arg_value>b</arg_value>\n<arg_key>mode</arg_key>\n<arg_value>rw</arg_value>\n</tool_call>",  # not an integer
    "<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>a</arg_value>\n<arg_key>content</arg_key>\n"
    "<arg_value>b</arg_value>\n<arg_key>level</arg_key>\n<arg_value>mid</arg_value>\n</tool_call>",  # not in the enum
    "<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>a</arg_value>b</arg_value>\n</tool_call>",
    "<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n"
    "</tool_call>",  # a parameter the schema does not name
    "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>UTC</arg_value>\n</tool_call>",  # no such function
]


@pytest.mark.parametrize("tags_are_tokens", [False, True])
@pytest.mark.parametrize("bad", BAD)
def test_the_forced_grammar_refuses_what_breaks_the_schema(tokenizer, glm_tokenizer, tags_are_tokens, bad):
    tok = glm_tokenizer if tags_are_tokens else tokenizer
    grammar = TOOL_PARSERS["glm45"].grammar(FUNCTIONS, False, added_tokens(tok))
    for text, accepted in [(good, True) for good in GOOD] + [(bad, False)]:
        assert grammar_accepts(tok, grammar, text) == accepted, text
