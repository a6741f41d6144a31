"""`dashinfer serve --tp 2` (two ranks on simulated NUMA nodes) through the official openai client
and raw HTTP: answers equal the in-process Engine's, the SSE bytes follow OpenAI's format, errors
have OpenAI's shape and status, /metrics counts what was served, /health follows the rank group.
"""
import json
import os
import signal

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.group_helpers import rank_pids
from tests.http_server import API_KEY, MAX_MODEL_LEN, http_status, serving, wait_for
from tests.test_gguf_tokenizer import reference_bytes

QUESTION = [{"role": "user", "content": "Hello, who are you?"}]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    with serving(tiny_model, str(tmp_path_factory.mktemp("serve") / "serve.log"), "--api-key", API_KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def test_health_is_503_while_loading_then_200(server):
    assert server.health_seen[0] == 503 and server.health_seen[-1] == 200, server.health_seen


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_equals_the_engine(client, tiny_reference):
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=24, temperature=0)
    ids, _, _, reason = tiny_reference.generate(tiny_reference.chat_ids(QUESTION), 24)
    assert answer.choices[0].message.content == tiny_reference.text(ids)
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].finish_reason == ("length" if reason == "length" else "stop")
    assert answer.usage.prompt_tokens == len(tiny_reference.chat_ids(QUESTION))
    assert answer.usage.completion_tokens == len(ids)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + len(ids)


def test_text_completion_of_token_ids_and_max_completion_tokens(client, tiny_reference):
    prompt = [5, 17, 101, 33, 7, 250, 64]
    answer = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0)
    ids, _, _, _ = tiny_reference.generate(prompt, 16)
    assert answer.choices[0].text == tiny_reference.text(ids) and answer.usage.completion_tokens == len(ids)
    chat = client.chat.completions.create(model="tiny", messages=QUESTION, max_completion_tokens=5, temperature=0)
    assert chat.usage.completion_tokens <= 5


def test_streamed_chat_equals_the_whole_answer(client):
    whole = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1


def test_logprobs_equal_the_engine(client, tiny_reference):
    """The engine's logprobs, each token with its own bytes (tests/test_http_logprobs.py checks
    characters spread over tokens on the default model)."""
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=12, temperature=0,
                                            logprobs=True, top_logprobs=3)
    ids, lps, tops, _ = tiny_reference.generate(tiny_reference.chat_ids(QUESTION), 12, logprobs=True, top_logprobs=3)
    hf = tiny_reference.hf_tokenizer()
    content = answer.choices[0].logprobs.content
    assert len(content) == len(ids)
    for entry, i, lp, top in zip(content, ids, lps, tops):
        assert entry.bytes == list(reference_bytes(hf, False, i))
        assert entry.logprob == pytest.approx(lp, abs=1e-4)  # two ranks sum in another order
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([p for _, p in top], abs=1e-4)
    text = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0, logprobs=2)
    lp = text.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == text.usage.completion_tokens
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[-1] <= len(text.choices[0].text)


def test_stop_strings_end_the_answer_before_them(client, tiny_reference):
    ids, _, _, _ = tiny_reference.generate(tiny_reference.chat_ids(QUESTION), 24)
    full = tiny_reference.text(ids)
    stop = next(ch for ch in full[3:] if ch.strip() and ch != "\ufffd")
    for stream in (False, True):
        kw = dict(model="tiny", messages=QUESTION, max_tokens=24, temperature=0, stop=[stop, "never-there"])
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kw))
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            answer = client.chat.completions.create(**kw)
            text, reason = answer.choices[0].message.content, answer.choices[0].finish_reason
        assert text == full[:full.index(stop)] and reason == "stop"


def test_a_seed_reproduces_a_sampled_answer(client):
    def sample(seed):
        return client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=24, temperature=1.0,
                                              seed=seed).choices[0].message.content
    first = sample(1234)
    assert sample(1234) == first
    assert sample(4321) != first  # 24 tokens sampled from a random model: equal by chance ~never


def _raw_events(server, body):
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw())
    return raw


def test_sse_bytes_follow_openai_format(server):
    raw = _raw_events(server, {"model": "tiny", "messages": QUESTION, "max_tokens": 8, "temperature": 0,
                               "stream": True, "stream_options": {"include_usage": True}})
    assert raw.endswith(b"data: [DONE]\n\n")
    events = raw.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    bodies = []
    for event in events[:-2]:
        assert event.startswith("data: ") and "\n" not in event, event
        bodies.append(json.loads(event[len("data: "):]))
    assert all(b["object"] == "chat.completion.chunk" and b["model"] == "tiny" for b in bodies)
    assert bodies[0]["choices"][0]["delta"]["role"] == "assistant"
    reasons = [b["choices"][0]["finish_reason"] for b in bodies if b["choices"]]
    assert reasons[-1] in ("stop", "length") and all(r is None for r in reasons[:-1])
    assert bodies[-1]["choices"] == [] and bodies[-1]["usage"]["total_tokens"] > 0
    assert all(b["usage"] is None for b in bodies[:-1])


