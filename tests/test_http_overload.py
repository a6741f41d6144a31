"""Overload of `dashinfer serve --tp 2`: 512 concurrent streaming clients against a bounded queue,
per-request deadlines, and /health answering within its 1 s contract while the engine is busy.

The references are the HTTP contract itself as a real client sees it (httpx over loopback): every
request either streams to `data: [DONE]` with a finish reason or is answered 429 in OpenAI's error
shape with Retry-After; the official openai client reads that 429 as its RateLimitError.
"""
import asyncio
import json
import re
import subprocess

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.http_server import Server, wait_for

MAX_BATCH, MAX_WAITING = 8, 24
CLIENTS = 512
BODY = {"model": "tiny", "prompt": [5, 17, 101, 33, 7], "max_tokens": 24, "temperature": 0,
        "min_tokens": 24, "stream": True}
HEALTH_BOUND_S = 1.0  # the service-level contract of /health (docs/http.md), not a speed figure


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    s = Server(tiny_model, str(tmp_path_factory.mktemp("overload") / "serve.log"),
               "--max-batch", str(MAX_BATCH), "--max-waiting", str(MAX_WAITING))
    try:
        s.wait_serving()
        yield s
    finally:
        code = s.stop()
    assert code == 0, s.output()


def metric(server, name) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics:\n{text}")


def process_figures(pid) -> tuple:
    """(threads, resident MiB) of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        status = f.read()
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))
    rss_kib = int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))
    return threads, rss_kib / 1024


async def stream_one(client, url, body):
    """('done', finish reason, saw [DONE]) or ('refused', Retry-After, error body)."""
    async with client.stream("POST", url, json=body) as r:
        if r.status_code == 429:
            return "refused", r.headers.get("retry-after"), json.loads(await r.aread())
        assert r.status_code == 200, (r.status_code, await r.aread())
        reasons, done = [], False
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                reasons += [c["finish_reason"] for c in json.loads(line[6:])["choices"] if c["finish_reason"]]
        return "done", reasons, done


async def crowd(url, n, body=BODY):
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0)) as client:
        return await asyncio.gather(*(stream_one(client, url, body) for _ in range(n)), return_exceptions=True)


class HealthProbe:
    """curl GET /health every 20 ms, in a process of its own (as a load balancer's probe is: the
    crowd's client loop in this process must not delay it), until stopped: codes and latencies."""

    def __init__(self, url):
        loop = (f"while :; do curl -s -o /dev/null --max-time 30 -w '%{{http_code}} %{{time_total}}\\n' "
                f"{url}/health; sleep 0.02; done")
        self.proc = subprocess.Popen(["bash", "-c", loop], stdout=subprocess.PIPE, text=True)
        self.codes, self.latencies = set(), []

    def stop(self):
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        for line in out.splitlines()[:-1]:  # the last may be cut by the terminate
            code, seconds = line.split()
            self.codes.add(int(code))
            self.latencies.append(float(seconds))


def test_512_streaming_clients_finish_or_are_refused_at_once(server):
    url = server.url + "/v1/completions"
    warm = asyncio.run(crowd(url, MAX_BATCH + MAX_WAITING))  # fills the server's thread pools once
    assert all(r[0] == "done" for r in warm), warm
    assert wait_for(lambda: metric(server, "dashinfer_http_requests_held") == 0, 60)
    idle_threads, idle_rss = process_figures(server.proc.pid)
    refused_before = metric(server, "dashinfer_http_requests_refused_total")
    finished_before = len(server.finished_lines())

    probe = HealthProbe(server.url)
    try:
        results = asyncio.run(crowd(url, CLIENTS))
    finally:
        probe.stop()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]  # no connection error, no other status
    done = [r for r in results if r[0] == "done"]
    refused = [r for r in results if r[0] == "refused"]
    assert len(done) + len(refused) == CLIENTS and len(done) >= MAX_BATCH + MAX_WAITING and refused
    for _, reasons, saw_done in done:
        assert saw_done and reasons == ["length"]
    for _, retry_after, body in refused:
        assert retry_after is not None and int(retry_after) >= 1
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == "rate_limit_exceeded" and "capacity" in body["error"]["message"]
    assert metric(server, "dashinfer_http_requests_refused_total") - refused_before == len(refused)
    # a refused request never reached the engine: one "finished" line per admitted request
    assert wait_for(lambda: len(server.finished_lines()) - finished_before == len(done), 30)
    worst = max(probe.latencies)
    print(f"\n{len(done)} streamed, {len(refused)} refused; /health worst {worst * 1000:.0f} ms over "
          f"{len(probe.latencies)} probes")
    assert probe.codes == {200}

    # back near idle: nothing held, threads and resident memory where they were before the crowd
    assert wait_for(lambda: metric(server, "dashinfer_http_requests_held") == 0, 30)
    assert metric(server, "dashinfer_http_queue_length") == 0
    assert wait_for(lambda: process_figures(server.proc.pid)[0] <= idle_threads + 2, 30), \
        (process_figures(server.proc.pid), idle_threads)
    threads, rss = process_figures(server.proc.pid)
    print(f"threads {idle_threads} -> {threads}, RSS {idle_rss:.0f} -> {rss:.0f} MiB")
    assert rss <= idle_rss * 1.1 + 32, (idle_rss, rss)
    assert worst < HEALTH_BOUND_S, f"/health took {worst:.2f} s at worst under the crowd"


