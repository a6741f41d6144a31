"""OpenAI's Responses API of `dashinfer serve`, through the official openai client: an answer is the
chat route's greedy answer for the same conversation (instructions as its system message, input items
as its messages, a function_call / function_call_output round trip as its tool_calls and tool
messages: the same prompt length as /tokenize counts and the same answer), forced function calls
satisfy their schema, text.format's json_schema holds, max_output_tokens makes the response
incomplete, a <think> template's reasoning comes back as a reasoning item, the streamed events (read
by the client's stream helper) end in the response the same request answers whole, and malformed or
stateful bodies are 400s in OpenAI's error shape with the server still serving.
"""
import json

import httpx
import jsonschema
import openai
import pytest

from dashinfer_client.frontend import Delta
from dashinfer_client.frontend.parsers.base import ToolCallPart
from dashinfer_server.http.responses_api import _Items
from tests.chat_templates import THINK_CHATML
from tests.helpers import tiny_with_template
from tests.http_server import API_KEY, serving

SYSTEM = "You are a concise assistant."
ASK = [{"role": "user", "content": "What is the capital of France?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": CITY, "strict": True}
TIME = {"type": "function", "name": "get_time", "description": "Get the current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
        "strict": False}
# The same tools as the chat route takes them (strict changes nothing here: forced calls always follow the schema).
CHAT_TOOLS = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
              for t in (WEATHER, TIME)]


@pytest.fixture(scope="module")
def client(default_server):
    return openai.OpenAI(base_url=default_server.url + "/v1", api_key=API_KEY, max_retries=0)


def _summary(response):
    """What a response says, without the ids each request draws."""
    items = []
    for o in response.output:
        if o.type == "function_call":
            items.append((o.type, o.status, o.name, o.arguments))
        else:
            items.append((o.type, o.status, [c.text for c in o.content or ()]))
    reason = response.incomplete_details.reason if response.incomplete_details else None
    return response.status, reason, items, response.usage.input_tokens, response.usage.output_tokens


def _count(server, **chat_body) -> int:
    """The prompt tokens of a chat body, as /tokenize counts them."""
    return httpx.post(server.url + "/tokenize", json=chat_body, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=60).json()["count"]


def _streamed(client, **request):
    """(the final response, the events) of the request streamed through the client's helper; an
    incomplete response ends with response.incomplete, which carries it."""
    with client.responses.stream(**request) as stream:
        events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type in ("response.completed", "response.incomplete")
    return events[-1].response, events


def test_the_answer_is_the_chat_routes(client):
    """instructions are the system message; a string input, message items with content parts and a
    developer message say what the chat route's messages say, and the answer is its greedy one."""
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "system", "content": SYSTEM}] + ASK,
                                          max_tokens=24, temperature=0)
    expected = chat.choices[0].message.content
    as_parts = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the "},
                                                               {"type": "input_text", "text": "capital of France?"}]}]
    for request in (dict(instructions=SYSTEM, input=ASK[0]["content"]), dict(instructions=SYSTEM, input=as_parts),
                    dict(input=[{"role": "developer", "content": SYSTEM}] + ASK)):
        response = client.responses.create(model="tiny", max_output_tokens=24, temperature=0, **request)
        assert response.object == "response" and response.id.startswith("resp_") and response.model == "tiny"
        assert response.output_text == expected and [o.type for o in response.output] == ["message"]
        assert response.usage.input_tokens == chat.usage.prompt_tokens
        assert response.usage.output_tokens == chat.usage.completion_tokens
        assert response.usage.total_tokens == chat.usage.total_tokens
        assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert response.instructions is None and response.temperature == 0 and response.max_output_tokens == 24


