"""gpt-oss's harmony format through the front end's output side: the answers below are written by
hand as OpenAI documents the format for gpt-oss (the analysis channel for reasoning, final for the
answer, commentary to=functions.NAME with <|constrain|>json for a call, a recipient after the role
or after the channel), with the split each must give written beside it. They go through the
reasoning and tool-call parsers whole and split at every character, and through the
OutputProcessor one token at a time on a tokenizer whose harmony markers are special tokens (the
decoder keeps them for these parsers only). The forced-call grammar is checked with llguidance."""
import json

import jsonschema
import pytest

from dashinfer_client.frontend import OutputProcessor, Prompts
from dashinfer_client.frontend.parsers import REASONING_PARSERS, TOOL_PARSERS, reasoning_parser_for, tool_parser_for
from dashinfer_client.tokenizer import added_tokens
from tests.chat_templates import HARMONY, HARMONY_TOKENS, HERMES_CHATML
from tests.helpers import build_tiny_tokenizer
from tests.output_helpers import elements

ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>"
# (answer, reasoning, content, [(name, arguments as written)])
CASES = [
    (ANALYSIS + "User asks for the capital of France. Simple.<|end|>" + FINAL + "The capital is Paris.<|return|>",
     "User asks for the capital of France. Simple.", "The capital is Paris.", []),
    (ANALYSIS + "Need the weather: call get_weather.<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city":"San Francisco","unit":"C"}<|call|>',
     "Need the weather: call get_weather.", "", [("get_weather", '{"city":"San Francisco","unit":"C"}')]),
    # the recipient after the role, and the answer cut before <|call|> (an eos the engine took off)
    ('<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"zone": "CET"}',
     "", "", [("get_time", '{"zone": "CET"}')]),
    # the recipient in the role section of the answer's first header, which the prompt's
    # <|start|>assistant opened (the form gpt-oss's chat template writes past calls in)
    (' to=functions.get_time<|channel|>commentary json<|message|>{"zone": "CET"}<|call|>',
     "", "", [("get_time", '{"zone": "CET"}')]),
    ("today<|channel|>final<|message|>x", "", "todayx", []),
    ("to", "", "to", []),
    # a preamble (commentary without a recipient) is for the user: content
    ("<|channel|>commentary<|message|>Checking the weather now.<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>',
     "", "Checking the weather now.", [("get_weather", '{"city": "Oslo"}')]),
    ("No markers: 2 < 3 and <|not a marker.", "", "No markers: 2 < 3 and <|not a marker.", []),
    (ANALYSIS + "Cut by max_tokens in the reason", "Cut by max_tokens in the reason", "", []),
    (ANALYSIS + "Two<|end|>" + ANALYSIS.replace("<|channel|>", "<|start|>assistant<|channel|>") + " steps.<|end|>"
     + FINAL + "Done", "Two steps.", "Done", []),
    # a response_format answer (the grammar ends it at the JSON's end): the analysis optional
    (ANALYSIS + "Paris, in C.<|end|>" + FINAL + '{"city": "Paris", "unit": "C"}', "Paris, in C.",
     '{"city": "Paris", "unit": "C"}', []),
    ('<|channel|>final<|message|>{"city": "Paris"}', "", '{"city": "Paris"}', []),
    # a header's marker inside a body (a model that wanders) is no text
    (FINAL + "A<|message|>B<|constrain|>C<|return|>", "", "ABC", []),
]


def _split_everywhere(answer):
    return [[answer], list(answer)] + [[answer[:k], answer[k:]] for k in range(1, len(answer))]


def _run(chunks, reasoning=True):
    """The chain the OutputProcessor runs: reasoning parser, then the tool parser on what it passes on."""
    think = REASONING_PARSERS["harmony"]() if reasoning else None
    tools = TOOL_PARSERS["harmony"]()
    out_reasoning, content, calls, parts = [], [], [], []
    for chunk in chunks + [None]:
        if think is None:
            rest = chunk if chunk is not None else ""
        else:
            r, rest = think.feed(chunk) if chunk is not None else think.finish()
            out_reasoning.append(r)
        text, got = tools.feed(rest)
        content.append(text)
        calls += got
        if chunk is None:
            text, got = tools.finish()
            content.append(text)
            calls += got
        parts += tools.take_parts()
    return "".join(out_reasoning), "".join(content), calls, parts


@pytest.mark.parametrize("answer, reasoning, content, calls", CASES)
def test_channels_split_whole_and_at_every_character(answer, reasoning, content, calls):
    for chunks in _split_everywhere(answer):
        got_reasoning, got_content, got_calls, parts = _run(chunks)
        assert (got_reasoning, got_content) == (reasoning, content), chunks
        assert [(c.name, c.arguments) for c in got_calls] == calls
        for call in got_calls:  # the streamed pieces join into exactly the call's arguments
            mine = [p for p in parts if p.id == call.id]
            assert mine[0].name == call.name and all(p.name is None for p in mine[1:])
            assert "".join(p.arguments for p in mine) == call.arguments


def test_without_the_reasoning_parser_the_analysis_is_content():
    _, content, calls, _ = _run([CASES[0][0]], reasoning=False)
    assert content == "User asks for the capital of France. Simple.The capital is Paris." and calls == []


def test_harmony_chosen_from_the_template_and_parses_every_answer():
    assert tool_parser_for(HARMONY).name == reasoning_parser_for(HARMONY).name == "harmony"
    assert tool_parser_for(HERMES_CHATML).name == "hermes"  # the others' markers are not harmony's
    assert tool_parser_for(HERMES_CHATML, "harmony").name == reasoning_parser_for(None, "harmony").name == "harmony"
    assert reasoning_parser_for(HARMONY, "none") is None


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from dashinfer_client.tokenizer import Tokenizer
    return Tokenizer(build_tiny_tokenizer(str(tmp_path_factory.mktemp("harmony-tok")), HARMONY, HARMONY_TOKENS))



