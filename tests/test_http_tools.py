"""Tool calls and reasoning through `dashinfer serve`, with the official openai client.

The default model (SmolLM2-135M-Instruct, whose template knows no tools: the generic JSON format)
must call a tool when tool_choice forces it, with arguments that parse and satisfy the tool's
JSON schema (checked with jsonschema), whole and streamed; the round trip with the tool's result
answers what the in-process Engine answers for the prompt the chat template renders from the
same conversation. A tiny model whose template opens <think> (Qwen3's convention) answers in
reasoning_content, and with enable_thinking false in content; where </think> is an added token, a
forced call holds from that token. Malformed tools and messages get
400s in OpenAI's shape and the server goes on serving.
"""
import json
import os

import httpx
import jsonschema
import openai
import pytest

from dashinfer_client.frontend.parsers.generic_json import GenericJsonToolParser
from tests.chat_templates import THINK_CHATML
from tests.helpers import tiny_with_template
from tests.http_server import API_KEY, Reference, default_model_dir, serving

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def server(default_server):
    """The default model on one rank (the front end is the same over any engine)."""
    return default_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def _check_calls(calls, names=None):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        assert names is None or call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_tool_call_satisfies_the_schema(client):
    answer = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                            max_tokens=96, temperature=0)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_calls(choice.message.tool_calls)
    assert not choice.message.content


def test_a_named_function_is_the_one_called(client):
    answer = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "What time is it in Tokyo?"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False,
        max_tokens=96, temperature=0)
    calls = answer.choices[0].message.tool_calls
    assert len(calls) == 1
    _check_calls(calls, {"get_time"})


def test_streamed_tool_call_deltas_join_into_valid_json(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                                 max_tokens=96, temperature=0, stream=True))
    calls = {}
    for chunk in chunks:
        for d in chunk.choices[0].delta.tool_calls or ():
            entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = entry["id"] or d.id
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
    assert calls and chunks[-1].choices[0].finish_reason == "tool_calls"
    for entry in calls.values():
        assert entry["id"]
        jsonschema.validate(json.loads(entry["arguments"]), SCHEMAS[entry["name"]])


def test_the_round_trip_answers_as_the_engine_does(client):
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=96, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "18 degrees celsius, sunny"}]
    answer = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=24,
                                            temperature=0)
    # The reference: the model's own chat template (transformers' rendering) over the conversation
    # as a template without tools must see it: the tools described in a system message, the call
    # as the JSON the model writes, the result as a user turn.
    reference = Reference(*os.path.split(default_model_dir()))
    try:
        tokenizer = reference.hf_tokenizer()
        turns = [{"role": "system", "content": GenericJsonToolParser.describe([t["function"] for t in TOOLS])},
                 ASK[0],
                 {"role": "assistant", "content": json.dumps({"name": call.function.name,
                                                              "arguments": json.loads(call.function.arguments)})},
                 {"role": "user", "content": f"Result of {call.function.name}: 18 degrees celsius, sunny"}]
        ids = tokenizer(tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)["input_ids"]
        expected = reference.text(reference.generate(ids, 24)[0])
    finally:
        reference.close()
    assert answer.usage.prompt_tokens == len(ids)
    message = answer.choices[0].message
    if message.tool_calls:  # the answer begins like a call: it came back as calls, as the model wrote them
        assert all(c.function.name in expected and c.function.arguments in expected for c in message.tool_calls)
        if answer.choices[0].finish_reason == "tool_calls":  # whole, not cut by max_tokens: they parse
            _check_calls(message.tool_calls)
    else:
        assert message.content == expected


def test_tool_choice_none_answers_in_text(client):
    answer = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none",
                                            max_tokens=8, temperature=0)
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].finish_reason in ("stop", "length")


def test_a_call_cut_by_max_tokens_streams_what_it_answers_whole(client):
    """max_tokens cuts a forced list of calls before the first call's name, inside its arguments, and
    after it with the next call begun: the stream, as the openai SDK joins its chunks, is the
    unstreamed answer; a cut call is what the model wrote of it, and nothing of a list that made
    calls is content."""
    request = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], temperature=0,
                   tools=[{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}],
                   tool_choice="required", parallel_tool_calls=False)
    answer = client.chat.completions.create(**request, max_tokens=96)
    full = [(c.function.name, c.function.arguments) for c in answer.choices[0].message.tool_calls]
    seen = []
    for max_tokens in range(answer.usage.completion_tokens - 13, answer.usage.completion_tokens, 3):
        whole = client.chat.completions.create(**request, max_tokens=max_tokens).choices[0]
        with client.chat.completions.stream(**request, max_tokens=max_tokens) as stream:
            for _ in stream:
                pass
            joined = stream.current_completion_snapshot.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or ()]
        assert [(c.function.name, c.function.arguments) for c in joined.message.tool_calls or ()] == calls
        assert (joined.message.content or "") == (whole.message.content or "")
        assert whole.finish_reason == joined.finish_reason == "length"
        assert all(name == f[0] and f[1].startswith(arguments) for (name, arguments), f in zip(calls, full))
        assert not (calls and whole.message.content), whole.message
        seen.append(calls)
    # the cuts fell before a name went out (content), inside the arguments and after the first call
    assert [] in seen and [full[0]] in seen and any(c and c[0] != full[0] for c in seen), seen