def test_forced_calls_follow_the_schema_and_round_trip_as_chat_messages(default_server, client):
    response = client.responses.create(model="tiny", input="What is the weather in Paris?", tools=[WEATHER, TIME],
                                       tool_choice="required", max_output_tokens=96, temperature=0)
    calls = [o for o in response.output if o.type == "function_call"]
    assert calls and response.status == "completed" and response.output_text == ""
    for call in calls:
        assert call.status == "completed" and call.id.startswith("fc_") and call.call_id
        schema = {"get_weather": CITY, "get_time": TIME["parameters"]}[call.name]
        jsonschema.validate(json.loads(call.arguments), schema)
    named = client.responses.create(model="tiny", input="What time is it in Tokyo?", tools=[WEATHER, TIME],
                                    tool_choice={"type": "function", "name": "get_time"}, parallel_tool_calls=False,
                                    max_output_tokens=96, temperature=0)
    assert [o.name for o in named.output] == ["get_time"] and named.parallel_tool_calls is False
    jsonschema.validate(json.loads(named.output[0].arguments), TIME["parameters"])
    # the calls and their results sent back, as the Agents SDK sends them: the prompt the chat route
    # reads for the same conversation (/tokenize counts it), and its answer
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    items = ask + [c.model_dump(exclude_none=True) for c in calls] + \
        [{"type": "function_call_output", "call_id": c.call_id, "output": "18 degrees celsius, sunny"} for c in calls]
    past = [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls]
    messages = ask + [{"role": "assistant", "content": None, "tool_calls": past}] + \
        [{"role": "tool", "tool_call_id": c.call_id, "content": "18 degrees celsius, sunny"} for c in calls]
    answer = client.responses.create(model="tiny", input=items, tools=[WEATHER, TIME], tool_choice="none",
                                     max_output_tokens=24, temperature=0)
    count = _count(default_server, messages=messages, tools=CHAT_TOOLS, tool_choice="none")
    chat = client.chat.completions.create(model="tiny", messages=messages, tools=CHAT_TOOLS, tool_choice="none",
                                          max_tokens=24, temperature=0)
    assert answer.usage.input_tokens == count == chat.usage.prompt_tokens
    assert answer.output_text == chat.choices[0].message.content
    # an assistant's text before its calls is the same assistant message, not one of its own
    items = ask + [{"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]}] + items[1:]
    messages[1]["content"] = "Let me look."
    count = _count(default_server, messages=messages, tools=CHAT_TOOLS)
    assert client.responses.create(model="tiny", input=items, tools=[WEATHER, TIME], max_output_tokens=1,
                                   temperature=0).usage.input_tokens == count


def test_a_refusal_sent_back_is_what_the_assistant_said(default_server, client):
    """OpenAI's answers hold refusal parts; a history from there, sent back, reads as the text."""
    ask = [{"role": "user", "content": "Tell me a secret."}]
    refused = {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't share that."}]}
    messages = ask + [{"role": "assistant", "content": "I can't share that."}, {"role": "user", "content": "Why?"}]
    response = client.responses.create(model="tiny", input=ask + [refused, messages[-1]], max_output_tokens=1)
    assert response.usage.input_tokens == _count(default_server, messages=messages)


def test_json_schema_format_holds(client):
    schema = {"type": "object", "properties": {"capital": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["capital", "population"], "additionalProperties": False}
    response = client.responses.create(model="tiny", input=ASK, max_output_tokens=96, temperature=0,
                                       text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                                        "strict": True}})
    assert response.status == "completed" and response.text.format.type == "json_schema"
    jsonschema.validate(json.loads(response.output_text), schema)
    free = client.responses.create(model="tiny", input=ASK, max_output_tokens=32, temperature=0,
                                   text={"format": {"type": "json_object"}})
    chat = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=32, temperature=0,
                                          response_format={"type": "json_object"})
    assert free.output_text == chat.choices[0].message.content and free.output_text.startswith("{")


def test_max_output_tokens_makes_it_incomplete(client):
    response = client.responses.create(model="tiny", input=ASK, max_output_tokens=3, temperature=0)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.output[0].status == "incomplete"
    late = client.responses.create(model="tiny", input=ASK, temperature=0, extra_body={"timeout": 0.001})
    assert late.status == "incomplete" and late.incomplete_details.reason == "timeout"
    # a call cut inside its arguments is an incomplete function_call item holding what was written
    request = dict(model="tiny", input=ASK, tools=[WEATHER], tool_choice="required", temperature=0)
    full = client.responses.create(**request, max_output_tokens=96).output[0]
    cuts = [client.responses.create(**request, max_output_tokens=n) for n in range(12, 20, 2)]
    assert all(c.status == "incomplete" for c in cuts)
    calls = [c.output[-1] for c in cuts if c.output[-1].type == "function_call"]
    assert calls and all(c.status == "incomplete" and full.arguments.startswith(c.arguments) for c in calls)


@pytest.mark.parametrize("request_", [
    dict(instructions=SYSTEM, input=ASK, max_output_tokens=24),
    dict(input=ASK, max_output_tokens=3),
    dict(input="Weather in Paris and in Rome?", tools=[WEATHER], tool_choice="required", max_output_tokens=64),
    dict(input="Weather in Paris and in Rome?", tools=[WEATHER], tool_choice="required", max_output_tokens=12),
], ids=["text", "incomplete", "calls", "cut-call"])
def test_the_stream_ends_in_the_whole_response(client, request_):
    whole = client.responses.create(model="tiny", temperature=0, **request_)
    final, events = _streamed(client, model="tiny", temperature=0, **request_)
    assert _summary(final) == _summary(whole)
    assert events[-1].type == ("response.completed" if whole.status == "completed" else "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    for index, item in enumerate(final.output):  # each item added, then done, as the final response has it
        added = [e for e in events if e.type == "response.output_item.added" and e.output_index == index]
        done = [e for e in events if e.type == "response.output_item.done" and e.output_index == index]
        assert len(added) == len(done) == 1 and added[0].item.id == done[0].item.id == item.id
        if item.type == "function_call":
            pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"
                      and e.item_id == item.id]
            assert "".join(pieces) == item.arguments == done[0].item.arguments


@pytest.mark.parametrize("patch, words, param", [
    ({"surprise": 1}, ["surprise"], "surprise"),
    ({"previous_response_id": "resp_123"}, ["previous_response_id", "keeps none"], "previous_response_id"),
    ({"conversation": "conv_123"}, ["conversation"], "conversation"),
    ({"background": True}, ["background"], "background"),
    ({"tools": [WEATHER, {"type": "web_search"}]}, ["web_search", "function"], "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, ["tool_choice"], "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, ["nope"], "tool_choice"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, ["input_image"], "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, ["item_reference"], "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]}, ["arguments"], "input"),
    ({"input": []}, ["input"], "input"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, ["json_schema"], "text"),
    ({"max_output_tokens": 0}, ["max_output_tokens"], "max_output_tokens"),
    ({"truncation": "auto"}, ["truncation"], "truncation"),
    ({"include": ["message.output_text.logprobs"]}, ["include"], "include"),
    ({"include": [{"not": "a string"}]}, ["include"], "include"),
    ({"tools": [{"type": "function", "parameters": CITY}]}, ["tools[0]", "name"], "tools"),
    ({"reasoning": {"effort": "extreme"}}, ["reasoning.effort"], "reasoning"),
    ({"temperature": -1}, ["temperature"], None),
], ids=["unknown", "previous-response", "conversation", "background", "hosted-tool", "choice-no-name",
        "choice-unknown-name", "image", "item-reference", "bad-arguments", "empty-input", "schema-missing",
        "no-tokens", "truncation", "include-logprobs", "include-object", "tool-without-name", "effort",
        "temperature"])
