"""Tool calls streamed as the model writes them, through `dashinfer serve`, with the official openai
and anthropic clients: a tiny model whose chat template speaks Qwen2.5 / Hermes' <tool_call> format
is forced to call (tool_choice required / any) a function whose arguments are long. The pieces of
a streamed call (OpenAI's function.arguments deltas, Anthropic's input_json_delta) join into
exactly the arguments the same request answers unstreamed (greedy: the same tokens), which satisfy
the schema. How many pieces come is timing: the server sends whatever tokens have arrived at each
wake, and a reader that lags a fast model gets them whole (CI saw one piece); that the parser
hands out arguments token by token as they are written is test_output_parsers'
test_calls_stream_arguments_as_written."""
import json

import anthropic
import jsonschema
import openai
import pytest

from dashinfer_client.lark_text import lark_text
from dashinfer_client.tokenizer import Tokenizer, added_tokens
from tests.chat_templates import (GLM45, GLM45_ADDED, GLM45_SPECIAL, GRANITE, GRANITE_TOKENS, HERMES_CHATML,
                                  MINIMAX_ADDED, MINIMAX_M2, MINIMAX_SPECIAL, MISTRAL, MISTRAL_TOKENS, QWEN3_CODER)
from tests.helpers import tiny_with_template
from tests.http_server import serving

SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "minLength": 12, "maxLength": 12},
                                           "body": {"type": "string", "minLength": 48, "maxLength": 48}},
          "required": ["title", "body"], "additionalProperties": False}
NOTE = {"type": "function", "function": {"name": "write_note", "description": "Write a note down",
                                         "parameters": SCHEMA}}
ASK = [{"role": "user", "content": "Note that the meeting moved to Friday."}]


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory):
    _, out = tiny_with_template(tmp_path_factory, "hermes", HERMES_CHATML)
    with serving(out, str(tmp_path_factory.mktemp("hermes-serve") / "serve.log")) as s:
        yield s


def test_openai_stream_joins_into_the_unstreamed_arguments(hermes_server):
    client = openai.OpenAI(base_url=hermes_server.url + "/v1", api_key="none", max_retries=0)
    request = dict(model="tiny", messages=ASK, tools=[NOTE], tool_choice="required", parallel_tool_calls=False,
                   max_tokens=256, temperature=0)
    whole = client.chat.completions.create(**request)
    [call] = whole.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)

    chunks = list(client.chat.completions.create(**request, stream=True))
    pieces = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    first, rest = pieces[0], pieces[1:]
    assert first.index == 0 and first.id and first.type == "function" and first.function.name == "write_note"
    assert all(p.index == 0 and p.id is None and p.function.name is None for p in rest)  # OpenAI's shape
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"


def test_anthropic_stream_joins_into_the_unstreamed_input(hermes_server):
    client = anthropic.Anthropic(base_url=hermes_server.url, api_key="none", max_retries=0)
    request = dict(model="tiny", max_tokens=256, extra_body={"temperature": 0}, messages=ASK,
                   tool_choice={"type": "any", "disable_parallel_tool_use": True},
                   tools=[{"name": "write_note", "description": "Write a note down", "input_schema": SCHEMA}])
    whole = client.messages.create(**request)
    uses = [b for b in whole.content if b.type == "tool_use"]
    assert uses
    for use in uses:
        jsonschema.validate(use.input, SCHEMA)

    events = list(client.messages.create(**request, stream=True))
    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert [(s.content_block.name, s.content_block.input) for s in starts] == [("write_note", {})] * len(uses)
    for start, use in zip(starts, uses):
        partial = [e.delta.partial_json for e in events if e.type == "content_block_delta"
                   and e.index == start.index and e.delta.type == "input_json_delta"]
        assert partial  # the input streamed as input_json_delta events (how many: see the docstring)
        assert json.loads("".join(partial)) == use.input
    assert [e.delta.stop_reason for e in events if e.type == "message_delta"] == [whole.stop_reason] == ["tool_use"]


# A file write as Qwen3-Coder's and Granite's templates offer it: a text value and an integer one (the
# XML format writes the integer as text and reads it back by the schema's type).
WRITE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "minLength": 4, "maxLength": 16},
                                                 "mode": {"type": "integer", "minimum": 0, "maximum": 777}},
                "required": ["path", "mode"], "additionalProperties": False}
