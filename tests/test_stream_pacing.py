"""The session stream's pace (sessions.py, service.py): first tokens and ends go at once, the
rest may ride the next event."""
import pytest

from dashinfer_client import GenerateRequestStatus as S


def test_session_marks_first_tokens_and_ends_urgent():
    from dashinfer_client.result_queue import ResultQueue
    from dashinfer_server.sessions import ClientSession
    session, queue = ClientSession(), ResultQueue("r")
    session.route(("m", 1), queue, {})
    assert session.urgent()  # routed, nothing delivered yet: its first token must not wait
    session.take_dirty()
    queue.push(5)
    assert session.urgent()
    session.take_dirty()
    session.delivered(("m", 1))
    queue.push(6)
    assert not session.urgent()  # a later token may ride the next event
    queue.set_status(S.GenerateFinished)
    assert session.urgent()  # the end goes at once
    session.take_dirty()
    assert not session.urgent()


def test_first_tokens_and_ends_cut_the_pace_short():
    """The writer waits out the pace on `hurry`: a first token or an end sets it, a later token
    does not (that one rides the next event)."""
    from dashinfer_client.result_queue import ResultQueue
    from dashinfer_server.sessions import ClientSession
    session, queue = ClientSession(), ResultQueue("r")
    session.route(("m", 1), queue, {})
    queue.push(5)
    assert session.hurry.is_set()
    session.hurry.clear()
    session.take_dirty()
    session.delivered(("m", 1))
    queue.push(6)
    assert session.wake.is_set() and not session.hurry.is_set()
    queue.set_status(S.GenerateFinished)
    assert session.hurry.is_set()
    session.hurry.clear()
    session.interrupt()  # the service closes: the writer stops waiting
    assert session.hurry.is_set() and session.wake.is_set()


def test_stream_interval_setting(monkeypatch):
    from dashinfer_server.sessions import DEFAULT_STREAM_INTERVAL_MS, stream_interval_s
    monkeypatch.delenv("DASHINFER_STREAM_INTERVAL_MS", raising=False)
    assert stream_interval_s() == DEFAULT_STREAM_INTERVAL_MS / 1000
    monkeypatch.setenv("DASHINFER_STREAM_INTERVAL_MS", "0")
    assert stream_interval_s() == 0
    for bad in ("-1", "soon"):
        monkeypatch.setenv("DASHINFER_STREAM_INTERVAL_MS", bad)
        with pytest.raises(ValueError, match="DASHINFER_STREAM_INTERVAL_MS"):
            stream_interval_s()
