"""Bounded resources of the gRPC service (docs/security.md): sessions and streams are capped with
a clear RESOURCE_EXHAUSTED (an AsStatus through ClientEngine), health answers while a client
hogs its streams, the server's threads come back when its clients leave, and a finished request
nobody released on a raw stream expires."""
import json
import os
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import dashinfer_client as allspark
from dashinfer_client import AsStatus
from dashinfer_client.client_engine import Unavailable
from dashinfer_client.proto import load
from dashinfer_server.grpc_server import serve
from dashinfer_server.limits import StreamLimits, WorkerPool
from tests.helpers import eventually

pb, pb_grpc = load()
PROMPT = [5, 17, 101, 33, 7, 250, 64, 12]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


def _start(stub, max_length, **fields):
    gen = allspark.ASGenerationConfigBuilder().update({"top_k": 1, "max_length": max_length,
                                                       "early_stopping": False}).build().to_dict()
    return stub.StartRequest(pb.StartRequestRequest(model_name="tiny", input_ids=PROMPT, input_shape=[len(PROMPT)],
                                                    generation_config_json=json.dumps(gen), **fields))


def _refused(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return e.value.details()


def test_stream_and_session_limits_answer_clearly_and_health_keeps_answering(engine):
    srv = serve(engine, "127.0.0.1:0", limits=StreamLimits(max_sessions=2, max_streams=3, max_streams_per_session=2))
    # two clients without a session, on connections of their own: two peers
    hog, other = (grpc.insecure_channel(srv.address, options=[("grpc.use_local_subchannel_pool", 1)])
                  for _ in range(2))
    try:
        stub, stub2 = pb_grpc.DashInferStub(hog), pb_grpc.DashInferStub(other)
        streams = [_start(stub, 4000) for _ in range(2)]
        assert all(next(s).started.status == 0 for s in streams)  # each holds a server thread now
        why = _refused(lambda: next(_start(stub, 4000)))
        assert "start_request:" in why and "--max-streams-per-session 2" in why
        assert health_pb2_grpc.HealthStub(hog).Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        assert stub.Health(pb.Empty(), timeout=10).ready
        streams.append(_start(stub2, 4000))
        assert all(next(s).started.status == 0 for s in streams[2:])
        assert "--max-streams 3" in _refused(lambda: next(_start(stub2, 4000)))
        assert stub.GetStats(pb.Empty()).models[0].requests == 3  # the refused ones never started

        # a ClientEngine over the limit: the status is an AsStatus, the reason the server's
        with allspark.ClientEngine(srv.address, startup_timeout=10) as client:
            status, handle, _ = client.start_request_ids("tiny", None, PROMPT, allspark.ASGenerationConfigBuilder()
                                                          .update({"top_k": 1, "max_length": 4000}))
            assert status == 0  # its events ride its session: no stream of its own
            assert client.sync_request("tiny", handle) == AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR
            assert "--max-streams 3" in client.last_error
            sessions = [pb_grpc.DashInferStub(hog).Session(pb.SessionRequest())]
            assert next(sessions[0]).session_id
            assert "--max-sessions 2" in _refused(lambda: next(stub2.Session(pb.SessionRequest())))
            with pytest.raises(Unavailable, match="--max-sessions 2"):
                allspark.ClientEngine(srv.address, startup_timeout=10)
            sessions[0].cancel()
            assert client.stop_request("tiny", handle) == 0
        for s in streams[:2]:
            s.cancel()  # the client leaves: its places are free again
        assert eventually(lambda: _starts(stub), 30)
    finally:
        for s in streams:
            s.cancel()
        hog.close()
        other.close()
        srv.stop()


def _starts(stub) -> bool:
    """Whether a request starts (False: refused over a limit)."""
    try:
        first = list(_start(stub, 20))[0]
        stub.ReleaseRequest(pb.RequestRef(model_name="tiny", id=first.handle))
        return first.started.status == 0
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        return False


def test_threads_come_back_when_64_clients_leave(tmp_path):
    address = f"unix://{tmp_path}/t.sock"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    server = subprocess.Popen([sys.executable, "-m", "dashinfer_server", "--address", address],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    threads = lambda: len(os.listdir(f"/proc/{server.pid}/task"))  # noqa: E731
    try:
        assert "ready" in server.stdout.readline()
        with grpc.insecure_channel(address) as channel:
            assert pb_grpc.DashInferStub(channel).Health(pb.Empty(), timeout=30).ready
        before = threads()
        channels = [grpc.insecure_channel(address) for _ in range(64)]
        sessions = [pb_grpc.DashInferStub(c).Session(pb.SessionRequest()) for c in channels]
        assert len({next(s).session_id for s in sessions}) == 64
        during = threads()
        assert during >= before + 63  # a thread per open session (one may be the idle one of Health)
        for c in channels:
            c.close()
        assert eventually(lambda: threads() <= before + 2, 60), f"{before} threads before, {during} " \
                                                               f"with 64 clients, {threads()} after they left"
    finally:
        server.terminate()
        server.wait(60)


def test_a_finished_raw_stream_request_nobody_released_expires(engine, tmp_path):
    srv = serve(engine, f"unix://{tmp_path}/e.sock", finished_request_ttl=0.5)
    try:
        with grpc.insecure_channel(srv.address) as channel:
            stub = pb_grpc.DashInferStub(channel)
            session = stub.Session(pb.SessionRequest())
            sid = next(session).session_id
            held = stub.GetStats(pb.Empty()).models[0].requests  # by other tests' clients
            raw = list(_start(stub, 20))[0].handle  # read to its end, never released
            owned = list(_start(stub, 20, session_id=sid))[0].handle  # a session's: released with it
            requests = lambda: stub.GetStats(pb.Empty()).models[0].requests - held  # noqa: E731
            assert requests() == 2
            assert eventually(lambda: requests() == 1, 30)
            reply = stub.ReleaseRequest(pb.RequestRef(model_name="tiny", id=raw))
            assert reply.status == AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID
            time.sleep(1.0)  # several ttls: the session's request stays
            mine = [("dashinfer-session", sid)]
            assert stub.ReleaseRequest(pb.RequestRef(model_name="tiny", id=owned), metadata=mine).status == 0
            session.cancel()
    finally:
        srv.stop()


def test_a_sync_whose_caller_gave_up_frees_its_place(engine, tmp_path):
    """A sync past its client's deadline (or cancelled, or disconnected) held its stream's place
    and thread until the request ended: a client polling sync with a deadline ran out of places."""
    srv = serve(engine, f"unix://{tmp_path}/d.sock")
    try:
        with grpc.insecure_channel(srv.address) as channel:
            stub = pb_grpc.DashInferStub(channel)
            session = stub.Session(pb.SessionRequest())
            mine = [("dashinfer-session", next(session).session_id)]
            handle = next(_start(stub, 4000, session_id=mine[0][1], events_on_session=True)).handle
            running = lambda: stub.GetStats(pb.Empty()).models[0].running  # noqa: E731
            for ref in (pb.RequestRef(model_name="tiny", id=handle), pb.RequestRef(model_name="tiny")):
                with pytest.raises(grpc.RpcError) as gave_up:
                    stub.SyncRequest(ref, metadata=mine, timeout=0.3)
                assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert eventually(lambda: not srv.service.limits.streams, 5) and running() == 1
            assert stub.StopRequest(pb.RequestRef(model_name="tiny", id=handle), metadata=mine).status == 0
            assert stub.SyncRequest(pb.RequestRef(model_name="tiny", id=handle), metadata=mine, timeout=10).status == 0
            session.cancel()
    finally:
        srv.stop()


def test_worker_pool_runs_everything_and_shrinks_when_idle():
    pool = WorkerPool(max_workers=4, idle_s=0.2)
    results = [pool.submit(pow, 2, i) for i in range(100)]
    assert [f.result(10) for f in results] == [2 ** i for i in range(100)]
    assert 1 <= pool.threads <= 4
    failed = pool.submit(int, "x")
    with pytest.raises(ValueError):
        failed.result(10)
    assert eventually(lambda: pool.threads == 0, 10)
    assert pool.submit(len, "abc").result(10) == 3  # a new thread when work comes again
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(len, "")
