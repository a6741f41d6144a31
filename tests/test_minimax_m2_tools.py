"""MiniMax-M2 / M2.1's tool calls (parsers/minimax_m2.py): a <minimax:tool_call> block of
`<invoke name="NAME">` calls, each argument `<parameter name="ARG">VALUE</parameter>`, on lines of their
own. The answers below are written by hand as MiniMax's template writes a call (a string value as it
is, any other as JSON, no newline around it); the references are those values read back by their
parameter's schema type (a string stays text even where it looks like a number, nothing of it
stripped), json.dumps of them for the arguments' text, transformers' apply_chat_template for the
prompts, llguidance and jsonschema for the grammars of forced calls."""
import json

import pytest

from dashinfer_client.frontend import OutputProcessor, Prompts
from dashinfer_client.frontend.parsers import REASONING_PARSERS, TOOL_PARSERS
from dashinfer_client.tokenizer import Tokenizer, added_tokens
from tests.chat_templates import MINIMAX_ADDED, MINIMAX_M2, MINIMAX_SPECIAL
from tests.helpers import build_tiny_tokenizer
from tests.output_helpers import (FUNCTIONS, RUN, assert_cut_anywhere_streams_its_calls,
                                  assert_forced_answers_meet_the_schema, assert_read_split_everywhere, elements,
                                  grammar_accepts, run_parser)

CODE = '  def f(x):\n    return x < 3 and "q" \\ {}\n\n'  # spaces and newlines of its own at both ends
OPEN, CLOSE = "<minimax:tool_call>\n", "</minimax:tool_call>"


def invoke(name, *pairs, end="</invoke>\n"):
    """An invoke as the template writes it: each (key, value text) on a line of its own."""
    return f'<invoke name="{name}">\n' + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in pairs) + end


# (answer, expected content, expected calls as (name, arguments))
ANSWERS = [
    # content before the block, a value of each type, a text value with whitespace of its own at both ends
    ("I will write it.\n" + OPEN + invoke("write_file", ("path", "007"), ("content", CODE), ("mode", "644"),
                                          ("force", "true"), ("tags", '["a", "b"]'), ("meta", '{"n": 1}'),
                                          ("level", "high"), ("ratio", "null")) + CLOSE,
     "I will write it.\n", [("write_file", {"path": "007", "content": CODE, "mode": 644, "force": True,
                                            "tags": ["a", "b"], "meta": {"n": 1}, "level": "high", "ratio": None})]),
    # two invokes in one block, then a second block; a value that does not read as its type stays
    # text, as does a parameter the schema does not name
    (OPEN + invoke("run", ("cmd", "ls -l")) + invoke("write_file", ("path", "12"), ("mode", "rw"), ("ratio", "0.5"),
                                                     ("extra", "42")) + CLOSE + "\n" + OPEN
     + invoke("run", ("cmd", "pwd")) + CLOSE,
     "\n", [("run", {"cmd": "ls -l"}), ("write_file", {"path": "12", "mode": "rw", "ratio": 0.5, "extra": "42"}),
            ("run", {"cmd": "pwd"})]),
    # a tool the request did not offer (its values text), an invoke without arguments, content after
    (OPEN + invoke("search", ("limit", "5")) + invoke("run") + CLOSE + "\nDone.", "\nDone.",
     [("search", {"limit": "5"}), ("run", {})]),
    # text that only mentions the tag, JSON (another family's call) in one, an empty block, a name
    # with no closing quote: content as written
    ('Use <minimax:tool_call> blocks, as <minimax:tool_call>{"name": "run"}</minimax:tool_call>, not '
     '<minimax:tool_call>\n</minimax:tool_call> or <minimax:tool_call><invoke name="run\nnow.',
     'Use <minimax:tool_call> blocks, as <minimax:tool_call>{"name": "run"}</minimax:tool_call>, not '
     '<minimax:tool_call>\n</minimax:tool_call> or <minimax:tool_call><invoke name="run\nnow.', []),
    # a value ended by the next tag, its </parameter> left out; an invoke ended by the next one, its
    # </invoke> left out; a block ended by nothing: what follows it is content
    (OPEN + '<invoke name="write_file">\n<parameter name="path">a.py\n<parameter name="mode">7</parameter>\n'
     + invoke("run", ("cmd", "ls")) + "Then more.", "\nThen more.",
     [("write_file", {"path": "a.py\n", "mode": 7}), ("run", {"cmd": "ls"})]),
    # names in single quotes or none (vLLM's parser takes them too): the same call
    (OPEN + "<invoke name='run'>\n<parameter name=cmd>ls</parameter>\n</invoke>\n" + CLOSE, "", [("run", {"cmd": "ls"})]),
    # numbers JSON has no spelling for stay text: the arguments are JSON
    (OPEN + invoke("write_file", ("ratio", "NaN"), ("tags", "[1e999]")) + CLOSE, "",
     [("write_file", {"ratio": "NaN", "tags": "[1e999]"})]),
]


