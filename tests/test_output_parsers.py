"""The tool-call and reasoning parsers (dashinfer_client/frontend/parsers), each on its format as
the model family documents it (the texts below are written by hand in that format, not by the
parsers), fed whole and split at every character: the same calls and content come out, and no
tag ever leaks into the content. The grammars of forced calls are checked with llguidance itself
(what it accepts parses and validates against the schema with jsonschema), and the output side
against the tokenizer's own decode."""
import json

import jsonschema
import pytest

from dashinfer_client.frontend import OutputProcessor, Prompts
from dashinfer_client.frontend.parsers import (REASONING_PARSERS, TOOL_PARSERS, ToolCall, reasoning_parser_for,
                                               tool_parser_for)
from dashinfer_client.tokenizer import added_tokens
from tests.chat_templates import GLM45_ADDED, MINIMAX_ADDED
from tests.output_helpers import cut_answer, elements

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "unit": {"enum": ["C", "F"]}},
                          "required": ["city"], "additionalProperties": False}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                                           "required": ["zone"]}}

# (format, answer text as the family writes it, expected content, expected [(name, arguments)])
CASES = [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Let me look.\n", [("get_weather", {"city": "Paris"})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
     "\n", [("get_weather", {"city": "Oslo", "unit": "C"}), ("get_time", {"zone": "CET"})]),
    ("hermes", "No tools needed: 2 < 3 and <b>bold</b>.", "No tools needed: 2 < 3 and <b>bold</b>.", []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Rome"}}', "", [("get_weather", {"city": "Rome"})]),
    ("llama3_json", "The capital of Italy is Rome.", "The capital of Italy is Rome.", []),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]', "", [("get_time", {"zone": "UTC"})]),
    ("mistral", '[{"name": "get_time", "arguments": {"zone": "UTC"}}, {"name": "get_weather", "arguments": '
                '{"city": "Lima"}}]', "", [("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Lima"})]),
    ("granite", '<|tool_call|>[{"name": "get_time", "arguments": {"zone": "UTC"}}]', "", [("get_time", {"zone": "UTC"})]),
    ("granite", 'It is noon.', 'It is noon.', []),
    ("qwen3_coder", "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                    "</function>\n</tool_call>", "Let me look.\n", [("get_weather", {"city": "Paris"})]),
    ("seed_oss", "Let me look.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
                 "<parameter=unit>C</parameter>\n</function>\n</seed:tool_call>",
     "Let me look.\n", [("get_weather", {"city": "Paris", "unit": "C"})]),
    ("glm45", "Let me look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
              "</tool_call>", "Let me look.\n", [("get_weather", {"city": "Paris"})]),
    ("glm47", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>unit</arg_key>"
              "<arg_value>C</arg_value></tool_call>", "", [("get_weather", {"city": "Oslo", "unit": "C"})]),
    ("json", '{"name": "get_weather", "arguments": {"city": "Kyiv"}}', "", [("get_weather", {"city": "Kyiv"})]),
    ("json", '[{"name": "get_time", "arguments": {"zone": "EST"}}]', "", [("get_time", {"zone": "EST"})]),
    ("json", '{"answer": 42}', '{"answer": 42}', []),  # JSON, but no call: content
    ("json", "Paris is the capital.", "Paris is the capital.", []),
]


def _run(parser, chunks):
    content, calls = [], []
    for c in chunks:
        text, got = parser.feed(c)
        content.append(text)
        calls += got
    text, got = parser.finish()
    return "".join(content) + text, calls + got


@pytest.mark.parametrize("fmt, answer, content, calls", CASES)
def test_tool_parser_whole_and_split_everywhere(fmt, answer, content, calls):
    splits = [[answer], list(answer)] + [[answer[:k], answer[k:]] for k in range(1, len(answer))]
    for chunks in splits:
        got_content, got_calls = _run(TOOL_PARSERS[fmt](), chunks)
        # the pieces join into exactly the content: no tag, nor a piece of one, was handed out
        assert got_content == content, chunks
        assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls


def test_call_ids_are_unique():
    _, calls = _run(TOOL_PARSERS["hermes"](), [CASES[1][1]])
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize("template, tool, reasoning", [
    ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>{{ m }}</tool_call>", "hermes", None),
    ("{{- '<|python_tag|>' + tool_call.name }}", "llama3_json", None),
    ("{{ '[TOOL_CALLS]' }}{{ messages }}", "mistral", None),
    ("{% if enable_thinking %}<think>{% endif %}<tool_call>", "hermes", "think"),
    ("<tool_call>\n<function={{ name }}>\n<parameter={{ arg }}>\n{{ value }}\n</parameter>", "qwen3_coder", None),
    ("[gMASK]<sop>{{ '<tool_call>' + name }}\n<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>"
     "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}", "glm45", "think"),
    ("]~!b[]~b]system{{ '<minimax:tool_call>\\n<invoke name=\"' + name + '\">' }}]~b]ai\n<think>\n", "minimax_m2",
     "think"),
    ("{{- '<|start_of_role|>available_tools<|end_of_role|>' }}<|tool_call|>", "granite", None),
    ("<|tool_call|>{% if thinking %}Write your thoughts between <think></think> and write your response between "
     "<response></response>{% endif %}", "granite", "granite"),
    ("<seed:bos>{{ '<seed:tool_call>' }}<function={{ name }}><parameter={{ arg }}>"
     "{% if thinking_budget %}<seed:think>{% endif %}", "seed_oss", "seed_oss"),
    ("{{ messages[0]['content'] }}", "json", None),
    (None, "json", None),
])
def test_parsers_chosen_from_the_chat_template(template, tool, reasoning):
    assert tool_parser_for(template).name == tool
    assert (reasoning_parser_for(template).name if reasoning_parser_for(template) else None) == reasoning
    assert tool_parser_for(template, "mistral").name == "mistral"
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        tool_parser_for(template, "nope")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from dashinfer_client.tokenizer import Tokenizer
    from tests.helpers import build_tiny_tokenizer
    return Tokenizer(build_tiny_tokenizer(str(tmp_path_factory.mktemp("tok"))))


def _accepts(tokenizer, grammar, text) -> bool:
    import llguidance
    ll = llguidance.LLTokenizer(tokenizer.backend_tokenizer.to_str())
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()


@pytest.mark.parametrize("fmt, parallel, good, bad", [
    ("hermes", False, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>'),
    ("llama3_json", False, '{"name": "get_time", "parameters": {"zone": "UTC"}}', 'It is noon.'),
    ("mistral", True, '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]',
     '[TOOL_CALLS][{"name": "get_date", "arguments": {}}]'),
    ("granite", False, '<|tool_call|>[{"name": "get_time", "arguments": {"zone": "UTC"}}]',
     '<|tool_call|>[{"name": "get_time", "arguments": {"zone": "UTC"}}, {"name": "get_time", "arguments": {}}]'),
    ("qwen3_coder", False, "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
     "<parameter=unit>\nF\n</parameter>\n</function>\n</tool_call>", "<tool_call>\n<function=get_weather>\n"
     "<parameter=city>\nRome\n</parameter>\n<parameter=unit>\nK\n</parameter>\n</function>\n</tool_call>"),
    ("seed_oss", False, "<seed:tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n"
     "</seed:tool_call>", "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n"
     "</tool_call>"),
    ("json", True, '[{"name": "get_weather", "arguments": {"city": "Rome", "unit": "F"}}]',
     '[{"name": "get_weather", "arguments": {"city": "Rome", "unit": "K"}}]'),
    ("json", False, '{"name": "get_time", "arguments": {"zone": "UTC"}}', '{"name": "get_time"}'),
])
def test_forced_call_grammar_accepts_the_format_and_only_the_schema(tokenizer, fmt, parallel, good, bad):
    cls = TOOL_PARSERS[fmt]
    grammar = cls.grammar([WEATHER, TIME], parallel, added_tokens(tokenizer))  # the markers are text here
    assert _accepts(tokenizer, grammar, good) and not _accepts(tokenizer, grammar, bad)
    _, calls = _run(cls(), [good])
    schemas = {f["name"]: f["parameters"] for f in (WEATHER, TIME)}
    for call in calls:  # what the grammar lets through parses, and its arguments meet the schema
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])


