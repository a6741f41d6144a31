"""Anthropic's Messages API of `dashinfer serve`, through the official anthropic client, on the
default model: plain answers equal the in-process Engine's for the prompt transformers renders
with the model's chat template, streamed answers equal whole ones (the client assembles the events
and checks their order), a forced tool_use has input that satisfies the tool's schema and
round-trips, count_tokens counts the same prompt, and malformed bodies are 400s in Anthropic's
error shape with the server still serving.
"""
import json
import os

import anthropic
import httpx
import jsonschema
import pydantic
import pytest

from tests.http_server import API_KEY, Reference, default_model_dir

SYSTEM = "You are a concise assistant."
# The anthropic client has no sampling arguments any more; the server still reads temperature.
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def reference():
    r = Reference(*os.path.split(default_model_dir()))
    yield r
    r.close()


def prompt_tokens(usage) -> int:
    """The prompt's tokens in Anthropic's usage: those the prefix cache gave are counted apart."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def _prompt_ids(reference, turns):
    tokenizer = reference.hf_tokenizer()
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_plain_message_equals_the_engine(client, reference):
    message = client.messages.create(model="tiny", system=SYSTEM, messages=ASK, max_tokens=24, extra_body=GREEDY)
    ids = _prompt_ids(reference, [{"role": "system", "content": SYSTEM}] + ASK)
    expected, _, _, reason = reference.generate(ids, 24)
    assert message.role == "assistant" and message.type == "message"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == reference.text(expected)
    assert message.stop_reason == ("max_tokens" if reason == "length" else "end_turn")
    assert prompt_tokens(message.usage) == len(ids) and message.usage.output_tokens == len(expected)
    counted = client.messages.count_tokens(model="tiny", system=SYSTEM, messages=ASK)
    assert counted.input_tokens == len(ids)


def test_streamed_message_equals_the_whole(client):
    kwargs = dict(model="tiny", system=SYSTEM, messages=ASK, max_tokens=24, extra_body=GREEDY)
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_stop" in kinds


def test_stop_sequences_say_which_one_ended_it(client, reference):
    ids = _prompt_ids(reference, ASK)
    full = reference.text(reference.generate(ids, 24)[0])
    stop = next(word for word in full.split()[1:] if word.isalpha())
    message = client.messages.create(model="tiny", messages=ASK, max_tokens=24, extra_body=GREEDY,
                                     stop_sequences=[stop, "never-there"])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == full[:full.index(stop)]


def test_forced_tool_use_satisfies_the_schema_and_round_trips(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    message = client.messages.create(model="tiny", messages=ask, tools=[WEATHER], tool_choice={"type": "any"},
                                     max_tokens=64, extra_body=GREEDY)
    uses = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses and all(u.name == "get_weather" for u in uses)
    for use in uses:
        jsonschema.validate(use.input, WEATHER["input_schema"])
    with client.messages.stream(model="tiny", messages=ask, tools=[WEATHER], max_tokens=64, extra_body=GREEDY,
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == \
        [(u.name, u.input) for u in uses]
    history = ask + [{"role": "assistant", "content": message.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "18 C"}
                                                  for u in uses]}]
    answer = client.messages.create(model="tiny", messages=history, tools=[WEATHER], tool_choice={"type": "none"},
                                    max_tokens=16, extra_body=GREEDY)
    assert answer.content[0].type == "text" and prompt_tokens(answer.usage) > prompt_tokens(message.usage)


def test_a_tool_use_cut_by_max_tokens_streams_what_it_answers_whole(client):
    """max_tokens cuts a forced tool_use before its name, inside its input and after it with the next
    begun: the stream, as the anthropic client assembles it, is the unstreamed message; a cut input
    holds what was written whole of the full one, and no text block repeats the calls."""
    request = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
                   tool_choice={"type": "any"}, extra_body=GREEDY)
    full = [b for b in client.messages.create(**request, max_tokens=96).content if b.type == "tool_use"]
    seen = []
    for max_tokens in range(8, 22, 3):
        whole = client.messages.create(**request, max_tokens=max_tokens)
        with client.messages.stream(**request, max_tokens=max_tokens) as stream:
            joined = stream.get_final_message()
        assert _blocks(joined) == _blocks(whole) and whole.stop_reason == joined.stop_reason == "max_tokens"
        uses = [b for b in whole.content if b.type == "tool_use"]
        assert all(u.name == f.name and u.input.items() <= f.input.items() for u, f in zip(uses, full))
        assert not (uses and any(b.type == "text" for b in whole.content)), whole.content
        seen.append([(u.name, u.input) for u in uses])
    # the cuts fell before a name went out (text), inside the input and after the first call
    first = (full[0].name, full[0].input)
    assert [] in seen and [first] in seen and any(s and s[0] != first for s in seen), seen


def test_an_empty_answer_has_no_content_block_streamed_or_not(client, reference):
    """A stop sequence met at the answer's start: Anthropic's empty message, "content": [], whole and
    streamed (no content block opened)."""
    full = reference.text(reference.generate(_prompt_ids(reference, ASK), 24)[0])
    stop = full.split()[0]
    assert full.startswith(stop)
    request = dict(model="tiny", messages=ASK, max_tokens=24, extra_body=GREEDY, stop_sequences=[stop])
    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        kinds = [event.type for event in stream]
        joined = stream.get_final_message()
    assert whole.content == joined.content == [] and "content_block_start" not in kinds
    assert (whole.stop_reason, whole.stop_sequence) == (joined.stop_reason, joined.stop_sequence) == \
        ("stop_sequence", stop)


def _blocks(message) -> list:
    """A message's content blocks without their ids (each request draws its own)."""
    return [(b.type, getattr(b, "text", None), getattr(b, "name", None), getattr(b, "input", None))
            for b in message.content]


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                        "population": {"type": "integer", "minimum": 0, "maximum": 10 ** 8}},
        "required": ["city", "population"], "additionalProperties": False}