@pytest.mark.parametrize("body, status, words", [
    ({"model": "nope", "messages": QUESTION}, 404, ["'nope'", "tiny"]),
    ({"model": "tiny", "messages": QUESTION, "n": 0}, 400, ["'n'"]),
    ({"model": "tiny", "messages": QUESTION, "temperature": -1}, 400, ["temperature"]),
    ({"model": "tiny", "messages": QUESTION, "top_logprobs": 3}, 400, ["logprobs"]),
    ({"model": "tiny", "messages": QUESTION, "logprobs": True, "top_logprobs": 30}, 400, ["top_logprobs"]),
    ({"model": "tiny", "messages": QUESTION, "frequency_penalty": 2.5}, 400, ["frequency_penalty"]),
    ({"model": "tiny", "messages": "hi"}, 400, ["messages"]),
    ({"model": "tiny", "messages": QUESTION, "tools": [{"type": "function"}]}, 400, ["tools"]),
    ({"model": "tiny", "messages": QUESTION, "max_tokens": MAX_MODEL_LEN}, 400, [str(MAX_MODEL_LEN)]),
    ({"model": "tiny", "messages": QUESTION, "max_tokens": 0}, 400, ["'max_tokens'", "at least 1"]),
    ({"model": "tiny", "messages": QUESTION, "min_tokens": -3}, 400, ["'min_tokens'", "at least 0"]),
    ({"model": "tiny", "messages": QUESTION, "presence_penalty": 3}, 400, ["presence_penalty", "[-2, 2]"]),
    ({"model": "tiny", "messages": QUESTION, "ignore_eos": True}, 400, ["Unrecognized", "ignore_eos"]),
    ({"model": "tiny", "messages": QUESTION, "modalities": ["text", "audio"]}, 400, ["'modalities'"]),
    ({"model": "tiny", "messages": QUESTION, "stream_options": {"include_usage": True}}, 400, ["'stream'"]),
], ids=["unknown-model", "n", "temperature", "top_logprobs-alone", "top_logprobs-over", "frequency",
        "messages", "tools", "max_tokens", "max_tokens-0", "min_tokens", "presence", "unknown-key", "modalities",
        "stream_options-alone"])
def test_errors_have_openai_shape_and_status(server, body, status, words):
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                   timeout=120)
    error = r.json()["error"]
    assert r.status_code == status and set(error) == {"message", "type", "param", "code"}, r.text
    assert all(w in error["message"] for w in words), error
    assert not error["message"].startswith("start_request")  # the engine's reason, not a call the client made


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("/v1/completions", '{"model": "tiny", "prompt": "\\udfff"}'),
    ("/v1/messages", '{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "a\\ud800"}]}'),
    ("/v1/chat/completions", '{"model": "tiny", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ("/tokenize", '{"prompt": "\\ud800"}'),
    ("/v1/responses", '{"model": "tiny", "input": "hi", "max_output_tokens": 2, "metadata": {"k": NaN}}'),
    ("/v1/responses", '{"model": "tiny", "input": "hi", "max_output_tokens": 2, "user": -Infinity}'),
], ids=["chat-surrogate", "completions-surrogate", "messages-surrogate", "deep-nesting", "tokenize-surrogate",
        "responses-nan", "responses-infinity"])
def test_json_that_is_no_text_is_a_400_in_the_routes_shape(server, client, route, body):
    """A lone surrogate escape is valid JSON but no Unicode text (no tokenizer takes it), a body
    nested past Python's recursion limit cannot be read, and NaN / Infinity are no JSON (Python's
    reader takes them; an answer that echoes them cannot be written): all are the client's mistake."""
    r = httpx.post(server.url + route, content=body.encode(), timeout=120,
                   headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert any(w in error["message"] for w in ("surrogate", "nested", "NaN is not JSON", "Infinity is not JSON")), error
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2)  # still serving
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_anthropic_stop_sequences_must_be_a_list(server):
    r = httpx.post(server.url + "/v1/messages", timeout=120, headers={"x-api-key": API_KEY}, json={
        "model": "tiny", "max_tokens": 2, "stop_sequences": "x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["type"] == "error" and "stop_sequences" in r.json()["error"]["message"]


def test_max_completion_tokens_null_leaves_max_tokens(client):
    """Clients that send every field write unset ones as null: null is absent."""
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=3, temperature=0,
                                            extra_body={"max_completion_tokens": None, "min_tokens": 3})
    assert answer.usage.completion_tokens == 3 and answer.choices[0].finish_reason == "length"


def test_a_model_is_retrieved_by_its_id(client):
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_a_prompt_over_the_context_names_both_lengths(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=[7] * (MAX_MODEL_LEN + 10), max_tokens=4)
    assert str(MAX_MODEL_LEN + 10) in str(e.value) and str(MAX_MODEL_LEN) in str(e.value)


def test_api_key_is_checked_on_every_v1_route(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2)
    assert httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "a"}, timeout=120).status_code == 401
    # the scheme is case-insensitive (RFC 9110 11.1)
    assert http_status(server.url + "/v1/models", {"Authorization": f"bearer {API_KEY}"}) == 200
    assert http_status(server.url + "/health") == 200 and http_status(server.url + "/metrics") == 200


