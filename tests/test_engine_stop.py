"""stop_request, release_request and sync_request on both engines (`api_engine`): what each ends,
frees and keeps readable."""
import logging

from dashinfer_client import AsStatus
from tests.api_helpers import Finished, OK, alone, install, logged, prompt_of, still_serving
from tests.engine_helpers import collect, greedy


# ---- stop, release, sync ---------------------------------------------------------------------

def test_stop_request(api_engine, caplog):
    """A request stopped after 3 tokens ends at once with what it had, equal to the start of its
    alone ids; other requests go on. It may run 4000 tokens, so the stop always comes first.
    The engine logs its end (a ClientEngine relays its server's log lines)."""
    caplog.set_level(logging.INFO)
    engine, _, loader = api_engine
    long = install(api_engine, "tiny-long", max_length=4096)
    prompt = prompt_of(12, 6)
    try:
        with still_serving(api_engine):
            status, handle, queue = engine.start_request_ids(long, loader, prompt, greedy(4096))
            assert status == OK
            got = []
            while len(got) < 3:
                got += queue.Get().ids_from_generate
            assert engine.stop_request(long, handle) == OK
            assert queue.GenerateStatus() == Finished  # stop_request returns once it has ended
            assert queue.RequestStatInfo().finish_reason == "stopped"
            assert logged(caplog, "stopped: prompt 12 tokens (0 cached), generated", "TTFT",
                          level=logging.INFO)
            rest, _ = collect(queue)
            got += rest
            assert 3 <= len(got) == queue.GeneratedLength() < 4096 - len(prompt)
            n = min(len(got), 400)  # what the shared model's max_length 512 can check
            assert got[:n] == alone(api_engine, prompt, n)
            assert engine.stop_request(long, handle) == OK  # stopping an ended request is harmless
            assert engine.sync_request(long, handle) == OK
            assert queue.GenerateStatus() == Finished and queue.GeneratedLength() == len(got)
            assert engine.release_request(long, handle) == OK
    finally:
        assert engine.release_model(long) == OK


def test_stop_a_request_still_waiting(api_engine):
    """With max_batch 1 the second request waits behind the first; stopping it ends it empty and
    leaves the first undisturbed. The first may run 4000 tokens, so it is still running when the
    stop arrives even on a loaded machine (it is stopped in turn once checked)."""
    engine, _, loader = api_engine
    one = install(api_engine, "tiny-one-at-a-time", max_batch=1, max_length=4096)
    try:
        first, second = prompt_of(9, 7), prompt_of(11, 8)
        status, h1, q1 = engine.start_request_ids(one, loader, first, greedy(4096))
        status2, h2, q2 = engine.start_request_ids(one, loader, second, greedy(300))
        assert status == status2 == OK
        assert engine.stop_request(one, h2) == OK
        assert q2.GenerateStatus() == Finished and q2.GeneratedLength() == 0 and q2.Get() is None
        assert q2.RequestStatInfo().finish_reason == "stopped"
        assert q1.GenerateStatus() != Finished
        assert engine.stop_request(one, h1) == OK
        got = collect(q1)[0]
        n = min(len(got), 400)  # what the shared model's max_length 512 can check
        assert n and got[:n] == alone(api_engine, first, n)
    finally:
        assert engine.release_model(one) == OK


def test_release_request(api_engine):
    engine, name, loader = api_engine
    with still_serving(api_engine):
        status, handle, queue = engine.start_request_ids(name, loader, prompt_of(8, 9), greedy(400))
        assert status == OK
        assert queue.Get() is not None
        assert engine.release_request(name, handle) == OK
        assert queue.GenerateStatus() == Finished
        collect(queue)  # what was produced stays readable
        for call in (engine.stop_request, engine.release_request, engine.sync_request):
            assert call(name, handle) == AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID
        assert engine.sync_request(name, None) == OK  # does not wait for the released one


def test_sync_request(api_engine):
    engine, name, loader = api_engine
    started = []
    for i, new in enumerate((30, 120, 60)):
        prompt = prompt_of(10 + i, 10 + i)
        status, handle, queue = engine.start_request_ids(name, loader, prompt, greedy(len(prompt) + new))
        assert status == OK
        started.append((handle, queue))
    assert engine.sync_request(name, started[1][0]) == OK
    assert started[1][1].GenerateStatus() == Finished and started[1][1].GeneratedLength() == 120
    assert engine.sync_request(name, None) == OK
    assert [q.GenerateStatus() for _, q in started] == [Finished] * 3
    assert [q.GeneratedLength() for _, q in started] == [30, 120, 60]
    for handle, _ in started:
        assert engine.release_request(name, handle) == OK
