"""gpt-oss's harmony format through `dashinfer serve` with the official openai client, on a tiny model
whose tokenizer has harmony's special tokens and whose chat template is harmony-like
(tests/helpers.py HARMONY): the analysis channel comes back as reasoning_content and the final
channel as content, streamed too (the answer is pinned by a grammar, so the split is the one written
here by hand); tool_choice required makes a call on the commentary channel that the grammar
constrains, arguments that satisfy the schema, finish_reason tool_calls; response_format's JSON is
the final channel, after an optional analysis (reasoning); reasoning_effort and a tool round trip
reach the template as transformers renders them, the reasoning of the call included."""
import json

import httpx
import jsonschema
import openai
import pytest

from tests.chat_templates import HARMONY, HARMONY_TOKENS
from tests.helpers import tiny_with_template
from tests.http_server import serving

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "minLength": 8, "maxLength": 24},
                                           "unit": {"enum": ["C", "F"]}},
          "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": SCHEMA}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# The answer pinned: an analysis message, then the final one (lark, llguidance's dialect; <|...|>
# are the special tokens).
PINNED = ('start: <|channel|> "analysis" <|message|> "The user asks about Paris." <|end|> <|start|> "assistant" '
          '<|channel|> "final" <|message|> "It is sunny in Paris." <|return|>')


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    hf_dir, out = tiny_with_template(tmp_path_factory, "harmony", HARMONY, extra_special=HARMONY_TOKENS)
    with serving(out, str(tmp_path_factory.mktemp("harmony-serve") / "serve.log")) as s:
        yield hf_dir, s, openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)


def test_analysis_is_reasoning_and_final_is_content_streamed_too(harmony):
    _, _, client = harmony
    request = dict(model="tiny", messages=ASK, max_tokens=128, temperature=0,
                   response_format={"type": "grammar", "grammar": PINNED})
    message = client.chat.completions.create(**request).choices[0].message
    assert (message.reasoning_content, message.content) == ("The user asks about Paris.", "It is sunny in Paris.")
    chunks = list(client.chat.completions.create(**request, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [d.reasoning_content for d in deltas if getattr(d, "reasoning_content", None)]
    content = [d.content for d in deltas if d.content]
    assert ("".join(reasoning), "".join(content)) == ("The user asks about Paris.", "It is sunny in Paris.")
    # How many pieces depends on how many tokens each wake of the stream finds (the grammar may also
    # emit forced tokens together); one piece per token is test_output_harmony's check.
    # reasoning ends before content begins; tokens that arrive together may share the chunk where it turns
    first_content = next(k for k, d in enumerate(deltas) if d.content)
    assert all(not getattr(d, "reasoning_content", None) for d in deltas[first_content + 1:])
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_required_tool_call_on_the_commentary_channel(harmony):
    """A forced call may be reasoned first, as a JSON answer may (below): this random model takes the
    commentary channel at once where a bias keeps it from the analysis channel's 'a'."""
    from transformers import AutoTokenizer
    hf_dir, _, client = harmony
    token = AutoTokenizer.from_pretrained(hf_dir).convert_tokens_to_ids
    request = dict(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=128,
                   temperature=0, logit_bias={str(token("a")): -100})
    choice = client.chat.completions.create(**request).choices[0]
    [call] = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    assert not choice.message.content and not getattr(choice.message, "reasoning_content", None)

    chunks = list(client.chat.completions.create(**request, stream=True))
    pieces = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert pieces[0].function.name == "get_weather" and pieces[0].id
    # How many pieces depends on how many tokens each wake of the stream finds: these arguments are
    # short enough to arrive whole on a busy machine. One piece per token is test_output_harmony's
    # check, more than one piece through the server test_http_tool_streams' (arguments four times longer).
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_required_call_may_follow_an_analysis(harmony):
    """Kept from the commentary channel's 'c' (which the call's grammar writes all the same) and
    pushed to end its analysis (<|end|>), the model reasons, then calls: the analysis comes back as
    reasoning, the call as a call satisfying the schema."""
    from transformers import AutoTokenizer
    hf_dir, _, client = harmony
    token = AutoTokenizer.from_pretrained(hf_dir).convert_tokens_to_ids
    choice = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=400, temperature=1.0,
        seed=1, logit_bias={str(token("c")): -100, str(token("<|end|>")): 4}).choices[0]
    [call] = choice.message.tool_calls
    assert getattr(choice.message, "reasoning_content", None) and choice.finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)


def test_no_marker_reaches_the_answer(harmony):
    """A random model writes harmony's special tokens anywhere: none is ever content or reasoning."""
    _, _, client = harmony
    for seed in range(4):
        message = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=48, seed=seed,
                                                 temperature=1.0).choices[0].message
        for text in (message.content or "", getattr(message, "reasoning_content", None) or ""):
            assert not any(marker in text for marker in HARMONY_TOKENS), text