def _metrics(server) -> dict:
    """{(name, labels without model_name): value} of every sample."""
    text = httpx.get(server.url + "/metrics", timeout=120).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def test_metrics_count_what_was_served(server, client):
    before = _metrics(server)
    answers = [client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=4 + k, temperature=0)
               for k in range(3)]
    after = _metrics(server)

    def grew(name, labels=()):
        return after[(name, labels)] - before.get((name, labels), 0)
    assert grew("dashinfer_generation_tokens_total") == sum(a.usage.completion_tokens for a in answers)
    assert grew("dashinfer_prompt_tokens_total") == sum(a.usage.prompt_tokens for a in answers)
    assert grew("dashinfer_time_to_first_token_seconds_count") == 3
    assert grew("dashinfer_request_latency_seconds_count") == 3
    assert grew("dashinfer_inter_token_latency_seconds_count") == sum(a.usage.completion_tokens - 1 for a in answers)
    reasons = [a.choices[0].finish_reason for a in answers]
    for reason in set(reasons):
        assert grew("dashinfer_request_success_total", (("finish_reason", reason),)) == reasons.count(reason)
    assert after[("dashinfer_requests_running", ())] == 0 and after[("dashinfer_requests_waiting", ())] == 0
    total = after[("dashinfer_kv_cache_blocks_total", ())]
    assert total > 0 and after[("dashinfer_kv_cache_blocks_used", ())] <= total
    assert after[("dashinfer_rank_group_restarts_total", ())] == 0


def test_a_client_that_disconnects_mid_stream_frees_its_request(server):
    long_answer = MAX_MODEL_LEN - 64  # min_tokens keeps eos out: it would run to the end
    body = {"model": "tiny", "messages": QUESTION, "max_tokens": long_answer, "min_tokens": long_answer,
            "stream": True}
    done_before = len(server.finished_lines())
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert next(lines) == "" and next(lines).startswith("data: ")
    # the connection is closed: the server stops the request and releases it
    assert wait_for(lambda: len(server.finished_lines()) > done_before, 60), server.output()[-3000:]
    generated, reason = server.finished_lines()[done_before]
    assert reason == "stopped" and generated < long_answer
    assert wait_for(lambda: _metrics(server)[("dashinfer_requests_running", ())] == 0, 30)
    assert _metrics(server)[("dashinfer_kv_cache_blocks_used", ())] == 0


def test_a_client_that_gives_up_on_a_whole_answer_frees_its_request(server):
    long_answer = MAX_MODEL_LEN - 64
    body = {"model": "tiny", "messages": QUESTION, "max_tokens": long_answer, "min_tokens": long_answer}
    done_before = len(server.finished_lines())
    # 960 tokens of the tiny model take 0.3-1 s here (less with the stream's pace): leave long before
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=0.1,
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert wait_for(lambda: len(server.finished_lines()) > done_before, 60), server.output()[-3000:]
    generated, reason = server.finished_lines()[done_before]
    assert reason == "stopped" and generated < long_answer


def test_health_after_a_rank_is_killed(server, client):
    """Last in this module: the group restarts under the server."""
    assert http_status(server.url + "/health") == 200
    long_answer = MAX_MODEL_LEN - 64
    body = {"model": "tiny", "messages": QUESTION, "max_tokens": long_answer, "min_tokens": long_answer,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: {")
        rank1 = rank_pids(server.proc.pid)[1]
        os.kill(rank1, signal.SIGKILL)
        events = [line for line in lines if line]
    # the stream in flight ends with an error event, then [DONE]
    assert events[-1] == "data: [DONE]" and "error" in json.loads(events[-2][len("data: "):]), events[-3:]
    assert wait_for(lambda: http_status(server.url + "/health") == 503, 30), "a dead rank left /health at 200"
    assert wait_for(lambda: http_status(server.url + "/health") == 200, 120), server.output()[-3000:]
    assert _metrics(server)[("dashinfer_rank_group_restarts_total", ())] == 1
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=4, temperature=0)
    assert answer.usage.completion_tokens > 0
