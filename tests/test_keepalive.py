"""gRPC keepalive (DASHINFER_KEEPALIVE_MS, DASHINFER_KEEPALIVE_TIMEOUT_MS): a client host that
vanishes without closing its TCP connection (power loss, a partition, a NAT that dropped it) loses
its session, its --max-sessions place and its requests within the keepalive bound, not gRPC's two
hours; a live client idle over many periods keeps its session (no GOAWAY "too_many_pings").

The vanishing is a TCP proxy that stops forwarding both ways and closes nothing: bytes sent to it
are acknowledged by its kernel and never answered."""
import socket
import threading
import time

import pytest

import dashinfer_client as allspark
from dashinfer_client import GenerateRequestStatus as S
from dashinfer_server.grpc_server import serve
from tests.helpers import eventually

PROMPT = [5, 17, 101, 33, 7, 250, 64, 12]
PERIOD_MS = 300  # the keepalive period and timeout of these tests
BOUND_S = 10  # a vanished peer is let go within about 0.6 s; the rest is a busy test machine's slack


class Blackhole:
    """A TCP proxy to `target` ("host:port") whose blackhole() stops forwarding in both directions
    without closing a socket."""

    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.sockets = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while data := src.recv(65536):
                if self.forwarding.is_set():
                    dst.sendall(data)
                else:
                    self.forwarding.wait()  # blackholed: read no more (nor send what came meanwhile)
        except OSError:
            return

    def blackhole(self):
        self.forwarding.clear()

    def close(self):
        for s in self.sockets:
            s.close()
        self.forwarding.set()


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture
def keepalive(monkeypatch):
    """keepalive(period_ms, timeout_ms=period_ms): the keepalive period and timeout of the ends
    made from now on."""
    def set_period(period_ms, timeout_ms=None):
        monkeypatch.setenv("DASHINFER_KEEPALIVE_MS", str(period_ms))
        monkeypatch.setenv("DASHINFER_KEEPALIVE_TIMEOUT_MS", str(timeout_ms or period_ms))
    return set_period


@pytest.fixture
def served(engine, keepalive):
    """The Engine's gRPC server on loopback TCP, pinging every PERIOD_MS (so do the clients)."""
    keepalive(PERIOD_MS)
    srv = serve(engine, "127.0.0.1:0")
    yield srv
    srv.stop()


def _gen(max_length):
    return allspark.ASGenerationConfigBuilder().update({"top_k": 1, "max_length": max_length,
                                                       "early_stopping": False})


@pytest.mark.parametrize("when", ["mid-request", "idle"])
def test_a_client_that_vanishes_loses_its_session_and_requests_within_the_keepalive_bound(engine, served, when):
    srv = served
    proxy = Blackhole(srv.address)
    client = allspark.ClientEngine(proxy.address, startup_timeout=10)
    try:
        status, _, queue = client.start_request_ids("tiny", None, PROMPT, _gen(4000 if when == "mid-request" else 20))
        assert status == 0 and queue.Get() is not None
        if when == "idle":  # several periods without data: gRPC's pings must go on regardless
            assert queue.wait_finished(BOUND_S)
            time.sleep(PERIOD_MS * 5 / 1000)
        model = lambda: engine.get_stats()["models"]["tiny"]  # noqa: E731
        assert srv.service.limits.sessions == 1 and model()["requests"] == 1
        assert model()["running"] == (when == "mid-request")
        proxy.blackhole()
        assert eventually(lambda: srv.service.limits.sessions == 0, BOUND_S), \
            "the server kept the session of a client that vanished"
        assert eventually(lambda: model()["requests"] == model()["running"] == 0, BOUND_S), \
            "the server kept the requests of a client that vanished"
        assert queue.wait_finished(BOUND_S)  # and the client let its server go too
        assert queue.GenerateStatus() == (S.GenerateInterrupted if when == "mid-request" else S.GenerateFinished)
    finally:
        client.close()
        proxy.close()


def test_a_live_idle_client_keeps_its_session_across_many_keepalive_periods(engine, keepalive):
    """The client pings twice as often as the server (1 s, gRPC's least gap between a client's
    pings): the server takes that from an idle connection, where it sends nothing between them."""
    keepalive(2000, 10000)  # a ping answered late on a loaded test machine is no vanished peer
    srv = serve(engine, "127.0.0.1:0")
    keepalive(1000, 10000)
    client = allspark.ClientEngine(srv.address, startup_timeout=10)
    try:
        session = client._state.conn.session_id
        time.sleep(6.0)  # a server that took the pings for abuse would end the connection (GOAWAY) by now
        status, handle, queue = client.start_request_ids("tiny", None, PROMPT, _gen(30))
        assert status == 0 and queue.wait_finished(BOUND_S) and queue.GenerateStatus() == S.GenerateFinished
        assert client._state.conn.session_id == session and not client._state.conn.broken
        assert client.release_request("tiny", handle) == 0
    finally:
        client.close()
        srv.stop()