WRITE = {"type": "function", "function": {"name": "write_file", "description": "Write a file",
                                          "parameters": WRITE_SCHEMA}}
UNDO_SCHEMA = {"type": "object", "properties": {"steps": {"enum": [1, 2]}}, "required": ["steps"],
               "additionalProperties": False}
UNDO = {"type": "function", "function": {"name": "undo", "parameters": UNDO_SCHEMA}}


# Each family's markers as its tokenizer has them: special tokens (Granite's, Mistral's, GLM's and MiniMax's
# roles), added tokens that are not special (Qwen's <tool_call> and </tool_call>, GLM's call tags, MiniMax's
# block tags); (name, template, special, added, marker, the server's own flags). MiniMax's template opens
# <think> in every prompt (no switch turns it off), where a random model would reason until max_tokens:
# its server reads no reasoning (--reasoning-parser none), so the forced call starts the answer.
QWEN_ADDED = ("<tool_call>", "</tool_call>")
FAMILIES = [("qwen3-coder", QWEN3_CODER, (), QWEN_ADDED, "<tool_call>", ()),
            ("glm45", GLM45, GLM45_SPECIAL, GLM45_ADDED, "<tool_call>", ()),
            ("minimax-m2", MINIMAX_M2, MINIMAX_SPECIAL, MINIMAX_ADDED, "<minimax:tool_call>",
             ("--reasoning-parser", "none")),
            ("granite", GRANITE, GRANITE_TOKENS, (), "<|tool_call|>", ()),
            ("qwen-hermes", HERMES_CHATML, (), QWEN_ADDED, "<tool_call>", ()),
            ("mistral", MISTRAL, MISTRAL_TOKENS, (), "[TOOL_CALLS]", ())]


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda p: p[0])
def format_server(tmp_path_factory, request):
    name, template, special, added, marker, flags = request.param
    _, out = tiny_with_template(tmp_path_factory, name, template, extra_special=special, extra_added=added)
    # the byte-level test tokenizer spends a token a byte on the templates' tool listings
    with serving(out, str(tmp_path_factory.mktemp(name + "-serve") / "serve.log"), "--max-model-len", "2048",
                 *flags, tp=1) as s:
        yield s, marker


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "write_file"}}])
def test_a_forced_call_in_the_family_format_streams_what_it_answers_whole(format_server, tool_choice):
    """Even a random model writes a call in the template's own format when the grammar forces one,
    beginning with its marker token, as the family's models were trained to write it (a marker that is
    a special or added token, spelled as text in the grammar, was refused by llguidance: no call): its
    arguments meet the schema (the XML values read back by type), and the stream joins into them."""
    server, marker = format_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    # thinking off: GLM's template would let the model reason before the call (the others read no such option)
    request = dict(model="tiny", messages=ASK, tools=[WRITE, UNDO], tool_choice=tool_choice,
                   parallel_tool_calls=False, max_tokens=200, temperature=0, logprobs=True,
                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    whole = client.chat.completions.create(**request)
    assert whole.choices[0].logprobs.content[0].token == marker  # one token: the marker's own
    [call] = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and not whole.choices[0].message.content
    schema = UNDO_SCHEMA if call.function.name == "undo" else WRITE_SCHEMA
    jsonschema.validate(json.loads(call.function.arguments), schema)
    assert isinstance(tool_choice, str) or call.function.name == "write_file"

    chunks = list(client.chat.completions.create(**request, stream=True))
    pieces = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert pieces[0].function.name == call.function.name and pieces[0].id
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.fixture(scope="module")
def granite_server(tmp_path_factory):
    _, out = tiny_with_template(tmp_path_factory, "granite-think", GRANITE, extra_special=GRANITE_TOKENS)
    with serving(out, str(tmp_path_factory.mktemp("granite-think-serve") / "serve.log"), tp=1) as s:
        yield s


def test_granite_thinking_comes_back_as_reasoning_and_content_without_its_wrapper(granite_server):
    """Granite 3.3 asked to think (chat_template_kwargs thinking) answers <think>...</think><response>...
    </response>: the reasoning comes back as reasoning_content and the response as content without its
    tags (they stayed in the content), whole and streamed. The answer is pinned by a grammar."""
    client = openai.OpenAI(base_url=granite_server.url + "/v1", api_key="none", max_retries=0)
    pinned = 'start: "<think>The user asks for a sum.</think><response>2 + 2 is <b>4</b>.</response>"'
    request = dict(model="tiny", messages=ASK, max_tokens=96, temperature=0, extra_body={
        "chat_template_kwargs": {"thinking": True}}, response_format={"type": "grammar", "grammar": pinned})
    expected = ("The user asks for a sum.", "2 + 2 is <b>4</b>.")
    message = client.chat.completions.create(**request).choices[0].message
    assert (message.reasoning_content, message.content) == expected
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**request, stream=True) if c.choices]
    assert ("".join(getattr(d, "reasoning_content", None) or "" for d in deltas),
            "".join(d.content or "" for d in deltas)) == expected