@pytest.mark.parametrize("answer, reasoning, content, calls", CASES)
def test_output_side_token_by_token(tokenizer, answer, reasoning, content, calls):
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    specials = {tokenizer.convert_tokens_to_ids(t) for t in HARMONY_TOKENS}
    assert specials & set(ids) or "<|" not in answer.replace("<|not", "")  # the markers are single special tokens
    prompts = Prompts(tokenizer)
    out = OutputProcessor(tokenizer, reasoning=prompts.reasoning_parser("<|start|>assistant"),
                          tools=prompts.tool_parser(None))  # harmony's parser runs with no tools offered too
    deltas = [out.push(elements([i])) for i in ids] + [out.finish("eos")]
    assert "".join(d.reasoning for d in deltas) == reasoning
    assert "".join(d.text for d in deltas) == content
    got = [c for d in deltas for c in d.tool_calls]
    assert [(c.name, c.arguments) for c in got] == calls
    parts = [p for d in deltas for p in d.tool_call_parts]
    for index, call in enumerate(got):
        assert "".join(p.arguments for p in parts if p.index == index) == call.arguments
    assert deltas[-1].finish_reason == ("tool_calls" if calls else "stop")
    assert "".join(d.raw_text for d in deltas) == answer  # what the model wrote, markers kept
    if reasoning and content:  # streamed: the reasoning came before the answer, in more than one piece
        first_text = next(k for k, d in enumerate(deltas) if d.text)
        assert len([d for d in deltas[:first_text] if d.reasoning]) > 1


# (answer, its reasoning's tokens as a text): an analysis message's body and the words of its header
# (the role, the channel's name) count, the markers (special tokens) do not
REASONING_TOKENS = [
    (CASES[0][0], "analysis" + CASES[0][1]),
    (CASES[1][0], "analysis" + CASES[1][1]),
    (CASES[9][0], "analysis" + "Two" + "assistant" + "analysis" + " steps."),
    (CASES[6][0], ""),  # a preamble and a call: no reasoning
]


@pytest.mark.parametrize("answer, counted", REASONING_TOKENS)
def test_reasoning_tokens_counted_token_by_token(tokenizer, answer, counted):
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    prompts = Prompts(tokenizer)
    out = OutputProcessor(tokenizer, reasoning=prompts.reasoning_parser("<|start|>assistant"),
                          tools=prompts.tool_parser(None))
    for i in ids:
        out.push(elements([i]))
    out.finish("eos")
    assert out.reasoning_tokens == len(tokenizer(counted, add_special_tokens=False)["input_ids"])


def test_the_tokenizers_other_special_tokens_stay_skipped(tokenizer):
    answer = FINAL + "Hi<|im_end|> there<|endoftext|><|return|>"
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    prompts = Prompts(tokenizer)
    out = OutputProcessor(tokenizer, reasoning=prompts.reasoning_parser(""), tools=prompts.tool_parser(None))
    deltas = [out.push(elements([i])) for i in ids] + [out.finish("eos")]
    assert "".join(d.text for d in deltas) == "Hi there"
    assert "".join(d.raw_text for d in deltas) == FINAL + "Hi there<|return|>"
    assert [i for d in deltas for i in d.token_ids] == ids  # skipped from the text, not from the answer


def test_other_formats_still_read_the_text_without_special_tokens(tokenizer):
    ids = tokenizer("<|start|>Hi<|end|>", add_special_tokens=False)["input_ids"]
    out = OutputProcessor(tokenizer, tools=TOOL_PARSERS["hermes"]())
    deltas = [out.push(elements(ids)), out.finish("eos")]
    assert "".join(d.text for d in deltas) == tokenizer.decode(ids, skip_special_tokens=True) == "Hi"


WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"], "additionalProperties": False}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                           "required": ["zone"]}}


def _accepts(tokenizer, grammar, text=None, ids=None) -> bool:
    import llguidance
    ll = llguidance.LLTokenizer(tokenizer.backend_tokenizer.to_str())
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = ids if ids is not None else tokenizer(text, add_special_tokens=False)["input_ids"]
    return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()


@pytest.mark.parametrize("good, bad", [
    ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Lima"}<|call|>',
     '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"town": "Lima"}<|call|>'),
    ('<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "CET"}<|call|>',
     '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "EST"}<|call|>'),
    ('<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "UTC"}<|call|>',
     '<|channel|>final<|message|>It is noon.<|return|>'),
])
def test_forced_call_grammar_accepts_the_format_and_only_the_schema(tokenizer, good, bad):
    grammar = TOOL_PARSERS["harmony"].grammar([WEATHER, TIME], True, added_tokens(tokenizer))
    assert _accepts(tokenizer, grammar, good) and not _accepts(tokenizer, grammar, bad)
    # the markers are the special tokens, not their characters spelled out byte by byte
    ids = tokenizer(good, add_special_tokens=False)["input_ids"]
    spelled = [i for piece in ("<|ca", "ll|>") for i in tokenizer(piece, add_special_tokens=False)["input_ids"]]
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|call|>") and len(spelled) == 8
    assert _accepts(tokenizer, grammar, ids=ids) and not _accepts(tokenizer, grammar, ids=ids[:-1] + spelled)
    _, _, [call], _ = _run([good])
    jsonschema.validate(json.loads(call.arguments), {"get_weather": WEATHER, "get_time": TIME}[call.name]["parameters"])
