"""Continuing the assistant's final message (a prefill) through `dashinfer serve` on the default
model: Anthropic's Messages API continues a final assistant message (the answer holds only the new
text; trailing whitespace is a 400, as Anthropic answers), and the chat route takes vLLM's
`continue_final_message` / `add_generation_prompt`. The prompt is the ids transformers'
apply_chat_template(..., continue_final_message=True) gives on the model's own tokenizer, and the
answer the in-process Engine's greedy continuation of them.
"""
import anthropic
import httpx
import openai
import pytest

from tests.http_server import API_KEY
from tests.test_http_anthropic import ASK, prompt_tokens, reference, server  # noqa: F401 (the default model's server and Engine)

PREFILLED = ASK + [{"role": "assistant", "content": "The capital of France is the city of"}]
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def continued(reference):
    """(the prompt ids transformers renders for PREFILLED continued, the engine's greedy answer to them)."""
    tokenizer = reference.hf_tokenizer()
    text = tokenizer.apply_chat_template(PREFILLED, tokenize=False, continue_final_message=True)
    assert text.endswith(PREFILLED[-1]["content"])  # left open: no end of turn after it
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids, reference.text(reference.generate(ids, 16)[0])


def test_anthropic_continues_a_final_assistant_message(server, continued):
    ids, expected = continued
    client = anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)
    request = dict(model="tiny", messages=PREFILLED, max_tokens=16, extra_body={"temperature": 0})
    message = client.messages.create(**request)
    assert prompt_tokens(message.usage) == len(ids)
    assert client.messages.count_tokens(model="tiny", messages=PREFILLED).input_tokens == len(ids)
    assert message.content[0].text == expected and "Paris" in expected  # the prefill goes on, not a new answer
    with client.messages.stream(**request) as stream:
        assert stream.get_final_message().content[0].text == expected
    with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
        client.messages.create(**dict(request, messages=ASK + [{"role": "assistant", "content": "The city of "}]))


def test_openai_chat_takes_vllms_continue_final_message(server, reference, continued):
    ids, expected = continued
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    tokens = httpx.post(server.url + "/tokenize", headers=AUTH,
                        json={"messages": PREFILLED, "continue_final_message": True}).json()["tokens"]
    assert tokens == ids
    answer = client.chat.completions.create(model="tiny", messages=PREFILLED, max_tokens=16, temperature=0,
                                            extra_body={"continue_final_message": True})
    assert answer.usage.prompt_tokens == len(ids) and answer.choices[0].message.content == expected
    # add_generation_prompt false: the conversation as the template closes it, no turn opened
    tokenizer = reference.hf_tokenizer()
    closed = tokenizer(tokenizer.apply_chat_template(PREFILLED, tokenize=False, add_generation_prompt=False),
                       add_special_tokens=False)["input_ids"]
    assert httpx.post(server.url + "/tokenize", headers=AUTH,
                      json={"messages": PREFILLED, "add_generation_prompt": False}).json()["tokens"] == closed


@pytest.mark.parametrize("patch, param", [
    ({"messages": ASK, "continue_final_message": True}, "messages"),
    ({"continue_final_message": True, "add_generation_prompt": True}, "add_generation_prompt"),
    ({"continue_final_message": "yes"}, "continue_final_message"),
    ({"add_generation_prompt": 1}, "add_generation_prompt"),
], ids=["final-is-the-users", "with-a-generation-prompt", "not-a-bool", "generation-prompt-not-a-bool"])
def test_what_cannot_be_continued_is_a_400(server, patch, param):
    body = dict({"model": "tiny", "messages": PREFILLED, "max_tokens": 4}, **patch)
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
