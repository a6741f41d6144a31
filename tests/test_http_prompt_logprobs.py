"""The prompt's own logprobs through `dashinfer serve --tp 2` (two ranks: the head's vocabulary is
split between them) and the official openai client: lm-evaluation-harness' loglikelihood request
(/v1/completions with echo, logprobs 1, max_tokens 0 or 1) and vLLM's prompt_logprobs on both
routes, against log_softmax of transformers' logits of the fp32 tiny model."""
import httpx
import numpy as np
import openai
import pytest

from tests.helpers import load_hf_model
from tests.http_server import API_KEY, MAX_MODEL_LEN, serving

QUESTION = [{"role": "user", "content": "Hello, who are you?"}]
TOLERANCE = 1e-4  # two ranks sum in another order
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    # 4 requests: the scored rows' head runs 4 rows at a time
    with serving(tiny_model, str(tmp_path_factory.mktemp("serve") / "serve.log"), "--api-key", API_KEY,
                 "--max-batch", "4") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def hf(serialized_tiny):
    return load_hf_model(serialized_tiny(name="tiny", max_position_embeddings=4 * MAX_MODEL_LEN).model_path)


def log_softmax(hf, ids) -> np.ndarray:
    """[len(ids) - 1, V]: row p holds the logprobs of the token after position p."""
    import torch
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0, :-1].double(), -1).numpy()


def tokenize(server, **body) -> list:
    return httpx.post(server.url + "/tokenize", json=dict(model="tiny", **body), headers=AUTH, timeout=60).json()["tokens"]


def detokenize(server, ids) -> str:
    return httpx.post(server.url + "/detokenize", json={"tokens": ids}, headers=AUTH, timeout=60).json()["prompt"]


def lm_eval_loglikelihood(choice, context_len, max_tokens):
    """lm-evaluation-harness' parse_logprobs (openai_completions.py): the continuation's summed
    logprob and whether it is the greedy one (with max_tokens 1, its request, the last entry is
    the generated token's)."""
    end = -max_tokens or None
    lps = choice.logprobs.token_logprobs[context_len:end]
    tops = choice.logprobs.top_logprobs[context_len:end]
    return sum(lps), all(lp == max(top.values()) for lp, top in zip(lps, tops))


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_lm_eval_loglikelihood_request(client, hf, server, max_tokens):
    """Token ids as lm-eval sends them, 600 of them (two prefill steps of 512)."""
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 272, 600)]
    answer = client.completions.create(model="tiny", prompt=prompt, echo=True, logprobs=1, max_tokens=max_tokens,
                                       temperature=0)
    choice = answer.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(prompt) + max_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = log_softmax(hf, prompt)
    targets = np.array(prompt[1:])
    got = np.array(lp.token_logprobs[1:len(prompt)])
    assert np.abs(got - expected[np.arange(len(targets)), targets]).max() < TOLERANCE
    best = expected.max(axis=1)
    assert [list(top.values()) for top in lp.top_logprobs[1:len(prompt)]] == \
        [[pytest.approx(b, abs=TOLERANCE)] for b in best]
    assert answer.usage.prompt_tokens == len(prompt) and answer.usage.completion_tokens == max_tokens
    assert choice.finish_reason == "length"
    if max_tokens == 0:  # the echoed prompt alone
        assert choice.text == detokenize(server, prompt)
    # the continuation: the prompt's last 5 tokens
    total, greedy = lm_eval_loglikelihood(choice, len(prompt) - 5, max_tokens)
    assert total == pytest.approx(float(expected[np.arange(594, 599), targets[594:]].sum()), abs=5 * TOLERANCE)
    assert greedy == all(expected[p].argmax() == prompt[p + 1] for p in range(594, 599))


def test_text_prompt_offsets_and_the_stream(client, hf, server):
    """A text prompt: the echoed tokens' text_offset index the echoed text, then the generated
    ones follow; streamed, the echo chunk carries the prompt's logprobs."""
    text = "The quick brown fox"
    whole = client.completions.create(model="tiny", prompt=text, echo=True, logprobs=2, max_tokens=3, temperature=0)
    lp = whole.choices[0].logprobs
    ids = tokenize(server, prompt=text)
    assert lp.tokens[:len(ids)] == [detokenize(server, [i]) for i in ids]
    assert lp.text_offset[0] == 0 and lp.text_offset[len(ids)] == len(text)
    assert [text[a:b] for a, b in zip(lp.text_offset, lp.text_offset[1:len(ids)] + [len(text)])] == lp.tokens[:len(ids)]
    expected = log_softmax(hf, ids)
    for p, top in enumerate(lp.top_logprobs[1:len(ids)]):
        assert len(top) == 2 and max(top.values()) == pytest.approx(expected[p].max(), abs=TOLERANCE)
    chunks = list(client.completions.create(model="tiny", prompt=text, echo=True, logprobs=2, max_tokens=3,
                                            temperature=0, stream=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert chunks[0].choices[0].text == text and len(streamed[0].tokens) == len(ids)
    assert sum((s.token_logprobs for s in streamed), []) == lp.token_logprobs
    assert sum((s.text_offset for s in streamed), []) == lp.text_offset


def test_vllm_prompt_logprobs_on_both_routes(client, hf, server):
    ids = tokenize(server, prompt="Hello there, general")
    answer = client.completions.create(model="tiny", prompt="Hello there, general", max_tokens=2, temperature=0,
                                       extra_body={"prompt_logprobs": 2})
    _check_vllm(answer.choices[0].model_extra["prompt_logprobs"], ids, hf, 2)
    assert answer.choices[0].logprobs is None
    chat = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2, temperature=0,
                                          extra_body={"prompt_logprobs": 0})
    _check_vllm(chat.model_extra["prompt_logprobs"], tokenize(server, messages=QUESTION), hf, 0)


def _check_vllm(entries, ids, hf, k):
    """vLLM's shape: None, then {id: {logprob, rank, decoded_token}} with the prompt token first."""
    expected = log_softmax(hf, ids)
    assert len(entries) == len(ids) and entries[0] is None
    for p, entry in enumerate(entries[1:]):
        token = ids[p + 1]
        first = next(iter(entry))
        assert first == str(token)
        assert entry[first]["logprob"] == pytest.approx(expected[p, token], abs=TOLERANCE)
        assert entry[first]["rank"] == 1 + int((expected[p] > expected[p, token]).sum())
        top = np.argsort(-expected[p], kind="stable")[:k]
        assert set(entry) == {str(token)} | {str(t) for t in top}
        assert all(entry[str(t)]["rank"] == j + 1 for j, t in enumerate(top))


@pytest.mark.parametrize("route, body, words", [
    ("/v1/completions", {"prompt": "abc", "prompt_logprobs": 1, "stream": True}, ["not available", "stream"]),
    ("/v1/chat/completions", {"messages": QUESTION, "prompt_logprobs": 1, "stream": True}, ["not available"]),
    ("/v1/completions", {"prompt": "abc", "max_tokens": 0}, ["'max_tokens'", "at least 1"]),
    ("/v1/completions", {"prompt": "abc", "prompt_logprobs": 11}, ["prompt_logprobs"]),
], ids=["completions-stream", "chat-stream", "max_tokens-0-without-echo", "over"])
def test_refusals(server, route, body, words):
    r = httpx.post(server.url + route, json=dict(model="tiny", **body), headers=AUTH, timeout=60)
    assert r.status_code == 400, r.text
    assert all(w in r.json()["error"]["message"] for w in words), r.text
