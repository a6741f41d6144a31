"""Qwen3-Coder's XML tool calls and Granite 3.x's `<|tool_call|>[...]` (parsers/qwen3_coder.py,
granite.py). The answers below are written by hand in each family's format (as their templates show
the model its calls); the references are the values written there, read by the rules of vLLM's
qwen3_coder parser (a string stays text, other types parsed), json.dumps of them for the arguments'
text, transformers' apply_chat_template for the prompts, llguidance and jsonschema for the grammars
of forced calls."""
import json

import pytest

from dashinfer_client.frontend import OutputProcessor, Prompts
from dashinfer_client.frontend.parsers import TOOL_PARSERS
from dashinfer_client.tokenizer import added_tokens
from tests.chat_templates import GRANITE, GRANITE_TOKENS, QWEN3_CODER
from tests.helpers import build_tiny_tokenizer
from tests.output_helpers import (FUNCTIONS, RUN, assert_cut_anywhere_streams_its_calls,
                                  assert_forced_answers_meet_the_schema, assert_read_split_everywhere, elements,
                                  grammar_accepts, run_parser)

CODE = 'def f(x):\n    return x < 3 and "q" \\ {}\n\n'  # a value that ends in newlines of its own

# (answer, expected content, expected calls as (name, arguments))
ANSWERS = [
    ("I will write it.\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
     f"<parameter=content>\n{CODE}\n</parameter>\n<parameter=mode>\n644\n</parameter>\n<parameter=force>\nTrue\n"
     "</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=level>\nhigh\n</parameter>\n"
     "<parameter=ratio>\nnull\n</parameter>\n</function>\n</tool_call>",
     "I will write it.\n", [("write_file", {"path": "src/a.py", "content": CODE, "mode": 644, "force": True,
                                             "tags": ["a", "b"], "level": "high", "ratio": None})]),
    # two calls; values that do not read as their type stay text; a parameter the schema does not name is
    # text; `false` and a number as JSON; a value ended by the next tag, without its </parameter>
    ("<tool_call>\n<function=run>\n<parameter=cmd>\nls -l\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
     "<function=write_file>\n<parameter=path>\n007\n</parameter>\n<parameter=mode>\nrw\n</parameter>\n"
     "<parameter=force>\nfalse\n</parameter>\n<parameter=ratio>\n0.5\n<parameter=extra>\n42\n</function>\n</tool_call>",
     "\n", [("run", {"cmd": "ls -l"}),
            ("write_file", {"path": "007", "mode": "rw", "force": False, "ratio": 0.5, "extra": "42"})]),
    # a call without its <tool_call> wrapper; text that only mentions the tags is content
    ("Use <tool_call> tags.\n<function=run>\n<parameter=cmd>\nprintf 'Grüße'\n</parameter>\n</function>",
     "Use <tool_call> tags.\n", [("run", {"cmd": "printf 'Grüße'"})]),
    ("No call: 2 < 3, <b>bold</b> and <function no.", "No call: 2 < 3, <b>bold</b> and <function no.", []),
    # numbers JSON has no spelling for (NaN, an overflow to infinity) stay text, as vLLM keeps them: the
    # arguments are JSON
    ("<tool_call>\n<function=write_file>\n<parameter=ratio>\nNaN\n</parameter>\n<parameter=tags>\n[1e999]\n"
     "</parameter>\n</function>\n</tool_call>", "", [("write_file", {"ratio": "NaN", "tags": "[1e999]"})]),
]


@pytest.mark.parametrize("answer, content, calls", ANSWERS)
def test_qwen3_coder_calls_read_whole_and_split_everywhere(answer, content, calls):
    assert_read_split_everywhere(TOOL_PARSERS["qwen3_coder"], FUNCTIONS, answer, content, calls)



@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from dashinfer_client.tokenizer import Tokenizer
    return Tokenizer(build_tiny_tokenizer(str(tmp_path_factory.mktemp("tok"))))


def test_a_text_value_streams_as_it_is_written(tokenizer):
    answer = ANSWERS[0][0]
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    out = OutputProcessor(tokenizer, tools=TOOL_PARSERS["qwen3_coder"].for_functions(FUNCTIONS))
    deltas = [out.push(elements([i])) for i in ids] + [out.finish("eos")]
    [call] = [c for d in deltas for c in d.tool_calls]
    # one token a character: the code's characters stream one by one, as decoded (its last newline held
    # back until the next one shows it is not the closing tag's)
    pieces = [p.arguments for d in deltas[:answer.index(CODE) + len(CODE)] for p in d.tool_call_parts]
    assert "".join(pieces).endswith(json.dumps(CODE[:-1])[1:-1]) and len(pieces) > len(CODE)
    assert deltas[-1].finish_reason == "tool_calls" and "".join(d.text for d in deltas) == "I will write it.\n"
    assert json.loads(call.arguments)["content"] == CODE


