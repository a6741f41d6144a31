"""The HTTP admission gate (dashinfer_server/http/admission.py) on stand-in outputs: the bound on
held requests, the 429 it answers beyond it, and deadlines that end an answer and close its source
(which is what stops and releases the engine's request)."""
import asyncio
import math

import pytest

from dashinfer_client.frontend import Delta
from dashinfer_server.http.admission import Admission
from dashinfer_server.http.errors import ApiError


class Source:
    """A request's output: `n` pieces, then (endless) nothing until closed; records its closing."""

    def __init__(self, n=1, endless=False):
        self.n, self.endless, self.closed = n, endless, False

    async def pieces(self):
        try:
            for i in range(self.n):
                yield Delta(f"p{i}")
            if self.endless:
                await asyncio.Event().wait()
            yield Delta(finish_reason="length")
        finally:
            self.closed = True


async def drain(it):
    return [p async for p in it]


def test_the_bound_refuses_with_429_and_retry_after_then_admits_again():
    async def scenario():
        gate = Admission(max_batch=2, max_waiting=1)
        held = [gate.admit({}, Source(endless=True).pieces()) for _ in range(3)]
        assert gate.held == 3 and gate.waiting == 1
        with pytest.raises(ApiError) as refused:
            gate.admit({}, Source().pieces())
        e = refused.value
        assert e.http_status == 429 and e.headers == {"Retry-After": "1"} and gate.refused == 1
        assert e.body()["error"]["code"] == "rate_limit_exceeded" and set(e.body()["error"]) == {
            "message", "type", "param", "code"}
        await held[0].__anext__()
        await held[0].aclose()  # a client that went away: its place is free again
        assert gate.held == 2
        answer = await drain(gate.admit({}, Source(2).pieces()))
        assert [p.text for p in answer] == ["p0", "p1", ""] and answer[-1].finish_reason == "length"
        for it in held[1:]:
            await it.aclose()
        assert gate.held == 0
    asyncio.run(scenario())


def test_a_deadline_ends_the_answer_with_timeout_and_closes_its_source():
    async def scenario():
        gate = Admission(max_batch=1, max_waiting=0, default_timeout=30.0)
        source = Source(1, endless=True)
        answer = await drain(gate.admit({"timeout": 0.05}, source.pieces()))
        assert [(p.text, p.finish_reason) for p in answer] == [("p0", None), ("", "timeout")]
        assert source.closed and gate.timed_out == 1 and gate.held == 0
        quick = Source(1)  # the default deadline (30 s) is far: the answer ends on its own
        assert (await drain(gate.admit({}, quick.pieces())))[-1].finish_reason == "length"
        endless = Source(0, endless=True)
        gate.default_timeout = 0.05
        assert [p.finish_reason for p in await drain(gate.admit({}, endless.pieces()))] == ["timeout"]
        assert endless.closed
    asyncio.run(scenario())


@pytest.mark.parametrize("value", ["soon", -1, 0, True, math.nan, math.inf, [5]])
def test_a_timeout_that_is_not_a_positive_number_is_a_400(value):
    async def scenario():
        gate = Admission(max_batch=1)
        with pytest.raises(ApiError) as bad:
            gate.admit({"timeout": value}, Source().pieces())
        assert bad.value.http_status == 400 and bad.value.param == "timeout" and gate.held == 0
    asyncio.run(scenario())


def test_a_full_server_still_answers_a_wrong_key_401_not_429():
    """The early gate refuses only requests that would pass the API key check: a client with a
    wrong key learns that (401 from the route), not that the server is busy."""
    async def scenario():
        gate = Admission(max_batch=1, max_waiting=0)
        held = gate.admit({}, Source(endless=True).pieces())
        reached, sent = [], []

        async def route(scope, receive, send):
            reached.append(dict(scope["headers"]).get(b"x-api-key"))

        async def send(message):
            sent.append(message)
        app = gate.refuse_early(route, {"/v1/messages"}, authorized=lambda h: h.get("x-api-key") == "right")
        for key in (b"wrong", b"right"):
            scope = {"type": "http", "method": "POST", "path": "/v1/messages", "headers": [(b"x-api-key", key)]}
            await app(scope, None, send)
        assert reached == [b"wrong"]  # the route (and its key check) saw the wrong key
        assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [429]
        await held.aclose()
    asyncio.run(scenario())


def test_a_request_cancelled_while_the_engine_starts_it_is_finished_once_started():
    """A deadline (or a client leaving) that cancels the request while served.start runs in its
    thread: the start completes there, and what it started is stopped and released, not left
    running with no one to read it."""
    import threading
    from dashinfer_server.http import generate

    class Served:
        def __init__(self):
            self.go, self.finished = threading.Event(), threading.Event()
            self.finished_with = None

        def start(self, job):
            self.go.wait(10)
            return "handle-1", "queue-1"

        def finish(self, handle, queue, request_id=""):
            self.finished_with = (handle, queue, request_id)
            self.finished.set()

    served = Served()

    async def scenario():
        loop = asyncio.get_running_loop()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(generate._started(loop, served, None, "req-7"), 0.05)
        served.go.set()  # the engine's start returns only now
        assert await loop.run_in_executor(None, served.finished.wait, 10)
    asyncio.run(scenario())
    assert served.finished_with == ("handle-1", "queue-1", "req-7")
