"""A ClientEngine's connection to one server instance: the gRPC channel, and the session that owns
this client's requests on it and carries their events (proto/dashinfer.proto, Session). One reader
thread feeds every request's ResultQueue from the session stream; when the stream ends (the server
died, the connection broke, the client closed) every queue still open turns GenerateInterrupted
with the reason. Every call carries the token, when there is one, and names the session (its
requests are its own: the server refuses them to other sessions)."""
import collections
import logging
import threading
import time

import grpc

from .proto.wire import (MESSAGE_SIZE_OPTIONS, SESSION_METADATA, TOKEN_METADATA, apply_event, keepalive_options,
                         pb, pb_grpc)
from .types import AsStatus, GenerateRequestStatus

log = logging.getLogger("dashinfer_client")

# Local sockets answer within milliseconds: retry connecting often (gRPC's default waits 1-120 s).
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", 1000), *MESSAGE_SIZE_OPTIONS]


# A call the server refused for a reason of its own, and the AsStatus it is to the caller.
_REFUSALS = {grpc.StatusCode.RESOURCE_EXHAUSTED: AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
             grpc.StatusCode.UNAUTHENTICATED: AsStatus.ALLSPARK_REQUEST_DENIED,
             grpc.StatusCode.PERMISSION_DENIED: AsStatus.ALLSPARK_REQUEST_DENIED}


class Unavailable(Exception):
    """No server to talk to (it could not be started, reached or it is closed)."""


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `pairs` (a list: the session's is added once it is known) to every call's metadata."""

    def __init__(self, pairs):
        self.pairs = pairs

    def _with(self, details):
        return _CallDetails(details.method, details.timeout, list(details.metadata or ()) + self.pairs,
                            details.credentials, details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with(details), request)


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                            "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


def open_channel(address, token=None, tls_ca=None):
    """A channel to `address` whose calls carry `token` ("Bearer" metadata): TLS when tls_ca is
    given (a CA certificate file, PEM; True: the system's roots), plain otherwise -> (channel, the
    metadata list its calls carry)."""
    options = _CHANNEL_OPTIONS + keepalive_options(server=False)
    if tls_ca:
        roots = None
        if tls_ca is not True:
            with open(tls_ca, "rb") as f:
                roots = f.read()
        raw = grpc.secure_channel(address, grpc.ssl_channel_credentials(roots), options=options)
    else:
        raw = grpc.insecure_channel(address, options=options)
    pairs = [(TOKEN_METADATA, f"Bearer {token}")] if token else []
    return grpc.intercept_channel(raw, _Metadata(pairs)), pairs


class Connection:
    """server: the SpawnedServer serving `address`, or None (its exit explains a failure)."""
    RpcError = grpc.RpcError

    def __init__(self, address, timeout, server=None, token=None, tls_ca=None):
        self.address = address
        self.server = server
        self.channel, metadata = open_channel(address, token, tls_ca)
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
        metadata.append((SESSION_METADATA, self.session_id))
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
                try:  # without wait_for_ready a call fails at once with what connecting met (refused, TLS...)
                    return self.stub.Health(pb.Empty(), timeout=1.0).world_size
                except grpc.RpcError as e:
                    why += f" ({e.details()})"
                if self.server is not None:
                    why += "; its output so far:\n    " + "\n    ".join(self.server.tail)
                raise Unavailable(why)
            try:
                return self.stub.Health(pb.Empty(), timeout=min(wait, left), wait_for_ready=True).world_size
            except grpc.RpcError as e:
                if e.code() in _REFUSALS:
                    raise Unavailable(f"the dashinfer server at {self.address} refused this client: "
                                      f"{e.details()}") from e
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

    def refusal(self, error):
        """(AsStatus, message) of a call that failed with `error` (a grpc.RpcError): the server's
        own refusals (over a limit, no or a wrong token, not an admin) with its reason, anything
        else ALLSPARK_RUNTIME_ERROR with lost()'s message."""
        status = _REFUSALS.get(error.code())
        if status is not None:
            return status, error.details()
        return AsStatus.ALLSPARK_RUNTIME_ERROR, self.lost(error)

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