@pytest.mark.parametrize("answer, content, calls", ANSWERS)
def test_minimax_calls_read_whole_and_split_everywhere(answer, content, calls):
    assert_read_split_everywhere(TOOL_PARSERS["minimax_m2"], FUNCTIONS, answer, content, calls)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer(build_tiny_tokenizer(str(tmp_path_factory.mktemp("tok"))))


@pytest.fixture(scope="module")
def minimax_tokenizer(tmp_path_factory):
    """MiniMax's BOS, role and end markers as special tokens, <think> and the block's tags as added ones."""
    return Tokenizer(build_tiny_tokenizer(str(tmp_path_factory.mktemp("minimax-tok")), MINIMAX_M2, MINIMAX_SPECIAL,
                                          MINIMAX_ADDED))


def test_an_answer_cut_anywhere_streams_the_calls_it_answers(tokenizer):
    assert_cut_anywhere_streams_its_calls(tokenizer, lambda: TOOL_PARSERS["minimax_m2"].for_functions(FUNCTIONS),
                                          ANSWERS[1][0])


@pytest.mark.parametrize("special", [False, True])
def test_reasoning_then_a_call_token_by_token(tmp_path, minimax_tokenizer, special):
    """MiniMax answers inside the <think> its prompt opened, closes it, then calls: the think parser
    takes the reasoning, the call is read from the block's tag tokens, also where a tokenizer marks
    them special (they are decoded for the parser; its other special tokens, the [e~[ that ends the
    turn here, are still skipped)."""
    tok = (Tokenizer(build_tiny_tokenizer(str(tmp_path), MINIMAX_M2, MINIMAX_SPECIAL + MINIMAX_ADDED[2:],
                                          MINIMAX_ADDED[:2])) if special else minimax_tokenizer)
    answer = 'Look first.\n</think>\n\n' + OPEN + invoke("run", ("cmd", "ls")) + CLOSE
    ids = tok(answer + "[e~[", add_special_tokens=False)["input_ids"]
    assert tok.convert_tokens_to_ids("<minimax:tool_call>") in ids and tok.convert_tokens_to_ids("[e~[") == ids[-1]
    out = OutputProcessor(tok, reasoning=REASONING_PARSERS["think"](inside=True),
                          tools=TOOL_PARSERS["minimax_m2"].for_functions([RUN]))
    deltas = [out.push(elements([i])) for i in ids] + [out.finish("length")]
    assert "".join(d.reasoning for d in deltas) == "Look first.\n" and "".join(d.text for d in deltas) == ""
    [call] = [c for d in deltas for c in d.tool_calls]
    assert (call.name, call.arguments) == ("run", '{"cmd": "ls"}')
    assert "".join(p.arguments for d in deltas for p in d.tool_call_parts) == call.arguments


def test_prompts_are_transformers_ids_and_the_templates_calls_read_back(tmp_path):
    """The template picks minimax_m2 (its <minimax:tool_call>) and think, and opens the answer inside
    <think>; the prompts are transformers' ids; the reasoning of the turns since the last user turn is
    written back (from `reasoning`, or from the content, where MiniMax's clients send it), earlier
    turns' not; calls as the template writes them (two invokes in one block) read back as the
    arguments given, each of its type."""
    from transformers import AutoTokenizer
    path = build_tiny_tokenizer(str(tmp_path), MINIMAX_M2, MINIMAX_SPECIAL, MINIMAX_ADDED)
    prompts, reference = Prompts(Tokenizer(path)), AutoTokenizer.from_pretrained(path)
    assert (prompts.tool_format.name, prompts.reasoning_format.name) == ("minimax_m2", "think")
    arguments = {"path": "420", "content": "x = 1\n", "mode": 420, "force": True, "tags": ["a"], "meta": {"n": 2}}
    earlier = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "<think>\nGreet.\n</think>\n\nHello."}]
    ask = earlier + [{"role": "user", "content": "Write a.py"}]
    calls = [{"id": "c1", "name": "write_file", "arguments": arguments},
             {"id": "c2", "name": "run", "arguments": {"cmd": "ls"}}]
    results = [{"role": "tool", "tool_call_id": "c1", "name": "write_file", "content": "written"},
               {"role": "tool", "tool_call_id": "c2", "name": "run", "content": "a.py"}]
    hf_calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls]
    by_key = ({"role": "assistant", "content": "", "reasoning": "Write it.", "tool_calls": calls},
              {"role": "assistant", "content": "", "reasoning_content": "Write it.", "tool_calls": hf_calls})
    in_content = ({"role": "assistant", "content": "<think>\nWrite it.\n</think>\n\n", "tool_calls": calls},
                  {"role": "assistant", "content": "<think>\nWrite it.\n</think>\n\n", "tool_calls": hf_calls})
    tools = [{"type": "function", "function": f} for f in FUNCTIONS]
    for mine, theirs in [(ask, ask), (ask + [by_key[0]] + results, ask + [by_key[1]] + results),
                         (ask + [in_content[0]] + results, ask + [in_content[1]] + results)]:
        expected = reference.apply_chat_template(theirs, tools=tools, tokenize=False, add_generation_prompt=True)
        assert prompts.chat_ids(mine, FUNCTIONS) == reference(expected, add_special_tokens=False)["input_ids"]
        text = prompts.chat_text(mine, FUNCTIONS)
        assert text.endswith("[e~[\n]~b]ai\n<think>\n") and "Greet." not in text
    block = (OPEN + '<invoke name="write_file">\n<parameter name="path">420</parameter>\n<parameter name="content">'
             'x = 1\n</parameter>\n<parameter name="mode">420</parameter>\n<parameter name="force">true</parameter>\n'
             '<parameter name="tags">["a"]</parameter>\n<parameter name="meta">{"n": 2}</parameter>\n</invoke>\n'
             '<invoke name="run">\n<parameter name="cmd">ls</parameter>\n</invoke>\n' + CLOSE)
    assert ("]~b]ai\n<think>\nWrite it.\n</think>\n\n\n" + block + "[e~[\n]~b]tool\n<response>written</response>\n"
            "<response>a.py</response>[e~[\n") in text
    _, got, _ = run_parser(TOOL_PARSERS["minimax_m2"].for_functions(FUNCTIONS), [block])
    assert [(c.name, json.loads(c.arguments)) for c in got] == [("write_file", arguments), ("run", {"cmd": "ls"})]
    assert TOOL_PARSERS["minimax_m2"].text_of([{"name": c["name"], "arguments": c["arguments"]} for c in calls]) == block
    reasoning = prompts.reasoning_parser(text)  # the answer begins inside the <think> the prompt opened
    assert [reasoning.feed("Sure.\n</think>\n\nDone."), reasoning.finish()] == [("Sure.\n", "Done."), ("", "")]


