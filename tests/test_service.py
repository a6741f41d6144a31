"""The gRPC service in-process (no subprocess): addresses, draining, the grace period, the wire
format of refusals, and `python -m dashinfer_server`'s argument checks."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest

import dashinfer_client as allspark
from dashinfer_client import AsStatus, GenerateRequestStatus as S
from dashinfer_client.proto import load
from dashinfer_server.engine import Engine
from dashinfer_client.proto.wire import apply_event, default_address, unix_socket_path
from dashinfer_client.result_queue import ResultQueue
from dashinfer_server.grpc_server import Server, serve
from dashinfer_server.service import DashInferService
from dashinfer_server.sessions import ClientSession

pb, pb_grpc = load()
PROMPT = [5, 17, 101, 33, 7, 250, 64, 12]


def _config(tiny_model):
    return (allspark.AsModelRuntimeConfigBuilder().model_name("tiny").model_dir(tiny_model, "tiny")
            .max_length(4096).max_batch(4).build())


@pytest.fixture
def server(tiny_model, tmp_path):
    engine = Engine()
    assert engine.install_model(_config(tiny_model)) == 0 and engine.start_model("tiny") == 0
    srv = serve(engine, f"unix://{tmp_path}/s.sock")
    yield srv
    srv.stop()
    engine.release_model("tiny")


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.DashInferStub(channel)


def _start(stub, max_length=40, **fields):
    gen = allspark.ASGenerationConfigBuilder().update({"top_k": 1, "max_length": max_length,
                                                       "early_stopping": False}).build().to_dict()
    request = dict(model_name="tiny", input_ids=PROMPT, input_shape=[len(PROMPT)],
                   generation_config_json=json.dumps(gen))
    request.update(fields)
    return stub.StartRequest(pb.StartRequestRequest(**request))


def test_default_address_is_a_private_unix_socket():
    address = default_address()
    path = unix_socket_path(address)
    assert address.startswith("unix://") and path.startswith("/") and str(os.getpid()) in path
    assert unix_socket_path("unix:relative.sock") == "relative.sock"
    assert unix_socket_path("127.0.0.1:5000") is None


def test_loopback_port_chosen_by_the_os():
    srv = serve(Engine(), "127.0.0.1:0")
    try:
        host, port = srv.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        with grpc.insecure_channel(srv.address) as channel:
            health = pb_grpc.DashInferStub(channel).Health(pb.Empty(), timeout=5)
        assert health.ready and health.pid == os.getpid() and health.world_size == 1
    finally:
        srv.stop()


def test_socket_of_a_live_server_is_not_taken_but_a_stale_one_is(tmp_path):
    address = f"unix://{tmp_path}/x.sock"
    first = serve(Engine(), address)
    try:
        with pytest.raises(RuntimeError, match="in use by a running server"):
            Server(Engine(), address).start()
    finally:
        first.stop()
    assert not os.path.exists(tmp_path / "x.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "x.sock"))
    stale.close()  # the file stays, nobody listens: what a killed server leaves
    second = serve(Engine(), address)
    assert oct(os.stat(tmp_path / "x.sock").st_mode & 0o777) == oct(0o660)
    second.stop()


def test_a_file_that_is_not_a_socket_is_never_deleted(tmp_path):
    """A refused connect on a regular file is not a stale socket: the server refuses the address."""
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    with pytest.raises(RuntimeError, match="not a socket"):
        Server(Engine(), f"unix:{precious}").start()
    assert precious.read_text() == "keep me"


def test_stream_carries_start_tokens_status_and_stats(stub):
    events = list(_start(stub, 40))
    first, last = events[0], events[-1]
    assert first.started.status == 0 and first.handle > 0
    assert sum(len(e.ids) for e in events) == 40 - len(PROMPT)
    assert last.status == S.GenerateFinished and last.stats["finished_time"] > 0
    # every event between the first and the last says Generating: as DashInfer's queues, a
    # request goes from Init to Generating with its first token, never through ContextFinished
    assert {e.status for e in events[1:-1]} <= {S.Generating}
    # Statistics go as changes: the prompt length once (at the start); a value goes only when it
    # differs from the one the stream sent last, so how the tokens batch into events (the pace,
    # a busy machine) changes how often the latest token time goes, never its order.
    assert [e.stats["context_token_length"] for e in events if "context_token_length" in e.stats] == [len(PROMPT)]
    assert first.stats["context_token_length"] == len(PROMPT) and first.stats["arrival_time"] > 0
    sent = {}
    for e in events:
        for key, value in e.stats.items():
            assert sent.get(key) != value, f"{key} sent again unchanged"
            sent[key] = value
    token_times = [e.stats["last_token_time"] for e in events if e.stats.get("last_token_time")]  # 0: none yet
    assert token_times == sorted(token_times) and token_times[0] >= first.stats["arrival_time"]
    assert sent["last_token_time"] >= sent["first_token_time"] > 0
    assert stub.ReleaseRequest(pb.RequestRef(model_name="tiny", id=first.handle)).status == 0


DEEP_JSON = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on it


@pytest.mark.parametrize("fields, status, words", [
    ({"generation_config_json": "{not json"}, AsStatus.ALLSPARK_PARAM_ERROR, "start_request"),
    ({"input_shape": [3]}, AsStatus.ALLSPARK_PARAM_ERROR, "do not fill the shape"),
    ({"model_name": "nope"}, AsStatus.ALLSPARK_PARAM_ERROR, "unknown model 'nope'"),
    ({"input_ids": [], "input_shape": [0]}, AsStatus.ALLSPARK_EMPTY_REQUEST, "empty"),
    ({"generation_config_json": DEEP_JSON}, AsStatus.ALLSPARK_PARAM_ERROR, "nested too deeply"),
    ({"input_ids_json": DEEP_JSON}, AsStatus.ALLSPARK_PARAM_ERROR, "nested too deeply"),
])
def test_refused_start_is_one_event_with_status_and_reason(stub, fields, status, words):
    events = list(_start(stub, **fields))
    assert len(events) == 1
    assert events[0].started.status == status and words in events[0].started.message


def test_bad_runtime_config_is_a_param_error(stub):
    for text in ("[]", "{nope", DEEP_JSON, json.dumps({"model_name": "x", "max_batch": 0})):
        reply = stub.InstallModel(pb.InstallModelRequest(runtime_config_json=text))
        assert reply.status == AsStatus.ALLSPARK_PARAM_ERROR and "bad runtime config" in reply.message


def test_draining_refuses_new_work_and_tells_sessions(server, stub):
    session = stub.Session(pb.SessionRequest())
    assert next(session).instance_id == server.service.instance_id
    server.service.begin_draining("the server is shutting down: no new requests are accepted")
    assert next(session).shutting_down
    refused = list(_start(stub))
    assert refused[0].started.status == AsStatus.ALLSPARK_REQUEST_DENIED
    assert "shutting down" in refused[0].started.message
    assert stub.StartModel(pb.ModelRef(model_name="tiny")).status == AsStatus.ALLSPARK_REQUEST_DENIED
    assert not stub.Health(pb.Empty()).ready and stub.GetStats(pb.Empty()).draining
    session.cancel()


def test_shutdown_interrupts_what_outlives_the_grace_period(server, stub):
    call = _start(stub, 4096)
    handle = next(call).handle
    assert next(call).ids
    events = []
    reader = threading.Thread(target=lambda: events.extend(call))
    reader.start()
    server.shutdown(grace=0.05)
    reader.join(10)
    assert events and events[-1].status == S.GenerateInterrupted
    assert "grace period" in events[-1].error
    assert sum(len(e.ids) for e in events) < 4096 - len(PROMPT)
    assert not os.path.exists(server.socket_path) and handle > 0


def test_session_end_releases_finished_requests(server, stub):
    session = stub.Session(pb.SessionRequest())
    sid = next(session).session_id
    streams = [list(_start(stub, 20, session_id=sid)) for _ in range(2)]  # read to the end
    handles = [events[0].handle for events in streams]
    tiny = lambda: stub.GetStats(pb.Empty()).models[0]  # noqa: E731
    assert tiny().requests == 2
    mine = [("dashinfer-session", sid)]  # the session's requests are released by the session only
    assert stub.ReleaseRequest(pb.RequestRef(model_name="tiny", id=handles[0]), metadata=mine).status == 0
    session.cancel()
    deadline = time.monotonic() + 10
    while tiny().requests and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tiny().requests == 0 and stub.GetStats(pb.Empty()).sessions == 0


def test_main_checks_its_arguments():
    run = subprocess.run([sys.executable, "-m", "dashinfer_server", "--model-dir", "/x"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 78 and "go together" in run.stderr  # EX_CONFIG: systemd does not restart


def test_main_fails_clearly_on_a_model_it_cannot_load(tmp_path):
    run = subprocess.run([sys.executable, "-m", "dashinfer_server", "--address", f"unix://{tmp_path}/m.sock",
                          "--model-dir", str(tmp_path), "--model-prefix", "nothing", "--model-name", "m"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 78 and "no serialized model at" in run.stderr and "ready" not in run.stdout


def test_main_serves_a_model_given_on_the_command_line_and_drains_on_sigterm(tiny_model, tmp_path):
    """The systemd use: the model comes with the flags, clients connect by address."""
    address = f"unix://{tmp_path}/svc.sock"
    server = subprocess.Popen([sys.executable, "-m", "dashinfer_server", "--address", address,
                               "--model-dir", tiny_model, "--model-prefix", "tiny", "--model-name", "svc",
                               "--max-length", "256", "--max-batch", "2", "--log-level", "WARNING"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = server.stdout.readline()
        assert ready.startswith("dashinfer_server: ready on " + address), server.stderr.read()
        with allspark.ClientEngine(address) as client:
            assert client.get_stats()["models"]["svc"]["state"] == "Running"
            # No loader given: the tokenizer comes from the model files the server names.
            status, handle, queue = client.start_request_text(
                "svc", None, "hello", allspark.ASGenerationConfigBuilder().update(
                    {"top_k": 1, "max_length": 40, "early_stopping": False}))
            assert status == AsStatus.ALLSPARK_SUCCESS, client.last_error
            assert client.sync_request("svc", handle) == 0 and queue.GenerateStatus() == S.GenerateFinished
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
        assert not os.path.exists(tmp_path / "svc.sock")
    finally:
        server.kill()
        server.wait()


# ---- events on the session stream -----------------------------------------------------------------

def _session_events(session, handles):
    """The RequestEvent messages of the session stream by handle, read until every handle has its final one."""
    got = {h: [] for h in handles}
    while any(not e or e[-1].status not in (S.GenerateFinished, S.GenerateInterrupted) for e in got.values()):
        for event in next(session).requests:
            got.setdefault(event.handle, []).append(event)
    return got


def test_session_carries_the_events_of_many_requests_batched(stub):
    session = stub.Session(pb.SessionRequest())
    sid = next(session).session_id
    lengths = [30, 45, 60]
    replies = [list(_start(stub, n, session_id=sid, events_on_session=True)) for n in lengths]
    assert all(len(r) == 1 and r[0].started.status == 0 for r in replies)  # the reply only
    handles = [r[0].handle for r in replies]
    got = _session_events(session, handles)
    for handle, n in zip(handles, lengths):
        events = got[handle]
        assert sum(len(e.ids) for e in events) == n - len(PROMPT)
        assert events[-1].status == S.GenerateFinished and events[-1].stats["finished_time"] > 0
        assert [e.status for e in events] == sorted(e.status for e in events)
    direct = list(_start(stub, 60))  # the same request on its own stream gives the same tokens
    assert [i for e in direct for i in e.ids] == [i for e in got[handles[2]] for i in e.ids]
    stats = stub.GetStats(pb.Empty())
    assert stats.streams == 0 and stats.models[0].requests == 4
    session.cancel()


def test_a_session_that_ends_stops_and_releases_its_routed_requests(stub):
    session = stub.Session(pb.SessionRequest())
    sid = next(session).session_id
    handle = list(_start(stub, 4000, session_id=sid, events_on_session=True))[0].handle
    while not any(e.handle == handle and e.ids for e in next(session).requests):
        pass  # generating
    tiny = lambda: stub.GetStats(pb.Empty()).models[0]  # noqa: E731
    assert tiny().running == 1
    session.cancel()  # the client went away mid-generation
    deadline = time.monotonic() + 10
    while (tiny().requests or tiny().running) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tiny().requests == 0 and tiny().running == 0
    reply = stub.StopRequest(pb.RequestRef(model_name="tiny", id=handle))
    assert reply.status == AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID


def test_events_on_session_without_a_session_stream_on_their_own_call(stub):
    events = list(_start(stub, 30, session_id="no-such-session", events_on_session=True))
    assert sum(len(e.ids) for e in events) == 30 - len(PROMPT)
    assert events[-1].status == S.GenerateFinished
    assert stub.ReleaseRequest(pb.RequestRef(model_name="tiny", id=events[0].handle)).status == 0


@pytest.mark.parametrize("on_session", [True, False], ids=["routed", "own-stream"])
def test_a_session_ending_while_its_request_starts_leaves_nothing_held(server, stub, monkeypatch, on_session):
    """The session ends after StartRequest looked it up and before the request is registered (a
    deterministic interleaving: the hook ends it there). The request had been started and added
    to the ended session, which nobody would release: it ran to max_length and stayed held."""
    session = stub.Session(pb.SessionRequest())
    sid = next(session).session_id
    service = server.service
    start = service._start

    def session_ends_first(*args):
        service._session_ended(sid)
        yield from start(*args)

    monkeypatch.setattr(service, "_start", session_ends_first)
    events = list(_start(stub, 4000, session_id=sid, events_on_session=on_session))
    assert events[0].started.status == AsStatus.ALLSPARK_RUNTIME_ERROR
    assert "session" in events[0].started.message
    tiny = stub.GetStats(pb.Empty()).models[0]
    assert tiny.requests == 0 and tiny.running == 0 and not service._held
    session.cancel()


@pytest.mark.parametrize("ends_in", ["GetNoWait", "RequestStatInfo"])
def test_a_request_ending_while_its_session_event_is_made_loses_no_token_nor_statistic(ends_in):
    """The model loop pushes the last token and ends the request while the session's writer makes
    the request's event (a deterministic interleaving: the queue does it once its tokens, or its
    statistics, are read). The event had read the status last: it went out final without that
    token, which the client's queue, ended, then dropped; or without the final statistics
    (finished_time 0 for good, seen in test_session_carries_the_events_of_many_requests_batched)."""
    class EndsMeanwhile(ResultQueue):
        ending = False

        def read(self, what):
            result = getattr(super(), what)()
            if self.ending and what == ends_in:
                self.ending = False
                self.push([9])
                self.set_status(S.GenerateFinished)
            return result

        def GetNoWait(self):
            return self.read("GetNoWait")

        def RequestStatInfo(self):
            return self.read("RequestStatInfo")

    service = DashInferService(engine=None)
    try:
        session, queue, mirror = ClientSession(), EndsMeanwhile("1"), ResultQueue("1")
        session.route(("tiny", 1), queue, {})
        queue.push([5])
        queue.ending = True
        for _ in range(3):
            for event in service._routed_events(session):
                apply_event(event, mirror)
        assert mirror.GenerateStatus() == S.GenerateFinished
        assert mirror.GetNoWait().ids_from_generate == [5, 9]
        assert mirror.RequestStatInfo()["finished_time"] > 0
        assert not session.routed  # its last event went out: it left the session's routing
    finally:
        service.close_sessions()
