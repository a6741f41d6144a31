"""`dashinfer serve --tp 2` with OpenAI's sampling options, n choices, batch prompts, echo and
/tokenize, /detokenize, through the official openai client and raw HTTP; answers against the
in-process Engine (tests/http_server.Reference) and the model's own tokenizer. The model's
generation_config.json names top_k 1 (greedy), temperature 0.7 and repetition_penalty 1.3: a
request that names no sampling option must get them, as vLLM gives them.
"""
import json
import os
import re
import shutil

import httpx
import openai
import pytest

from tests.helpers import serialize
from tests.http_server import API_KEY, MAX_MODEL_LEN, Reference, serving, wait_for

QUESTION = [{"role": "user", "content": "Hello, who are you?"}]
MODEL_SAMPLING = {"top_k": 1, "temperature": 0.7, "repetition_penalty": 1.3}
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def model_dir(tiny_checkpoint, tmp_path_factory):
    """tiny_model's weights, its generation_config.json naming MODEL_SAMPLING, serialized as "tiny"."""
    hf = str(tmp_path_factory.mktemp("sampling") / "hf")
    shutil.copytree(tiny_checkpoint("llama", max_position_embeddings=4 * MAX_MODEL_LEN), hf)
    path = os.path.join(hf, "generation_config.json")
    with open(path) as f:
        gen = json.load(f)
    with open(path, "w") as f:
        json.dump(dict(gen, **MODEL_SAMPLING), f)
    out = os.path.join(os.path.dirname(hf), "serialized")
    serialize(hf, out).free_model()
    return out


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    with serving(model_dir, str(tmp_path_factory.mktemp("serve") / "serve.log"), "--api-key", API_KEY) as s:
        yield s


@pytest.fixture(scope="module")
def reference(model_dir):
    r = Reference(model_dir)
    yield r
    r.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def greedy_ref(reference, prompt_ids, n, **options):
    """What the engine answers greedily with the model's repetition penalty (and `options`)."""
    ids, _, _, _ = reference.generate(prompt_ids, n, repetition_penalty=1.3, **options)
    return ids


def test_omitted_sampling_options_are_the_models_generation_config(client, reference):
    listed = client.models.list().data[0].model_dump()
    assert listed["sampling_defaults"] == {"temperature": 0.7, "top_p": 1.0, "top_k": 1, "repetition_penalty": 1.3}
    ids = greedy_ref(reference, reference.chat_ids(QUESTION), 20)
    for seed in (1, 2):  # top_k 1: the same answer whatever the seed, the greedy one with the penalty
        answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=20, seed=seed)
        assert answer.choices[0].message.content == reference.text(ids)
    # a request's own value wins: top_k 0 at temperature 1 samples, and two seeds differ
    texts = {client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=20, seed=s,
                                            temperature=1.0, extra_body={"top_k": 0}).choices[0].message.content
             for s in (1, 2)}
    assert len(texts) == 2


def test_bookkeeping_and_caching_options_change_nothing(client, reference):
    """What a current openai client may send about who asks, storage and prompt caching is taken, and
    the answer is the one without it."""
    ids = greedy_ref(reference, reference.chat_ids(QUESTION), 8)
    answer = client.chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=8, user="u-1", metadata={"k": "v"}, store=False,
        service_tier="auto", prompt_cache_key="k-1", prompt_cache_retention="24h", safety_identifier="s-1",
        extra_body={"prompt_cache_options": {"mode": "implicit"}})
    assert answer.choices[0].message.content == reference.text(ids)


def test_logit_bias_minus_100_bans_a_token_in_greedy_output(client, reference):
    prompt = reference.chat_ids(QUESTION)
    plain = greedy_ref(reference, prompt, 16)
    banned = plain[0]
    expected = greedy_ref(reference, prompt, 16, bad_words_ids=[[banned]])  # the engine's own ban
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=16, temperature=0,
                                            logit_bias={str(banned): -100})
    assert banned not in expected and answer.choices[0].message.content == reference.text(expected)


def test_frequency_penalty_and_min_p_reach_the_engine(client, reference):
    prompt = [5, 17, 101, 33, 7, 250, 64]
    answer = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                       frequency_penalty=1.5)
    assert answer.choices[0].text == reference.text(greedy_ref(reference, prompt, 24, frequency_penalty=1.5))
    # min_p 1 keeps only the most probable token: sampling at temperature 1 is greedy
    sampled = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=1.0, seed=3,
                                        extra_body={"min_p": 1.0, "top_k": 0})
    assert sampled.choices[0].text == reference.text(greedy_ref(reference, prompt, 24))