def test_the_openai_client_reads_the_429_as_rate_limit_error(server):
    """While the server holds all it may, the official clients get RateLimitError (status 429):
    openai's on /v1/completions, anthropic's on /v1/messages (the same gate, Anthropic's error shape)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    messages = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)

    async def hold_and_ask():
        body = dict(BODY, max_tokens=600, min_tokens=600)
        held = asyncio.ensure_future(crowd(server.url + "/v1/completions", MAX_BATCH + MAX_WAITING, body))
        assert await asyncio.to_thread(
            wait_for, lambda: metric(server, "dashinfer_http_requests_held") == MAX_BATCH + MAX_WAITING, 60)
        try:
            with pytest.raises(openai.RateLimitError) as caught:
                await asyncio.to_thread(client.completions.create, model="tiny", prompt="hi", max_tokens=4)
            with pytest.raises(anthropic.RateLimitError) as caught_messages:
                await asyncio.to_thread(messages.messages.create, model="tiny", max_tokens=4,
                                        messages=[{"role": "user", "content": "hi"}])
        finally:
            results = await held
        return caught.value, caught_messages.value, results
    error, messages_error, results = asyncio.run(hold_and_ask())
    assert error.status_code == 429 and error.response.headers["retry-after"] == "1"
    assert messages_error.status_code == 429 and messages_error.response.headers["retry-after"] == "1"
    assert messages_error.body["type"] == "error" and messages_error.body["error"]["type"] == "rate_limit_error"
    assert all(r[0] == "done" for r in results)


def test_a_deadline_ends_the_request_with_finish_reason_timeout(server):
    """`timeout` in the body: the answer ends at it with finish_reason "timeout" and [DONE]; the
    engine's request is released (nothing stays held)."""
    body = dict(BODY, max_tokens=900, min_tokens=900, timeout=0.01)  # far less than 900 tokens take
    (kind, reasons, saw_done), = asyncio.run(crowd(server.url + "/v1/completions", 1, body))
    assert kind == "done" and saw_done and reasons == ["timeout"]
    whole = httpx.post(server.url + "/v1/completions", json=dict(body, stream=False), timeout=60).json()
    assert whole["choices"][0]["finish_reason"] == "timeout" and whole["usage"]["completion_tokens"] < 900
    unstarted = httpx.post(server.url + "/v1/completions", json=dict(body, stream=False, timeout=1e-9), timeout=60).json()
    assert unstarted["usage"]["prompt_tokens"] == len(BODY["prompt"]), unstarted  # the prompt counts, run or not
    message = httpx.post(server.url + "/v1/messages", timeout=60, json={
        "model": "tiny", "max_tokens": 900, "timeout": 0.01, "messages": [{"role": "user", "content": "hi"}]}).json()
    assert message["type"] == "message" and message["usage"]["output_tokens"] < 900, message
    assert metric(server, "dashinfer_http_requests_timed_out_total") >= 3
    assert wait_for(lambda: metric(server, "dashinfer_requests_running") == 0, 30)
    bad = httpx.post(server.url + "/v1/completions", json=dict(body, timeout="soon"), timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "timeout"


def test_more_choices_than_the_server_holds_is_a_400_not_a_429(server):
    """A request of more choices than max batch + max waiting could never be admitted: retrying
    (what a 429 asks) would not help."""
    r = httpx.post(server.url + "/v1/completions", timeout=60,
                   json=dict(BODY, stream=False, n=MAX_BATCH + MAX_WAITING + 1))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    assert "retry-after" not in r.headers


def test_a_queued_stream_whose_client_leaves_is_released_at_once(server):
    """A stream waiting for its first token behind a full batch is stopped and released when its
    client leaves, not when the batch makes room for it."""
    long_answer = 900

    async def hold_and_leave():
        body = dict(BODY, max_tokens=long_answer, min_tokens=long_answer)
        held = asyncio.ensure_future(crowd(server.url + "/v1/completions", MAX_BATCH, body))
        assert await asyncio.to_thread(
            wait_for, lambda: metric(server, "dashinfer_http_requests_held") == MAX_BATCH, 60)
        before = len(server.finished_lines())
        async with httpx.AsyncClient(timeout=60) as client:
            leaving = asyncio.ensure_future(client.post(server.url + "/v1/completions", json=body))
            assert await asyncio.to_thread(
                wait_for, lambda: metric(server, "dashinfer_http_requests_held") == MAX_BATCH + 1, 60)
            leaving.cancel()  # the connection closes while the request waits for its first token
            await asyncio.gather(leaving, return_exceptions=True)
        assert await asyncio.to_thread(wait_for, lambda: len(server.finished_lines()) > before, 60)
        first_done = server.finished_lines()[before]
        results = await held
        return first_done, results
    (generated, reason), results = asyncio.run(hold_and_leave())
    assert reason == "stopped" and generated < long_answer, (generated, reason)  # not a held one at its end
    assert all(r[0] == "done" for r in results)
    assert wait_for(lambda: metric(server, "dashinfer_http_requests_held") == 0, 60)


def test_health_answers_while_a_huge_prompt_is_tokenized(server):
    """The body's parse and tokenizing run off the event loop: a 3 MB prompt (refused as longer than
    the context once counted) does not hold /health past its contract."""
    probe = HealthProbe(server.url)
    try:
        r = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
            "model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hello " * 500_000}]})
    finally:
        probe.stop()
    assert r.status_code == 400 and "tokens" in r.json()["error"]["message"], r.text
    assert probe.codes == {200} and len(probe.latencies) > 3
    assert max(probe.latencies) < HEALTH_BOUND_S, f"/health took {max(probe.latencies):.2f} s at worst"