def test_reasoning_effort_and_a_tool_round_trip_reach_the_template(harmony):
    from transformers import AutoTokenizer
    hf_dir, server, _ = harmony
    reference = AutoTokenizer.from_pretrained(hf_dir)
    arguments = '{"city": "Paris", "unit": "C"}'
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    # the server names a result after the call it answers; the reference is given the name
    named = history[:-1] + [dict(history[-1], name="get_weather")]
    for effort in ("low", "high"):
        text = reference.apply_chat_template(named, tools=[WEATHER], tokenize=False, add_generation_prompt=True,
                                             reasoning_effort=effort)
        assert f"Reasoning: {effort}" in text and "to=functions.get_weather <|constrain|>json<|message|>" + arguments in text
        got = httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": history, "tools": [WEATHER],
                                                         "reasoning_effort": effort}).json()
        assert got["tokens"] == reference(text, add_special_tokens=False)["input_ids"]
    bad = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": ASK,
                                                                 "reasoning_effort": "extreme"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
    # OpenAI's efforts past the template's ends are its nearest end, and so are Anthropic's
    # (output_config.effort)
    for effort, written in (("none", "low"), ("minimal", "low"), ("xhigh", "high"), ("max", "high")):
        text = reference.apply_chat_template(ASK, tokenize=False, add_generation_prompt=True, reasoning_effort=written)
        want = reference(text, add_special_tokens=False)["input_ids"]
        got = httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": ASK,
                                                         "reasoning_effort": effort}).json()
        assert got["tokens"] == want, effort
        if effort in ("xhigh", "max"):
            counted = httpx.post(server.url + "/v1/messages/count_tokens", json={
                "model": "tiny", "messages": ASK, "output_config": {"effort": effort}}).json()
            assert counted["input_tokens"] == len(want)


def test_the_reasoning_of_a_call_goes_back_as_its_analysis(harmony):
    """The harmony guide: a call's reasoning (analysis) goes back in the next request until the final
    answer; gpt-oss's template writes an assistant turn's `thinking` before its call. The reasoning
    and call the server answered, sent back with the result, make the prompt transformers renders
    with `thinking` set."""
    from transformers import AutoTokenizer
    hf_dir, server, client = harmony
    pinned = ('start: <|channel|> "analysis" <|message|> "The user asks about Paris." <|end|> <|start|> "assistant" '
              '<|channel|> "commentary to=functions.get_weather " <|constrain|> "json" <|message|> '
              '"{\\"city\\": \\"Paris, France\\", \\"unit\\": \\"C\\"}" <|call|>')
    message = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=128,
                                             response_format={"type": "grammar", "grammar": pinned}).choices[0].message
    [call] = message.tool_calls
    assert (message.reasoning_content, call.function.name) == ("The user asks about Paris.", "get_weather")
    result = {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}
    answer = client.chat.completions.create(model="tiny", messages=ASK + [message, result], tools=[WEATHER],
                                            max_tokens=1)
    reference = AutoTokenizer.from_pretrained(hf_dir)
    turn = {"role": "assistant", "content": None, "thinking": message.reasoning_content,
            "tool_calls": [call.model_dump()]}
    text = reference.apply_chat_template(ASK + [turn, dict(result, name="get_weather")], tools=[WEATHER],
                                         tokenize=False, add_generation_prompt=True)
    assert "<|channel|>analysis<|message|>The user asks about Paris.<|end|>" in text
    assert answer.usage.prompt_tokens == len(reference(text, add_special_tokens=False)["input_ids"])
    # once a final answer follows, the template drops the call's analysis
    later = [{"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks!"}]
    text = reference.apply_chat_template(ASK + [turn, dict(result, name="get_weather")] + later, tools=[WEATHER],
                                         tokenize=False, add_generation_prompt=True)
    assert "The user asks about Paris." not in text
    sent = ASK + [message.model_dump(exclude_none=True), result] + later
    got = httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": sent, "tools": [WEATHER]}).json()
    assert got["tokens"] == reference(text, add_special_tokens=False)["input_ids"]
    # a commentary preamble that came back as content beside the reasoning: the template refuses both
    # (transformers raises), so the turn goes back with its reasoning alone, as llama.cpp sends it
    both = dict(message.model_dump(exclude_none=True), content="Let me look it up.")
    with pytest.raises(Exception, match="both content and thinking"):
        reference.apply_chat_template(ASK + [dict(turn, content=both["content"]), dict(result, name="get_weather")],
                                      tools=[WEATHER], tokenize=False)
    got = httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": ASK + [both, result],
                                                     "tools": [WEATHER]}).json()
    text = reference.apply_chat_template(ASK + [turn, dict(result, name="get_weather")], tools=[WEATHER],
                                         tokenize=False, add_generation_prompt=True)
    assert got["tokens"] == reference(text, add_special_tokens=False)["input_ids"]


def test_a_json_answer_is_the_final_channel_after_an_optional_analysis(harmony):
    """response_format on harmony constrains the final channel alone (as vLLM does): the model may
    write its analysis first, then `<|channel|>final<|message|>` and the JSON, which comes back as
    content, the analysis as reasoning, streamed as whole. This random model takes the channel a
    bias pushes it to (against 'a' or 'f', whose channel the grammar writes all the same), and a
    bias on <|end|> ends its analysis."""
    from transformers import AutoTokenizer
    hf_dir, _, client = harmony
    token = AutoTokenizer.from_pretrained(hf_dir).convert_tokens_to_ids
    rf = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    # max_tokens 400: this random model writes much of the whitespace JSON allows (20 in a row)
    final = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=400, temperature=0,
                                           logit_bias={str(token("a")): -100}, response_format=rf).choices[0]
    jsonschema.validate(json.loads(final.message.content), SCHEMA)
    assert final.finish_reason == "stop" and not getattr(final.message, "reasoning_content", None)

    request = dict(model="tiny", messages=ASK, max_tokens=400, temperature=1.0, seed=1, response_format=rf,
                   logit_bias={str(token("f")): -100, str(token("<|end|>")): 4})
    choice = client.chat.completions.create(**request).choices[0]
    reasoning, content = getattr(choice.message, "reasoning_content", None), choice.message.content
    assert reasoning and choice.finish_reason == "stop"
    jsonschema.validate(json.loads(content), SCHEMA)
    chunks = list(client.chat.completions.create(**request, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == content
    assert chunks[-1].choices[0].finish_reason == "stop"