def test_malformed_or_stateful_bodies_are_400s(default_server, client, patch, words, param):
    body = dict({"model": "tiny", "input": ASK, "max_output_tokens": 4}, **patch)
    r = httpx.post(default_server.url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                   timeout=120)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", error
    assert all(w in error["message"] for w in words) and (param is None or error["param"] == param), error
    with pytest.raises(openai.BadRequestError):  # the client reads it as OpenAI's
        client.responses.create(model="tiny", input=ASK, max_output_tokens=4, extra_body=patch)
    assert client.responses.create(model="tiny", input=ASK, max_output_tokens=2).usage.output_tokens > 0


def test_store_is_taken_and_nothing_is_kept(client):
    """store (true in OpenAI's default) is taken as vLLM without its store takes it: the response
    says it was not stored; metadata and user come back as sent."""
    kept = client.responses.create(model="tiny", input=ASK, max_output_tokens=2, store=True, metadata={"k": "v"},
                                   user="u-1")
    assert kept.usage.output_tokens > 0 and kept.store is False and kept.metadata == {"k": "v"} and kept.user == "u-1"


def test_usage_counts_the_prompt_tokens_the_prefix_cache_gave(client):
    """The same long input again: its whole blocks come from the prefix cache (the server's log line
    counts them too), whole or streamed."""
    request = dict(model="tiny", input="What is the capital of France? " * 30, max_output_tokens=2, temperature=0)
    client.responses.create(**request)
    again = client.responses.create(**request).usage
    streamed = _streamed(client, **request)[0].usage
    assert 0 < again.input_tokens_details.cached_tokens < again.input_tokens
    assert streamed.input_tokens_details.cached_tokens == again.input_tokens_details.cached_tokens


def test_the_key_and_the_model_are_checked(default_server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=default_server.url + "/v1", api_key="wrong", max_retries=0).responses.create(
            model="tiny", input="hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=default_server.url + "/v1", api_key=API_KEY, max_retries=0).responses.create(
            model="gpt-nope", input="hi", max_output_tokens=2)