@pytest.mark.parametrize("tags_are_tokens", [False, True])
@pytest.mark.parametrize("parallel", [False, True])
def test_a_forced_answer_of_any_tokens_is_calls_that_meet_the_schema(tokenizer, minimax_tokenizer, tags_are_tokens,
                                                                     parallel):
    """Where the block's tags are MiniMax's added tokens the grammar writes them as those tokens."""
    tok = minimax_tokenizer if tags_are_tokens else tokenizer
    assert_forced_answers_meet_the_schema(tok, TOOL_PARSERS["minimax_m2"], FUNCTIONS, RUN, parallel)


GOOD = [
    OPEN + invoke("write_file", ("path", "a.py"), ("content", "x <b> y\n\n"), ("mode", "7"), ("level", "low")) + CLOSE,
    OPEN + invoke("run", ("cmd", "ls")) + CLOSE,
]
BAD = [
    OPEN + invoke("run") + CLOSE,  # a required parameter left out
    OPEN + invoke("run", ("cmd", "much too long")) + CLOSE,
    OPEN + invoke("write_file", ("path", "a"), ("content", "b"), ("mode", "rw")) + CLOSE,  # not an integer
    OPEN + invoke("write_file", ("path", "a"), ("content", "b"), ("level", "mid")) + CLOSE,  # not in the enum
    OPEN + invoke("run", ("cmd", "a</parameter>b")) + CLOSE,
    OPEN + invoke("run", ("cmd", "ls"), ("x", "1")) + CLOSE,  # a parameter the schema does not name
    OPEN + invoke("get_time", ("zone", "UTC")) + CLOSE,  # no such function
    OPEN + invoke("run", ("cmd", "ls")) + invoke("run", ("cmd", "pwd")) + CLOSE,  # two calls, one allowed
    OPEN + '<invoke name="run"><parameter name="cmd">ls</parameter></invoke>' + CLOSE,  # not the template's lines
]


@pytest.mark.parametrize("tags_are_tokens", [False, True])
@pytest.mark.parametrize("bad", BAD)
def test_the_forced_grammar_refuses_what_breaks_the_schema(tokenizer, minimax_tokenizer, tags_are_tokens, bad):
    tok = minimax_tokenizer if tags_are_tokens else tokenizer
    grammar = TOOL_PARSERS["minimax_m2"].grammar(FUNCTIONS, False, added_tokens(tok))
    for text, accepted in [(good, True) for good in GOOD] + [(bad, False)]:
        assert grammar_accepts(tok, grammar, text) == accepted, text


def test_the_parallel_grammar_takes_several_invokes_in_one_block(minimax_tokenizer):
    grammar = TOOL_PARSERS["minimax_m2"].grammar(FUNCTIONS, True, added_tokens(minimax_tokenizer))
    both = OPEN + invoke("run", ("cmd", "ls")) + invoke("run", ("cmd", "pwd")) + CLOSE
    assert grammar_accepts(minimax_tokenizer, grammar, both)
    assert not grammar_accepts(minimax_tokenizer, grammar, GOOD[1] + "\n" + GOOD[1])  # one block