# Answers as GLM-4.5's and MiniMax-M2's templates write calls, their tags the families' added tokens:
# GLM's reasoning, then a call; MiniMax's reasoning inside the <think> the prompt opened, its close,
# then a block of two invokes. Each has a string value that looks like a number and integer ones.
GLM_ANSWER = ("<think>The user wants a file.</think>\n<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>0755"
              "</arg_value>\n<arg_key>mode</arg_key>\n<arg_value>420</arg_value>\n</tool_call>")
MINIMAX_ANSWER = ('The user wants a file.\n</think>\n\n<minimax:tool_call>\n<invoke name="write_file">\n'
                  '<parameter name="path">0755</parameter>\n<parameter name="mode">420</parameter>\n</invoke>\n'
                  '<invoke name="undo">\n<parameter name="steps">2</parameter>\n</invoke>\n</minimax:tool_call>')
WRITTEN = ("write_file", '{"path": "0755", "mode": 420}')
# family -> (template, its special and added tokens, the answer, its reasoning, its calls)
PINNED = {"glm45": (GLM45, GLM45_SPECIAL, GLM45_ADDED, GLM_ANSWER, "The user wants a file.", [WRITTEN]),
          "minimax_m2": (MINIMAX_M2, MINIMAX_SPECIAL, MINIMAX_ADDED, MINIMAX_ANSWER, "The user wants a file.\n",
                         [WRITTEN, ("undo", '{"steps": 2}')])}


@pytest.fixture(scope="module", params=PINNED)
def pinned_server(request, tmp_path_factory):
    template, special, added, *answer = PINNED[request.param]
    hf_dir, out = tiny_with_template(tmp_path_factory, f"{request.param}-auto", template, extra_special=special,
                                     extra_added=added)
    with serving(out, str(tmp_path_factory.mktemp(f"{request.param}-auto-serve") / "serve.log"), "--max-model-len",
                 "2048", tp=1) as s:
        yield s, added_tokens(Tokenizer(hf_dir)), *answer


def test_a_pinned_answer_comes_back_as_reasoning_and_calls_typed_by_the_schema(pinned_server):
    """tool_choice auto: the family's answer (pinned by a grammar, its tags as their tokens) comes back
    as reasoning_content (the template's reasoning parser) and calls whose arguments are the values
    read by the schema (path a string, though it looks like a number; mode and steps integers), with no
    content, whole and streamed (each call's pieces joining into its arguments)."""
    server, added, answer, reasoning, calls = pinned_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    request = dict(model="tiny", messages=ASK, tools=[WRITE, UNDO], max_tokens=300, temperature=0,
                   response_format={"type": "grammar", "grammar": f"start: {lark_text(answer, added)}"})
    choice = client.chat.completions.create(**request).choices[0]
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == calls
    assert choice.message.reasoning_content == reasoning and not choice.message.content
    assert choice.finish_reason == "tool_calls"

    chunks = list(client.chat.completions.create(**request, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    pieces = [p for d in deltas for p in d.tool_calls or ()]
    assert [(p.index, p.function.name) for p in pieces if p.id] == [(i, name) for i, (name, _) in enumerate(calls)]
    for i, (_, arguments) in enumerate(calls):
        assert "".join(p.function.arguments or "" for p in pieces if p.index == i) == arguments
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == reasoning
    assert not "".join(d.content or "" for d in deltas) and chunks[-1].choices[0].finish_reason == "tool_calls"