@pytest.mark.parametrize("field, value, words", [
    ("logit_bias", {"5": 101}, ["logit_bias[5]", "[-100, 100]"]), ("logit_bias", {"99999": 1}, ["vocabulary"]),
    ("logit_bias", {"x": 1}, ["logit_bias"]), ("min_p", 1.5, ["min_p"]), ("frequency_penalty", -2.5, ["[-2, 2]"]),
    ("n", 0, ["'n'"]), ("n", 1000, ["'n'"]),
])
def test_bad_values_are_400_in_openai_shape(server, field, value, words):
    r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, timeout=120,
                   json={"model": "tiny", "messages": QUESTION, field: value})
    error = r.json()["error"]
    assert r.status_code == 400 and set(error) == {"message", "type", "param", "code"}, r.text
    assert all(w in error["message"] for w in words), error


def test_n_choices_differ_are_reproducible_and_usage_counts_the_prompt_once(client, reference):
    kwargs = dict(model="tiny", messages=QUESTION, max_tokens=12, n=3, seed=7, temperature=1.0, logprobs=True,
                  extra_body={"top_k": 0})
    answer = client.chat.completions.create(**kwargs)
    again = client.chat.completions.create(**kwargs)
    texts = [c.message.content for c in answer.choices]
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices] and len(set(texts)) == 3
    one = client.chat.completions.create(**dict(kwargs, n=1))  # choice 0 samples with the seed itself
    assert one.choices[0].message.content == texts[0]
    prompt_len = len(reference.chat_ids(QUESTION))
    assert answer.usage.prompt_tokens == prompt_len
    assert answer.usage.completion_tokens == sum(len(c.logprobs.content) for c in answer.choices)
    assert answer.usage.total_tokens == prompt_len + answer.usage.completion_tokens


def test_n_choices_share_the_prompt_through_the_prefix_cache(client, server):
    long_question = [{"role": "user", "content": "Tell me everything about the history of Paris, " * 6}]
    answer = client.chat.completions.create(model="tiny", messages=long_question, max_tokens=4, n=3, temperature=0)
    # each choice's "finished" line is logged as its engine request is released, after the answer
    finished = re.compile(re.escape(answer.id) + r"/(\d) finished: (\d+) prompt \((\d+) cached\)")
    assert wait_for(lambda: len(finished.findall(server.output())) == 3, 30), server.output()[-2000:]
    lines = finished.findall(server.output())
    prompt_len = int(lines[0][1])
    cached = sorted(int(c) for _, _, c in lines)
    assert cached[0] == 0 and cached[1] == cached[2] > prompt_len // 2, lines  # one computed it, two shared


def test_streamed_n_choices_equal_the_whole_answer(client):
    kwargs = dict(model="tiny", messages=QUESTION, max_tokens=10, n=2, seed=11, temperature=1.0, extra_body={"top_k": 0})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    texts = {0: "", 1: ""}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_batch_of_prompts_and_echo(client, reference):
    prompts = ["The capital of France", "Once upon a time"]
    answer = client.completions.create(model="tiny", prompt=prompts, max_tokens=8, temperature=0, n=2, echo=True)
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    for c in answer.choices:
        prompt = prompts[c.index // 2]
        ids = greedy_ref(reference, reference.tokenizer(prompt)["input_ids"], 8)
        assert c.text == prompt + reference.text(ids)
    assert answer.usage.prompt_tokens == sum(len(reference.tokenizer(p)["input_ids"]) for p in prompts)
    ids_batch = client.completions.create(model="tiny", prompt=[[5, 17, 101], [9, 9, 9, 40]], max_tokens=6, temperature=0)
    assert [c.text for c in ids_batch.choices] == [reference.text(greedy_ref(reference, p, 6))
                                                  for p in ([5, 17, 101], [9, 9, 9, 40])]
    streamed = list(client.completions.create(model="tiny", prompt=prompts[0], max_tokens=8, temperature=0,
                                              echo=True, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == answer.choices[0].text


def test_tokenize_and_detokenize_in_vllms_shapes(server, reference):
    text = "Hello world, how are you?"
    r = httpx.post(server.url + "/tokenize", headers=AUTH, json={"model": "tiny", "prompt": text, "return_token_strs": True})
    body = r.json()
    ids = reference.tokenizer(text)["input_ids"]
    assert r.status_code == 200 and body["tokens"] == ids and body["count"] == len(ids), body
    assert body["max_model_len"] == MAX_MODEL_LEN and body["token_strs"] == reference.tokenizer.convert_ids_to_tokens(ids)
    chat = httpx.post(server.url + "/tokenize", headers=AUTH, json={"messages": QUESTION}).json()
    assert chat["tokens"] == reference.chat_ids(QUESTION) and chat["token_strs"] is None
    back = httpx.post(server.url + "/detokenize", headers=AUTH, json={"model": "tiny", "tokens": ids}).json()
    assert back == {"prompt": reference.tokenizer.decode(ids)}
    for route, body in (("/tokenize", {"prompt": 5}), ("/detokenize", {"tokens": [-1]}), ("/tokenize", {})):
        r = httpx.post(server.url + route, headers=AUTH, json=body)
        assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
    assert httpx.post(server.url + "/tokenize", json={"prompt": text}).status_code == 401
    assert httpx.post(server.url + "/tokenize", headers=AUTH, json={"model": "nope", "prompt": text}).status_code == 404