@pytest.mark.parametrize("patch, words", [
    ({"tools": {"type": "function"}}, ["tools"]),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, ["tools[0]"]),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, ["nope"]),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, ["tool_choice"]),
    ({"tool_choice": "required"}, ["tools"]),
    ({"tools": [WEATHER, WEATHER]}, ["unique"]),
    ({"messages": ASK + [{"role": "tool", "content": "18"}]}, ["tool_call_id"]),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]},
     ["arguments"]),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, ["role"]),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, ["response_format"]),
], ids=["tools-not-list", "no-name", "unknown-choice", "bad-choice", "choice-without-tools", "duplicate",
        "tool-without-id", "bad-arguments", "bad-role", "with-response-format"])
def test_malformed_tools_and_messages_are_400s(server, client, patch, words):
    body = dict({"model": "tiny", "messages": ASK, "max_tokens": 4}, **patch)
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                   timeout=120)
    error = r.json()["error"]
    assert r.status_code == 400 and set(error) == {"message", "type", "param", "code"}, r.text
    assert error["type"] == "invalid_request_error" and all(w in error["message"] for w in words), error
    assert client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2).usage.completion_tokens > 0


# ---- reasoning, on a tiny model whose template opens <think> ----------------------------------

@pytest.fixture(scope="module")
def think_model(tmp_path_factory):
    return tiny_with_template(tmp_path_factory, "think", THINK_CHATML)[1]


@pytest.fixture(scope="module")
def think_server(think_model, tmp_path_factory):
    with serving(think_model, str(tmp_path_factory.mktemp("think-serve") / "serve.log")) as s:
        yield s


def test_reasoning_comes_back_apart_and_follows_enable_thinking(think_model, think_server):
    client = openai.OpenAI(base_url=think_server.url + "/v1", api_key="none", max_retries=0)
    reference = Reference(think_model)
    tokenizer = reference.hf_tokenizer()
    try:
        for thinking in (True, False):
            text = tokenizer.apply_chat_template(ASK, tokenize=False, add_generation_prompt=True,
                                                 enable_thinking=thinking)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            expected = reference.text(reference.generate(ids, 16)[0])
            assert "</think>" not in expected  # a random model: the answer stays in the reasoning
            kwargs = dict(model="tiny", messages=ASK, max_tokens=16, temperature=0,
                          extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
            whole = client.chat.completions.create(**kwargs).choices[0].message
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            streamed = {key: "".join(getattr(c.choices[0].delta, key, None) or "" for c in chunks)
                        for key in ("content", "reasoning_content", "reasoning")}
            got = getattr(whole, "reasoning_content", None) or "", whole.content or ""
            want = (expected, "") if thinking else ("", expected)
            assert got == want and (streamed["reasoning_content"], streamed["content"]) == want
            # vLLM's newer name beside it, whole and streamed
            assert (getattr(whole, "reasoning", None) or "", streamed["reasoning"]) == (want[0], want[0])
            # Anthropic's thinking config: enabled / disabled, and adaptive, the model's choice: the
            # template's default (this one's thinks)
            for config in ([{"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"}] if thinking else
                           [{"type": "disabled"}]):
                message = httpx.post(think_server.url + "/v1/messages", json={
                    "model": "tiny", "max_tokens": 16, "messages": ASK, "temperature": 0, "thinking": config}).json()
                block = "thinking" if thinking else "text"
                assert [(b["type"], b.get(block)) for b in message["content"]] == [(block, expected)], config
            # OpenAI's reasoning_effort "none": thinking off, unless enable_thinking says otherwise
            for effort, template_kwargs in (("none", {}), ("none", {"enable_thinking": True}), ("minimal", {})):
                if template_kwargs.get("enable_thinking", effort != "none") == thinking:
                    message = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=16, temperature=0,
                                                             reasoning_effort=effort,
                                                             extra_body={"chat_template_kwargs": template_kwargs})
                    got = getattr(message.choices[0].message, "reasoning_content", None) or "", \
                        message.choices[0].message.content or ""
                    assert got == want, (effort, template_kwargs)
    finally:
        reference.close()