def test_the_rest_of_an_open_call_goes_to_it_before_the_text_of_the_same_step():
    """A step that ends a call and writes text after it (a hermes answer's trailing text): the
    call's last arguments join the call, the text a message after it (no process: the items alone)."""
    items = _Items()
    list(items.add(Delta(tool_call_parts=[ToolCallPart("call_1", "get_weather", '{"city": ', 0)])))
    events = list(items.add(Delta(text="Done.", tool_call_parts=[ToolCallPart("call_1", None, '"Paris"}', 0)])))
    list(items.finish(Delta(finish_reason="tool_calls")))
    assert [(o["type"], o["status"], o.get("arguments") or o["content"][0]["text"]) for o in items.output] == \
        [("function_call", "completed", '{"city": "Paris"}'), ("message", "completed", "Done.")]
    assert [kind for kind, _ in events][:2] == ["response.function_call_arguments.delta",
                                                 "response.function_call_arguments.done"]


# ---- reasoning, on a tiny model whose template opens <think> ----------------------------------

@pytest.fixture(scope="module")
def think_server(tmp_path_factory):
    model = tiny_with_template(tmp_path_factory, "think", THINK_CHATML)[1]
    with serving(model, str(tmp_path_factory.mktemp("think-serve") / "serve.log"), tp=1) as s:
        yield s


def test_reasoning_comes_back_as_a_reasoning_item(think_server):
    """The random model never closes </think>: its answer is all reasoning, as the chat route's
    reasoning_content says, whole and streamed; with thinking off it is the message."""
    client = openai.OpenAI(base_url=think_server.url + "/v1", api_key="none", max_retries=0)
    chat = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=16, temperature=0)
    reasoning = chat.choices[0].message.reasoning_content
    assert reasoning and not chat.choices[0].message.content
    request = dict(model="tiny", input=ASK, max_output_tokens=16, temperature=0, reasoning={"effort": "low"})
    whole = client.responses.create(**request)
    assert [o.type for o in whole.output] == ["reasoning"] and whole.output_text == ""
    item = whole.output[0]
    assert item.id.startswith("rs_") and item.summary == [] and [c.text for c in item.content] == [reasoning]
    assert whole.status == "incomplete" and whole.reasoning.effort == "low"
    final, events = _streamed(client, **request)
    assert _summary(final) == _summary(whole)
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    off = client.responses.create(**request, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    plain = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=16, temperature=0,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert [o.type for o in off.output] == ["message"] and off.output_text == plain.choices[0].message.content


def test_usage_counts_reasoning_and_cached_prompt_tokens_in_each_apis_words(think_server):
    """The random model never closes </think>: every token it writes is reasoning, as chat's
    completion_tokens_details, the Responses API's output_tokens_details and Anthropic's thinking_tokens
    each say (streamed too); with thinking off none is. A prompt asked again comes from the prefix
    cache: OpenAI counts that share within prompt_tokens, Anthropic apart from input_tokens."""
    import anthropic
    client = openai.OpenAI(base_url=think_server.url + "/v1", api_key="none", max_retries=0)
    chat = dict(model="tiny", messages=ASK, max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**chat).usage
    assert whole.completion_tokens == whole.completion_tokens_details.reasoning_tokens == 16
    streamed = [c.usage for c in client.chat.completions.create(**chat, stream=True,
                                                                stream_options={"include_usage": True}) if c.usage]
    assert [u.completion_tokens_details.reasoning_tokens for u in streamed] == [16]
    assert 0 < streamed[0].prompt_tokens_details.cached_tokens < streamed[0].prompt_tokens  # asked before
    off = client.chat.completions.create(**chat, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.usage.completion_tokens == 16 and off.usage.completion_tokens_details.reasoning_tokens == 0
    response = client.responses.create(model="tiny", input=ASK, max_output_tokens=16, temperature=0).usage
    assert response.output_tokens == response.output_tokens_details.reasoning_tokens == 16
    claude = anthropic.Anthropic(base_url=think_server.url, api_key="none", max_retries=0)
    request = dict(model="tiny", messages=ASK, max_tokens=16, extra_body={"temperature": 0})
    prompt = claude.messages.count_tokens(model="tiny", messages=ASK).input_tokens
    with claude.messages.stream(**request) as stream:
        streamed = stream.get_final_message().usage
    for usage in (claude.messages.create(**request).usage, streamed):
        assert usage.output_tokens == usage.output_tokens_details.thinking_tokens == 16
        assert usage.cache_read_input_tokens > 0 and usage.input_tokens + usage.cache_read_input_tokens == prompt
