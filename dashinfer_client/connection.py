"""A ClientEngine's connection to one server instance: the gRPC channel, and the session that owns
this client's requests on it and carries their events (proto/dashinfer.proto, Session). One reader
thread feeds every request's ResultQueue from the session stream; when the stream ends (the server
died, the connection broke, the client closed) every queue still open turns GenerateInterrupted
with the reason."""
import logging
import threading
import time

import grpc

from .proto.wire import KEEPALIVE_MS, MESSAGE_SIZE_OPTIONS, apply_event, pb, pb_grpc
from .types import GenerateRequestStatus

log = logging.getLogger("dashinfer_client")

# Local sockets answer within milliseconds: retry connecting often (gRPC's default waits 1-120 s).
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.keepalive_time_ms", KEEPALIVE_MS),
                    *MESSAGE_SIZE_OPTIONS]


class Unavailable(Exception):
    """No server to talk to (it could not be started, reached or it is closed)."""


class Connection:
    """server: the SpawnedServer serving `address`, or None (its exit explains a failure)."""
    RpcError = grpc.RpcError

    def __init__(self, address, timeout, server=None):
        self.address = address
        self.server = server
        self.channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self.stub = pb_grpc.DashInferStub(self.channel)
        self.broken = ""  # why this connection cannot be used any more
        self.routed = {}  # server handle -> queue, until its last event
        self._early = {}  # server handle -> events that came before the handle was routed
        self._lock = threading.Lock()
        try:
            self.world_size = self._wait_healthy(timeout)
            self._session = self.stub.Session(pb.SessionRequest())
            first = next(self._session)
        except grpc.RpcError as e:
            self.channel.close()
            raise Unavailable(f"cannot open a session with {address}: {e.code().name}: {e.details()}") from e
        except BaseException:
            self.channel.close()
            raise
        self.session_id, self.instance_id = first.session_id, first.instance_id
        threading.Thread(target=self._watch_session, daemon=True, name="dashinfer-session").start()

    def _wait_healthy(self, timeout) -> int:
        """Poll Health with a growing per-try deadline until it answers (-> the server's world
        size); fail early when the spawned server has exited."""
        deadline = time.monotonic() + timeout
        wait = 0.05
        while True:
            if self.server is not None and not self.server.alive():
                raise Unavailable(f"the spawned server did not start: {self.server.describe_exit(1.0)}")
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"no dashinfer server answered at {self.address} within {timeout:g} s"
                if self.server is not None:
                    why += "; its output so far:\n    " + "\n    ".join(self.server.tail)
                raise Unavailable(why)
            try:
                return self.stub.Health(pb.Empty(), timeout=min(wait, left), wait_for_ready=True).world_size
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise Unavailable(f"{self.address} does not answer as a dashinfer server: "
                                      f"{e.code().name}: {e.details()}") from e
            wait = min(wait * 2, 1.0)

    def _watch_session(self) -> None:
        try:
            for event in self._session:
                if event.shutting_down:
                    log.warning("the dashinfer server at %s: %s", self.address, event.message)
                if event.requests:
                    self._deliver(event.requests)
            why = "the server closed the connection"
        except grpc.RpcError as e:
            why = f"{e.code().name}: {e.details()}"
        except Exception as e:  # a malformed event must not leave consumers waiting forever
            log.exception("reading the session stream failed")
            why = f"client error while reading the session stream: {type(e).__name__}: {e}"
            self._session.cancel()
        self._interrupt_routed(self.broken_by(why))

    def route(self, server_handle, queue) -> None:
        """Feed `queue` from the session's events for `server_handle` (those that came before
        this call too)."""
        with self._lock:
            for event in self._early.pop(server_handle, ()):
                apply_event(event, queue)
            if not queue.finished:
                self.routed[server_handle] = queue
        if self.broken:  # the session ended before the request was routed: nothing will come
            self._interrupt_routed(self.broken)

    def _deliver(self, events) -> None:
        with self._lock:  # route() applies early events under it too: each queue sees one order
            for event in events:
                queue = self.routed.get(event.handle)
                if queue is None:
                    self._early.setdefault(event.handle, []).append(event)
                    continue
                apply_event(event, queue)
                if queue.finished:
                    del self.routed[event.handle]

    def _interrupt_routed(self, why) -> None:
        with self._lock:
            queues, self.routed, self._early = list(self.routed.values()), {}, {}
        for queue in queues:
            queue.set_status(GenerateRequestStatus.GenerateInterrupted, why)

    def mark_broken(self, why) -> None:
        if not self.broken:
            self.broken = f"lost the connection to the dashinfer server at {self.address} ({why})"

    def lost(self, error) -> str:
        """The message for a call or stream that failed with `error` (a grpc.RpcError). Only
        UNAVAILABLE, or a session stream that has ended, is the loss of the connection (the next
        call reconnects, restarting a spawned group); any other code (RESOURCE_EXHAUSTED,
        INVALID_ARGUMENT, UNKNOWN...) is this call's error alone."""
        why = f"{error.code().name}: {error.details()}"
        if error.code() == grpc.StatusCode.UNAVAILABLE or self.broken:
            return self.broken_by(why)
        return f"the dashinfer server at {self.address} failed the call ({why})"

    def broken_by(self, why) -> str:
        """Mark the connection broken by `why` (the first reason stays) and return the message
        for what it ended: the reason, and how the spawned server exited if it has."""
        self.mark_broken(why)
        exit_note = self.server.describe_exit(1.0) if self.server is not None else ""
        return self.broken + (f"; {exit_note}" if exit_note else "")

    def close(self, why) -> None:
        """End the session (open requests' queues end as interrupted) and close the channel; the
        server releases this session's requests."""
        self.mark_broken(why)
        self._interrupt_routed(why)
        self._session.cancel()
        self.channel.close()