GLM_TIME = "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>UTC</arg_value>\n</tool_call>"
MINIMAX_TIME = ('<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="zone">UTC</parameter>\n</invoke>\n'
                '</minimax:tool_call>')


@pytest.mark.parametrize("fmt, special, added, answer", [
    ("mistral", ("[TOOL_CALLS]",), (), '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]'),
    ("granite", ("<|tool_call|>",), (), '<|tool_call|>[{"name": "get_time", "arguments": {"zone": "UTC"}}]'),
    ("hermes", (), ("<tool_call>", "</tool_call>"),
     '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'),
    ("qwen3_coder", (), ("<tool_call>", "</tool_call>"),
     "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>"),
    ("glm45", (), GLM45_ADDED, GLM_TIME),  # GLM's tags as its tokenizer has them: added, not special
    ("glm45", GLM45_ADDED, (), GLM_TIME),  # and as special tokens: still read (special_tokens)
    ("minimax_m2", (), MINIMAX_ADDED[2:], MINIMAX_TIME),  # MiniMax's block tags: added tokens, not special
    ("minimax_m2", MINIMAX_ADDED[2:], (), MINIMAX_TIME),  # and as special tokens: still read (special_tokens)
])
def test_a_forced_call_begins_with_the_marker_token_where_the_tokenizer_has_one(tmp_path, fmt, special, added, answer):
    """Mistral's [TOOL_CALLS] and Granite's <|tool_call|> are special tokens of their tokenizers, Qwen's
    <tool_call> an added token that is not special: the grammar's first step offers that token alone
    (what the model was trained to write), and the answer the tokenizer writes for the call (the
    markers as their tokens) is accepted and read back as the call, whole and a token at a time. A
    literal marker was offered as the token and then refused by llguidance: the request ended with
    no call."""
    import llguidance
    import numpy as np
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    from dashinfer_client.tokenizer import Tokenizer
    from tests.helpers import build_tiny_tokenizer
    tok = Tokenizer(build_tiny_tokenizer(str(tmp_path), extra_special=special, extra_added=added))
    grammar = TOOL_PARSERS[fmt].grammar([TIME], False, added_tokens(tok))
    ll = llguidance.LLTokenizer(tok.backend_tokenizer.to_str(), eos_token=tok.eos_token_id)
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    bits = allocate_token_bitmask(1, ll.vocab_size)
    fill_next_token_bitmask(matcher, bits, 0)
    offered = np.flatnonzero(np.unpackbits(bits[0].view(np.uint8), bitorder="little")[:ll.vocab_size])
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    assert offered.tolist() == [ids[0]] == [tok.convert_tokens_to_ids((special + added)[0])]
    assert _accepts(tok, grammar, answer)
    out = OutputProcessor(tok, tools=TOOL_PARSERS[fmt].for_functions([TIME]))
    deltas = [out.push(elements([i])) for i in ids] + [out.finish("eos")]
    [call] = [c for d in deltas for c in d.tool_calls]
    assert (call.name, json.loads(call.arguments)) == ("get_time", {"zone": "UTC"})
    parts = [p for d in deltas for p in d.tool_call_parts]
    assert parts[0].name == "get_time" and "".join(p.arguments for p in parts) == call.arguments
    assert "".join(d.text for d in deltas) == "" and deltas[-1].finish_reason == "tool_calls"