class City(pydantic.BaseModel):  # no bounds: the client takes numbers' and strings' out of the schema
    city: str
    capital: bool


def test_structured_output_follows_the_schema_whole_streamed_and_parsed(client):
    """output_config.format (Anthropic's structured outputs): the answer's text is JSON the schema
    accepts, streamed as whole; the client's parse() reads it into the type it was given."""
    request = dict(model="tiny", messages=ASK, max_tokens=64, extra_body=GREEDY,
                   output_config={"format": {"type": "json_schema", "schema": CITY}})
    message = client.messages.create(**request)
    [block] = message.content
    jsonschema.validate(json.loads(block.text), CITY)
    assert message.stop_reason == "end_turn"
    with client.messages.stream(**request) as stream:
        assert stream.get_final_message().content[0].text == block.text
    parsed = client.messages.parse(model="tiny", messages=ASK, max_tokens=64, output_format=City, extra_body=GREEDY)
    assert isinstance(parsed.parsed_output, City)


def test_routing_and_caching_fields_change_nothing(client, reference):
    """What a current client may send about billing, placement and caching (top-level cache_control:
    the prefix cache keeps every prompt anyway) is taken and answers as without it."""
    plain = client.messages.create(model="tiny", messages=ASK, max_tokens=8, extra_body=GREEDY)
    extra = dict(GREEDY, cache_control={"type": "ephemeral"}, inference_geo="us", speed="standard",
                 service_tier="auto", metadata={"user_id": "u-1"})
    assert client.messages.create(model="tiny", messages=ASK, max_tokens=8,
                                  extra_body=extra).content[0].text == plain.content[0].text


@pytest.mark.parametrize("body, words", [
    ({"messages": ASK}, ["max_tokens"]),
    ({"max_tokens": 8, "messages": []}, ["messages"]),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, ["role"]),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, ["image"]),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"name": "f"}]}, ["input_schema"]),
    ({"max_tokens": 8, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool"}}, ["tool_choice"]),
    ({"max_tokens": 8, "messages": ASK, "tool_choice": {"type": "any"}}, ["tools"]),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, ["tool_use_id"]),
    ({"max_tokens": 8, "messages": ASK, "temperature": -1}, ["temperature"]),
    ({"max_tokens": 8, "messages": ASK, "surprise": 1}, ["surprise"]),
    ({"max_tokens": 8, "messages": ASK, "container": "c-1"}, ["container"]),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     ["server tool", "web_search_20250305"]),
    ({"max_tokens": 8, "messages": ASK, "output_config": {"format": {"type": "json_object"}}}, ["output_config"]),
    ({"max_tokens": 8, "messages": ASK, "output_config": {"effort": "extreme"}}, ["output_config.effort", "max"]),
], ids=["no-max_tokens", "no-messages", "system-role", "image", "tool-without-schema", "tool-choice-no-name",
        "choice-without-tools", "result-without-id", "temperature", "unknown-field", "code-container", "server-tool",
        "format-not-a-schema", "effort"])
def test_malformed_bodies_are_400s_in_anthropic_shape(server, client, body, words):
    r = httpx.post(server.url + "/v1/messages", json=dict(body, model="tiny"), headers={"x-api-key": API_KEY},
                   timeout=120)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert all(w in error["error"]["message"] for w in words), error
    if "max_tokens" in body and set(body) <= {"max_tokens", "messages", "tools", "tool_choice"}:
        # what the client's arguments can carry: it reads the error as Anthropic's
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(**dict(body, model="tiny"))
        assert e.value.body["error"]["type"] == "invalid_request_error"
    assert client.messages.create(model="tiny", messages=ASK, max_tokens=2).usage.output_tokens > 0


def test_the_key_is_checked_in_either_header(server):
    for bad in (anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0),
                anthropic.Anthropic(base_url=server.url, auth_token="wrong", max_retries=0)):
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.create(model="tiny", messages=ASK, max_tokens=2)
        assert e.value.body["error"]["type"] == "authentication_error"
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=API_KEY, api_key=None, max_retries=0)
    assert bearer.messages.create(model="tiny", messages=ASK, max_tokens=2).usage.output_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0).messages.create(
            model="claude-nope", messages=ASK, max_tokens=2)