@pytest.mark.parametrize("fmt, answer", [
    ("qwen3_coder", ANSWERS[1][0]),
    ("granite", '<|tool_call|>[{"name": "run", "arguments": {"cmd": "ls"}}, {"name": "write_file", "arguments": '
                '{"path": "a", "content": "b"}}]'),
])
def test_an_answer_cut_anywhere_streams_the_calls_it_answers(tokenizer, fmt, answer):
    assert_cut_anywhere_streams_its_calls(tokenizer, lambda: TOOL_PARSERS[fmt].for_functions(FUNCTIONS), answer)


def _template_tokenizers(tmp_path, template, special=()):
    from transformers import AutoTokenizer

    from dashinfer_client.tokenizer import Tokenizer
    path = build_tiny_tokenizer(str(tmp_path), template, special)
    return Tokenizer(path), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("template, special, fmt", [(QWEN3_CODER, (), "qwen3_coder"),
                                                    (GRANITE, GRANITE_TOKENS, "granite")])
def test_prompts_with_tools_and_a_round_trip_are_transformers_ids(tmp_path, template, special, fmt):
    ours, reference = _template_tokenizers(tmp_path, template, special)
    prompts = Prompts(ours)
    assert prompts.tool_format.name == fmt and prompts.tool_format.template_renders_tools
    arguments = {"path": "a.py", "content": "x = 1\n", "mode": 420, "force": True, "tags": ["a"]}
    ask = [{"role": "user", "content": "Write a.py"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "write_file", "arguments": arguments}]}
    result = {"role": "tool", "tool_call_id": "c1", "name": "write_file", "content": "written"}
    hf_turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": arguments}}]}
    tools = [{"type": "function", "function": f} for f in FUNCTIONS]
    for mine, theirs in [(ask, ask), (ask + [turn, result], ask + [hf_turn, result])]:
        expected = reference.apply_chat_template(theirs, tools=tools, tokenize=False, add_generation_prompt=True)
        assert prompts.chat_ids(mine, FUNCTIONS) == reference(expected, add_special_tokens=False)["input_ids"]
    text = prompts.chat_text(ask + [turn, result], FUNCTIONS)
    if fmt == "qwen3_coder":  # the call as the model writes it: a string as text, others as the template writes them
        assert ("<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\nx = 1\n\n"
                "</parameter>\n<parameter=mode>\n420\n</parameter>\n<parameter=force>\nTrue\n</parameter>\n"
                '<parameter=tags>\n["a"]\n</parameter>\n</function>') in text
        written = text[text.rindex("<tool_call>"):text.rindex("</tool_call>") + len("</tool_call>")]
        _, [call], _ = run_parser(TOOL_PARSERS[fmt].for_functions(FUNCTIONS), [written])
        assert json.loads(call.arguments) == arguments  # what the template wrote reads back as the call
    else:  # Granite's template writes no calls (IBM's granite-io neither): the turn's content only
        assert "<|start_of_role|>assistant<|end_of_role|><|end_of_text|>" in text and "write_file" in text


@pytest.mark.parametrize("fmt", ["qwen3_coder", "granite"])
@pytest.mark.parametrize("parallel", [False, True])
def test_a_forced_answer_of_any_tokens_is_calls_that_meet_the_schema(tokenizer, fmt, parallel):
    assert_forced_answers_meet_the_schema(tokenizer, TOOL_PARSERS[fmt], FUNCTIONS, RUN, parallel)


@pytest.mark.parametrize("bad", [
    "<tool_call>\n<function=run>\n</function>\n</tool_call>",  # a required parameter left out
    "<tool_call>\n<function=run>\n<parameter=cmd>\nmuch too long\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=write_file>\n<parameter=path>\na\n</parameter>\n<parameter=content>\nb\n</parameter>\n"
    "<parameter=mode>\nrw\n</parameter>\n</function>\n</tool_call>",  # not an integer
    "<tool_call>\n<function=write_file>\n<parameter=path>\na\n</parameter>\n<parameter=content>\nb\n</parameter>\n"
    "<parameter=level>\nmid\n</parameter>\n</function>\n</tool_call>",  # not in the enum
    "<tool_call>\n<function=run>\n<parameter=cmd>\na</parameter>b\n</parameter>\n</function>\n</tool_call>",
])
def test_the_forced_grammar_refuses_what_breaks_the_schema(tokenizer, bad):
    grammar = TOOL_PARSERS["qwen3_coder"].grammar(FUNCTIONS, False, added_tokens(tokenizer))
    good = ("<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\n"
            "x <b> y\n\n</parameter>\n<parameter=mode>\n7\n</parameter>\n<parameter=level>\nlow\n</parameter>\n"
            "</function>\n</tool_call>")
    for text, accepted in ((good, True), (bad, False)):
        assert grammar_accepts(tokenizer, grammar, text) == accepted, text