def test_templates_without_tools_get_them_in_a_system_message(tokenizer):
    prompts = Prompts(tokenizer)
    assert prompts.tool_format.name == "json" and not prompts.tool_format.template_renders_tools
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "get_weather",
                                                                     "arguments": {"city": "Paris"}}]},
               {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18 C"}]
    text = prompts.chat_text(history, [WEATHER])
    # The tiny tokenizer's ChatML template, rendered by jinja2 by hand: what the prompt must be.
    system = TOOL_PARSERS["json"].describe([WEATHER])
    expected = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                '<|im_start|>assistant\n{"name": "get_weather", "arguments": {"city": "Paris"}}<|im_end|>\n'
                "<|im_start|>user\nResult of get_weather: 18 C<|im_end|>\n<|im_start|>assistant\n")
    assert text == expected
    assert json.dumps(WEATHER["parameters"]) in system


@pytest.mark.parametrize("ours", [True, False])
def test_a_tool_use_template_renders_the_tools_and_names_the_format(tmp_path, ours):
    """Named templates (Hermes-3's "default" and "tool_use"): a request with tools is rendered by
    "tool_use", as transformers renders it, and its calls are parsed in that template's format;
    without tools, "default" (which here opens a reasoning) renders it."""
    from transformers import AutoTokenizer
    from dashinfer_client.tokenizer import Tokenizer
    from tests.chat_templates import HERMES_CHATML, THINK_CHATML
    from tests.helpers import build_tiny_tokenizer
    path = build_tiny_tokenizer(str(tmp_path), {"default": THINK_CHATML, "tool_use": HERMES_CHATML})
    ref = AutoTokenizer.from_pretrained(path)
    prompts = Prompts(Tokenizer(path) if ours else ref)
    assert prompts.tool_format.name == "hermes" and prompts.reasoning_format.name == "think"
    chat = [{"role": "user", "content": "Weather in Paris?"}]
    assert prompts.chat_text(chat, [WEATHER]) == ref.apply_chat_template(
        chat, tools=[{"type": "function", "function": WEATHER}], tokenize=False, add_generation_prompt=True)
    assert prompts.chat_text(chat) == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)



def test_output_side_streams_reasoning_and_calls_token_by_token(tokenizer):
    answer = ('<think>short</think>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "ÜTC"}}\n'
              '</tool_call>')
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    out = OutputProcessor(tokenizer, terminators=[[tokenizer.eos_token_id]],
                          reasoning=REASONING_PARSERS["think"](), tools=TOOL_PARSERS["hermes"]())
    deltas = [out.push(elements([i])) for i in ids] + [out.finish("eos")]
    assert "".join(d.reasoning for d in deltas) == "short"
    assert "".join(d.text for d in deltas) == ""
    calls = [c for d in deltas for c in d.tool_calls]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"zone": "ÜTC"})]
    assert deltas[-1].finish_reason == "tool_calls"
    assert [i for d in deltas for i in d.token_ids] == ids[:-1]  # the eos is no part of the answer


# (answer, the template opened <think>, the reasoning's tokens where <think> and </think> are tokens
# of their own (Qwen3's), and where they are text: the opening tag's tokens then count with the
# reasoning, the closing tag's with the answer)
REASONING_TOKENS = [
    ("<think>\nWeigh it: ü.\n</think>\n\nThe answer is 4.", False, "\nWeigh it: ü.\n", "<think>\nWeigh it: ü.\n"),
    ("Weigh it. </think>4", True, "Weigh it. ", "Weigh it. "),
    ("<think>never closed", False, "never closed", "<think>never closed"),
    ("Just 4.", False, "", ""),
    ('<think>Call it.</think>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>', False,
     "Call it.", "<think>Call it."),
]