def test_a_bare_request_samples_as_the_model_card_says(client):
    """SmolLM2-135M-Instruct's model card samples with temperature 0.2 and top_p 0.9; its GGUF holds
    no sampling settings, so the default model's conversion carries those: a request that names
    no sampling option answers what one naming them answers, seed for seed."""
    [model] = client.models.list().data
    assert model.model_dump()["sampling_defaults"] == {"temperature": 0.2, "top_p": 0.9, "top_k": 0}
    ask = dict(model="tiny", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=24)
    bare = [client.chat.completions.create(**ask, seed=s).choices[0].message.content for s in (1, 2, 3)]
    card = [client.chat.completions.create(**ask, seed=s, temperature=0.2, top_p=0.9, extra_body={"top_k": 0})
            .choices[0].message.content for s in (1, 2, 3)]
    assert bare == card


def test_a_constrained_answer_reasons_first_where_the_prompt_opened_it(think_model, think_server):
    """A template that opens <think> in the prompt (QwQ's, DeepSeek-R1's, Qwen3-Thinking's) has the
    answer start inside the reasoning: a forced call or a response_format constrains the answer only
    after </think> (as vLLM does), so the reasoning is the model's own. This random model never
    closes it: the reasoning is what it writes unconstrained (the in-process engine's, from the
    prompt /tokenize reads), whole and streamed. Its bytes past ASCII and its special tokens are
    banned, as a grammar's free text is UTF-8 text (a real model's is; this one's bytes are not)."""
    client = openai.OpenAI(base_url=think_server.url + "/v1", api_key="none", max_retries=0)
    city = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
    reference = Reference(think_model)
    try:
        tokenizer = reference.hf_tokenizer()
        ascii_only = {i: -100 for i in range(reference.loader.config.vocab_size)  # padding ids included
                      if tokenizer.decode([i]) in ("", "\ufffd") or i in tokenizer.all_special_ids}
        for constraint in (dict(tools=[city], tool_choice="required"),
                           dict(response_format={"type": "json_object"})):
            ids = httpx.post(think_server.url + "/tokenize", json=dict(messages=ASK, **constraint)).json()["tokens"]
            expected = reference.text(reference.generate(ids, 16, logit_bias=ascii_only)[0])
            assert "</think>" not in expected and len(expected) == 16
            request = dict(model="tiny", messages=ASK, max_tokens=16, temperature=0, logit_bias=ascii_only,
                           **constraint)
            choice = client.chat.completions.create(**request).choices[0]
            assert (choice.message.reasoning_content, choice.message.tool_calls) == (expected, None)
            assert choice.finish_reason == "length"
            chunks = [c.choices[0] for c in client.chat.completions.create(**request, stream=True) if c.choices]
            assert "".join(getattr(c.delta, "reasoning_content", None) or "" for c in chunks) == expected
    finally:
        reference.close()


@pytest.fixture(scope="module")
def think_token_server(tmp_path_factory):
    """A template that opens <think>, on a tokenizer with <think> and </think> as added tokens that
    are not special (QwQ's, DeepSeek-R1 distills', Qwen3-Thinking's): the model ends its reasoning
    by writing the </think> token."""
    _, out = tiny_with_template(tmp_path_factory, "think-token", THINK_CHATML, extra_added=("<think>", "</think>"))
    with serving(out, str(tmp_path_factory.mktemp("think-token-serve") / "serve.log"), tp=1) as s:
        yield s


def test_a_constrained_answer_holds_from_the_end_of_reasoning_token(think_token_server):
    """The </think> token stays the model's to write while it reasons (the grammar's free text ended
    at the text </think>, which masked the token out: the reasoning never ended, no call came); the
    call is constrained from it on. The model is pushed to close at once (logit_bias)."""
    client = openai.OpenAI(base_url=think_token_server.url + "/v1", api_key="none", max_retries=0)
    end = httpx.post(think_token_server.url + "/tokenize", json={"prompt": "</think>", "add_special_tokens": False})
    [end] = end.json()["tokens"]
    city = {"type": "object", "properties": {"city": {"type": "string", "minLength": 2, "maxLength": 8}},
            "required": ["city"], "additionalProperties": False}
    request = dict(model="tiny", messages=ASK, max_tokens=96, temperature=0, logit_bias={str(end): 100},
                   tools=[{"type": "function", "function": {"name": "get_weather", "parameters": city}}],
                   tool_choice="required", parallel_tool_calls=False)
    choice = client.chat.completions.create(**request).choices[0]
    [call] = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), city)
    assert not getattr(choice.message, "reasoning_content", None) and choice.finish_reason == "tool_calls"
    chunks = [c.choices[0] for c in client.chat.completions.create(**request, stream=True) if c.choices]
    pieces = [p for c in chunks for p in c.delta.tool_calls or ()]
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert not "".join(getattr(c.delta, "reasoning_content", None) or "" for c in chunks)
