"""The reasoning of earlier assistant turns, sent back, reaches the chat template as transformers
gives it: on a tiny model whose template treats reasoning as Qwen3's does (tests/chat_templates.py
QWEN3: an assistant turn's `reasoning_content` is written in <think> after the last user query, a
tool-call loop, and dropped before it). OpenAI's `reasoning_content` and vLLM's `reasoning` on an
assistant message, and Anthropic's `thinking` blocks (redacted_thinking's opaque data is dropped),
give the prompt transformers' apply_chat_template renders with `reasoning_content` set; the round
trip too: the reasoning and call the server answered in turn 1, sent back with the call's result;
and the Responses API's reasoning items. gpt-oss's `thinking` is tests/test_http_harmony.py's."""
import anthropic
import httpx
import openai
import pytest

from tests.chat_templates import QWEN3
from tests.helpers import tiny_with_template
from tests.http_server import serving

REASONING = "The user wants the weather; the tool knows it."
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}
# The answer pinned: reasoning, then a call, as Qwen3 writes them.
PINNED = ('start: "<think>\\n' + REASONING + '\\n</think>\\n\\n<tool_call>\\n{\\"name\\": \\"get_weather\\", '
          '\\"arguments\\": {\\"city\\": \\"Paris\\"}}\\n</tool_call>"')


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from transformers import AutoTokenizer
    hf_dir, out = tiny_with_template(tmp_path_factory, "qwen3", QWEN3)
    with serving(out, str(tmp_path_factory.mktemp("qwen3-serve") / "serve.log"), tp=1) as s:
        yield AutoTokenizer.from_pretrained(hf_dir), s


def _reference_ids(tokenizer, messages, tools=(WEATHER,)):
    text = tokenizer.apply_chat_template(messages, tools=list(tools) or None, tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _tokenized(server, messages, tools=(WEATHER,)):
    body = {"model": "tiny", "messages": messages}
    answer = httpx.post(server.url + "/tokenize", json=dict(body, tools=list(tools)) if tools else body)
    assert answer.status_code == 200, answer.text
    return answer.json()["tokens"]


def _turn(reasoning_key, content=""):
    return {"role": "assistant", "content": content, reasoning_key: REASONING, "tool_calls": [CALL]}


@pytest.mark.parametrize("key, content", [("reasoning_content", ""), ("reasoning", ""),
                                          ("reasoning_content", "Let me look.")])
def test_the_reasoning_of_a_call_reaches_the_template(qwen3, key, content):
    tokenizer, server = qwen3
    expected = _reference_ids(tokenizer, ASK + [_turn("reasoning_content", content), RESULT])
    assert REASONING in tokenizer.decode(expected)  # a tool-call loop: the template keeps it
    assert _tokenized(server, ASK + [_turn(key, content), RESULT]) == expected


def test_reasoning_before_the_last_question_is_the_templates_to_drop(qwen3):
    """A finished exchange, then a new question: the template drops the earlier reasoning; content
    holding <think> (no reasoning field) is the template's to split, as before. Reasoning that is no
    string is a 400."""
    tokenizer, server = qwen3
    for earlier in ({"role": "assistant", "content": "Sunny.", "reasoning_content": REASONING},
                    {"role": "assistant", "content": f"<think>\n{REASONING}\n</think>\n\nSunny."}):
        history = ASK + [earlier, {"role": "user", "content": "And tomorrow?"}]
        expected = _reference_ids(tokenizer, history, ())
        assert REASONING not in tokenizer.decode(expected)
        assert _tokenized(server, history, ()) == expected
    bad = httpx.post(server.url + "/tokenize", json={"messages": ASK + [dict(_turn("reasoning"), reasoning=7)]})
    assert bad.status_code == 400 and "messages[1].reasoning must be a string" in bad.json()["error"]["message"]


def test_the_reasoning_answered_goes_back_in_the_next_turn(qwen3):
    tokenizer, server = qwen3
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=256,
                                           response_format={"type": "grammar", "grammar": PINNED})
    message = first.choices[0].message
    [call] = message.tool_calls
    # the reasoning as written between the tags (vLLM's qwen3 parser keeps their newlines too)
    assert (message.reasoning_content.strip("\n"), call.function.name) == (REASONING, "get_weather")
    # the message as the client got it, sent back as agents send it
    history = ASK + [message, {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    second = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], max_tokens=1)
    expected = _reference_ids(tokenizer, ASK + [
        {"role": "assistant", "content": message.content, "reasoning_content": message.reasoning_content,
         "tool_calls": [call.model_dump()]}, {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}])
    assert REASONING in tokenizer.decode(expected)
    assert second.usage.prompt_tokens == len(expected)


def test_thinking_blocks_reach_the_template(qwen3):
    """Anthropic's tool-use loop sends the turn's thinking back with its tool_use (its docs: the one
    case it must): the prompt counts what transformers renders with reasoning_content."""
    tokenizer, server = qwen3
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    tool = {"name": "get_weather", "description": "The weather in a city",
            "input_schema": WEATHER["function"]["parameters"]}
    use = {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
    # the blocks as the client returned them (what agents send back), or as dicts
    returned = [anthropic.types.ThinkingBlock(type="thinking", thinking=REASONING, signature=""),
                anthropic.types.ToolUseBlock(**use)]
    for content in (returned, [{"type": "redacted_thinking", "data": "opaque"},
                               {"type": "thinking", "thinking": REASONING[:20], "signature": "s"},
                               {"type": "thinking", "thinking": REASONING[20:], "signature": "s"}, use]):
        messages = ASK + [{"role": "assistant", "content": content},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                        "content": "18 C, sunny"}]}]
        counted = client.messages.count_tokens(model="tiny", messages=messages, tools=[tool])
        expected = _reference_ids(tokenizer, ASK + [_turn("reasoning_content"), RESULT])
        assert counted.input_tokens == len(expected)


def test_the_responses_round_trip_sends_its_reasoning_item_back(qwen3):
    """Responses API: a reasoning item and the function_call after it, sent back with the call's
    output (as agents send the output items they got), give the prompt transformers renders with
    reasoning_content."""
    tokenizer, server = qwen3
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    tool = dict(WEATHER["function"], type="function")
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": REASONING}]}
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"}
    second = client.responses.create(model="tiny", input=ASK + [reasoning, call, output], tools=[tool],
                                     max_output_tokens=1)
    expected = _reference_ids(tokenizer, ASK + [_turn("reasoning_content"), RESULT])
    assert REASONING in tokenizer.decode(expected)
    assert second.usage.input_tokens == len(expected)


def test_a_structured_answer_may_open_its_reasoning_first(qwen3):
    """Qwen3's template with thinking on leaves <think> to the model: response_format allows an
    optional <think> block before the JSON, as vLLM's structured outputs wait for the reasoning's
    end (a bias on '<' makes this random model open it; the grammar spells <think> out). With
    thinking off the template closed it: JSON from the first token, the bias notwithstanding."""
    tokenizer, server = qwen3
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    angle = {str(tokenizer.convert_tokens_to_ids("<")): 100}
    thinking = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=16, temperature=0,
                                              logit_bias=angle, response_format={"type": "json_object"})
    message = thinking.choices[0].message
    assert (message.reasoning_content, message.content or "") == ("<" * (16 - len("<think>")), "")
    plain = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=16, temperature=0,
                                           logit_bias=angle, response_format={"type": "json_object"},
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert plain.choices[0].message.content.startswith("{")