@pytest.mark.parametrize("answer, inside, as_tokens, as_text", REASONING_TOKENS)
def test_reasoning_tokens_counted_token_by_token(tmp_path_factory, tokenizer, answer, inside, as_tokens, as_text):
    from dashinfer_client.tokenizer import Tokenizer
    from tests.helpers import build_tiny_tokenizer
    qwen_like = Tokenizer(build_tiny_tokenizer(str(tmp_path_factory.mktemp("think-tok")),
                                               extra_added=("<think>", "</think>")))
    for tok, counted in ((qwen_like, as_tokens), (tokenizer, as_text)):
        ids = tok(answer, add_special_tokens=False)["input_ids"]
        out = OutputProcessor(tok, reasoning=REASONING_PARSERS["think"](inside=inside), tools=TOOL_PARSERS["hermes"]())
        deltas = [out.push(elements([i])) for i in ids] + [out.finish("eos")]
        assert "".join(d.reasoning for d in deltas) == as_tokens.replace("<think>", "")
        assert out.reasoning_tokens == len(tok(counted, add_special_tokens=False)["input_ids"]), tok


def test_output_side_text_equals_decode_and_cuts_stop_strings(tokenizer):
    text = "Grüße aus Köln 😀, und dann STOP hier"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    out = OutputProcessor(tokenizer, stop=["STOP", "never"])
    pieces = [out.push(elements([i])).text for i in ids]
    last = out.finish("length")
    assert "".join(pieces) + last.text == tokenizer.decode(ids)[:text.index("STOP")]
    assert all("\ufffd" not in p for p in pieces)  # whole characters only
    assert last.finish_reason == "stop" and last.stop_string == "STOP"


# Calls as each family writes them (compact, spaced, nested, escaped, several), and the arguments'
# exact text in each: what the streamed pieces must join into (the reference is the text itself,
# cut by hand).
STREAMED = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>',
     ['{"city": "Paris", "unit": "C"}']),
    ("hermes", 'Sure.<tool_call>{"name":"f","arguments":{"a":[1,{"b":"}]\\"{"}],"c":"Grüße"}}</tool_call>'
               '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',
     ['{"a":[1,{"b":"}]\\"{"}],"c":"Grüße"}', '{}']),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "C"}}', ['{"city": "Rome", "unit": "C"}']),
    ("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}; '
                    '{"name":"get_weather","parameters":{"city":"Lima"}}', ['{"zone": "UTC"}', '{"city":"Lima"}']),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "Europe/Oslo"}}, '
                '{"name":"f","arguments":{"a":[1,{"b":"}]\\"{"}]}}]', ['{"zone": "Europe/Oslo"}', '{"a":[1,{"b":"}]\\"{"}]}']),
    ("json", '{"name": "get_weather", "arguments": {"city": "Grüße aus Köln"}}', ['{"city": "Grüße aus Köln"}']),
    ("json", ' [{"name": "get_time", "arguments": {"zone": "EST"}},\n {"name": "get_weather", "arguments": {"city": "Rome"}}]',
     ['{"zone": "EST"}', '{"city": "Rome"}']),
]


@pytest.mark.parametrize("fmt, answer, arguments", STREAMED)
def test_calls_stream_arguments_as_written(tokenizer, fmt, answer, arguments):
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    out = OutputProcessor(tokenizer, tools=TOOL_PARSERS[fmt]())
    deltas = [out.push(elements([i])) for i in ids] + [out.finish("eos")]
    parts = [p for d in deltas for p in d.tool_call_parts]
    calls = [c for d in deltas for c in d.tool_calls]
    assert [c.arguments for c in calls] == arguments  # the whole answer's arguments: as the model wrote them
    for index, call in enumerate(calls):
        mine = [p for p in parts if p.index == index]
        assert (mine[0].id, mine[0].name) == (call.id, call.name)
        assert all(p.name is None and p.id == call.id for p in mine[1:])
        assert "".join(p.arguments for p in mine) == call.arguments
        json.loads(call.arguments)
    # a long argument list streams in many pieces, each as soon as its characters are decoded
    assert len([p for p in parts if p.index == 0]) > 5
    # before the answer ends, not all with its last Delta
    assert sum(len(d.tool_call_parts) for d in deltas[:-1]) > 5


@pytest.mark.parametrize("fmt, answer", [
    ("hermes", '<tool_call>{"arguments": {"zone": "UTC"}, "name": "get_time"}</tool_call>'),
    ("json", '{"arguments": {"zone": "UTC"}, "name": "get_time"}'),
    ("llama3_json", '{"parameters": {"zone": "UTC"}, "name": "get_time"}'),
])
def test_call_in_another_key_order_comes_whole_in_one_part(tokenizer, fmt, answer):
    out = OutputProcessor(tokenizer, tools=TOOL_PARSERS[fmt]())
    deltas = [out.push(elements([i])) for i in tokenizer(answer, add_special_tokens=False)["input_ids"]]
    deltas.append(out.finish("eos"))
    parts = [p for d in deltas for p in d.tool_call_parts]
    [call] = [c for d in deltas for c in d.tool_calls]
    assert [(p.index, p.name, p.arguments) for p in parts] == [(0, "get_time", call.arguments)]
    assert json.loads(call.arguments) == {"zone": "UTC"}


# Answers with two calls, as each family writes them: cut at every token (max_tokens may fall
# anywhere), the stream (parts joined by index) and the whole answer (tool_calls) must be the same calls.
CUT = [
    ("json", '[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
             '{"name": "get_time", "arguments": {"zone": "CET"}}]'),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Rome"}}; '
                    '{"name": "get_time", "parameters": {"zone": "UTC"}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}, '
                '{"name": "f", "arguments": {"a": [1, 2]}}]'),
    ("hermes", 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'),
]


@pytest.mark.parametrize("fmt, answer", CUT)
def test_an_answer_cut_anywhere_streams_the_calls_it_answers(tokenizer, fmt, answer):
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    out = OutputProcessor(tokenizer, tools=TOOL_PARSERS[fmt]())
    full = [c.arguments for d in [out.push(elements([i])) for i in ids] + [out.finish("eos")] for c in d.tool_calls]
    assert len(full) == 2
    for cut in range(len(ids) + 1):
        deltas, streamed, whole = cut_answer(tokenizer, TOOL_PARSERS[fmt](), ids, cut)
        assert streamed == whole, cut
        # each call's arguments are what the model wrote of them, cut or not
        assert all(full[k].startswith(arguments) for k, (_, _, arguments) in enumerate(whole)), cut
        content = "".join(d.text for d in deltas)
        if whole and fmt != "hermes":  # nothing of a JSON answer that made calls is content, cut or not
            assert content == "", cut
        assert deltas[-1].finish_reason == "length"


def test_a_cut_calls_input_is_read_as_anthropics_sdk_reads_it():
    """A cut call's arguments as an object (Anthropic's tool_use input) against the anthropic SDK's own
    reading of a cut input_json_delta stream (jiter's partial mode), at every character."""
    from jiter import from_json
    texts = ['{"city": "Paris", "unit": "celsius"}', '{"a": [1, 22, {"b": "}]\\"{"}], "c": "Grüße", "d": -1.5e3, '
             '"e": true, "f": null, "g": false}', '{ "x" : [ ] , "y" : { "z": 10.25 } }', '{"s": "\\u00e9t\\u00e9"}']
    for text in texts:
        for k in range(1, len(text) + 1):
            assert ToolCall("f", text[:k]).arguments_dict() == from_json(text[:k].encode(), partial_mode=True), text[:k]


def test_a_calls_input_holds_no_nan_or_infinity():
    """A model may write NaN or Infinity (or a number past float's range) in its arguments: the
    object, which Anthropic's tool_use input carries in a JSON answer, has null there, as
    JavaScript's JSON.stringify writes them (the answer could not be written: a 500)."""
    text = '{"x": NaN, "y": [1e999, -Infinity, 2.5], "z": {"w": Infinity}}'
    for arguments in (text, text[:-2]):  # whole, and cut short
        value = ToolCall("f", arguments).arguments_dict()
        assert json.loads(json.dumps(value, allow_nan=False)) == value
    assert ToolCall("f", text).arguments_dict() == {"x": None, "y": [None, None, 2.5], "z": {"w": None}}
