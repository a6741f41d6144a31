"""The gRPC service of server rank 0: DashInfer's API over an Engine (proto/dashinfer.proto).

Every call runs the Engine's own method and answers its status with this call's reason
(Engine.call_with_reason). StartRequest starts the request and then streams its ResultQueue: one
event per Get() (everything produced since the previous event), each carrying the queue's status
and statistics, the last one its final status and error.

Requests belong to the session that started them (docs/security.md): another session naming one
is refused as for a handle never given out; one started without a session, to whoever holds its
handle (63 random bits). A stream that breaks before its request ended stops and releases it; a
Session that ends releases what its client still held; a request that finished on its own stream
without a session is released `finished_request_ttl` s later. Long calls are capped (limits.py).

The service uses the Engine's public API only (EngineAPI: its calls, get_stats, world_size); the
messages are built and read by dashinfer_client.proto.wire. grpc_server.py serves it.
"""
import logging
import os
import threading
import time
import uuid

from dashinfer_client.refusals import Refused, unknown_handle, unknown_model
from dashinfer_client.proto import wire
from dashinfer_client.proto.wire import pb, pb_grpc
from dashinfer_client.types import FINAL_STATUSES, AsStatus

from .access import caller_session, new_handle
from .limits import DEFAULT_FINISHED_REQUEST_TTL, StreamLimits, open_or_abort, wait_while_called
from .sessions import ClientSession, HeldRequest, stream_interval_s

log = logging.getLogger("dashinfer_server.service")

SUCCESS = AsStatus.ALLSPARK_SUCCESS
DENIED = AsStatus.ALLSPARK_REQUEST_DENIED
# The Engine's introspection methods the Query RPC runs (EngineAPI's "introspection" block).
QUERIES = frozenset({"get_as_engine_stat", "get_free_frame", "get_op_profiling_info", "get_model_info",
                     "get_file_information", "get_version_full", "unload_device_mem", "load_device_mem"})


def _reply(status, message=""):
    return pb.Reply(status=int(status), message=message)


# The answer to a call whose caller has gone (a deadline, a cancel, a lost connection): nobody reads it.
_GONE = _reply(AsStatus.ALLSPARK_RUNTIME_ERROR, "the caller has gone")


def _refusal(what, e) -> pb.Reply:
    """The Reply of the Refused `e` of call `what`, worded as the Engine words it."""
    return _reply(e.status, f"{what}: {e}")


class DashInferService(pb_grpc.DashInferServicer):
    def __init__(self, engine, limits=None, finished_request_ttl=DEFAULT_FINISHED_REQUEST_TTL):
        self.engine = engine
        self.instance_id = uuid.uuid4().hex
        self.limits = limits or StreamLimits()
        self.finished_request_ttl = finished_request_ttl
        self._lock = threading.Lock()
        self._draining = ""  # why new work is refused, once shutdown has begun
        self._closing = threading.Event()
        self._held = {}  # (model_name, handle on the wire) -> HeldRequest
        self._sessions = {}  # session id -> _Session
        threading.Thread(target=self._expire_finished, name="dashinfer-expiry", daemon=True).start()

    # ---- models --------------------------------------------------------------------------------

    def InstallModel(self, request, context):
        if self._draining:
            return self._denied("install_model")
        try:
            cfg = wire.decode_runtime_config(request.runtime_config_json)
        except (ValueError, TypeError) as e:
            return _reply(AsStatus.ALLSPARK_PARAM_ERROR, f"install_model: bad runtime config: {e}")
        return self._call("install_model", cfg)

    def StartModel(self, request, context):
        if self._draining:
            return self._denied("start_model")
        return self._call("start_model", request.model_name)

    def StopModel(self, request, context):
        return self._call("stop_model", request.model_name)

    def ReleaseModel(self, request, context):
        reply = self._call("release_model", request.model_name)
        if reply.status == SUCCESS:
            with self._lock:
                for key in [k for k in self._held if k[0] == request.model_name]:
                    self._forget(key)
        return reply

    # ---- requests ------------------------------------------------------------------------------

    def StartRequest(self, request, context):
        try:
            ids = wire.decode_ids(request)
            gen = wire.decode_generation(request.generation_config_json)
        except ValueError as e:
            yield pb.RequestEvent(started=_reply(AsStatus.ALLSPARK_PARAM_ERROR, f"start_request: {e}"))
            return
        with self._lock:
            session = self._sessions.get(request.session_id)
        if session is not None and request.events_on_session:
            yield from self._start(request, context, ids, gen, session)
            return
        owner = request.session_id if session else context.peer()  # its own stream: a thread
        open_or_abort(context, lambda: self.limits.open_stream(owner), "start_request")
        try:
            yield from self._start(request, context, ids, gen, session)
        finally:
            self.limits.close_stream(owner)

    def _start(self, request, context, ids, gen, session):
        """StartRequest's events, once its arguments are read and its stream allowed."""
        admitted = self._admit(request.model_name, ids, gen, session, request.session_id if session else None)
        if isinstance(admitted, pb.Reply):  # sent outside the lock: a client slow to read must not hold it
            yield pb.RequestEvent(started=admitted)
            return
        key, held = admitted
        model, handle, queue = *key, held.queue
        routed = session is not None and request.events_on_session
        if request.events_on_session and not routed:
            log.warning("request %s of %r: events_on_session without an open session: streamed on "
                        "its own call", handle, model)
        if not routed and not context.add_callback(lambda: self._stream_ended(key, held)):
            self._stream_ended(key, held)  # the client is gone already
            return
        sent = {}
        first = wire.encode_event(queue, queue.GenerateStatus(), None, sent)
        first.status, first.error, first.finish_reason = 0, "", ""  # the end comes after the tokens, later
        first.started.CopyFrom(_reply(SUCCESS))
        first.handle = handle
        if routed:  # the session's stream carries the rest (maybe before this reply arrives)
            session.route(key, queue, sent)
        yield first
        if routed:
            return
        while True:
            elements, status = queue.Get(), queue.GenerateStatus()
            if status in FINAL_STATUSES:
                elements = wire.merge_elements(elements, queue.GetNoWait())  # pushed before the final status
                held.streaming, held.ended_at = False, time.monotonic()
                yield wire.encode_event(queue, status, elements, sent)
                return
            yield wire.encode_event(queue, status, elements, sent)

    def _admit(self, model, ids, gen, session, owner):
        """(key, HeldRequest) of the request started and held for `owner`, or the Reply refusing it."""
        with self._lock:  # a request admitted here is one the drain waits for
            if self._draining:  # reasons go without the call's name: ClientEngine.submit hands them on
                return _reply(DENIED, self._draining)
            if session is not None and session.left:  # it ended since StartRequest found it: nobody would release
                return _reply(AsStatus.ALLSPARK_RUNTIME_ERROR, "the client's session has ended")
            try:
                engine_handle, queue = self.engine.submit(model, ids, gen)
            except Refused as e:
                return _reply(e.status, str(e))
            key = (model, new_handle(lambda h: (model, h) in self._held))
            self._held[key] = held = HeldRequest(engine_handle, queue, owner)
            if session:
                session.requests.add(key)
            return key, held

    def StopRequest(self, request, context):
        held, refused = self._own(request, context, "stop_request")
        return refused or self._call_held("stop_request", request, held)

    def ReleaseRequest(self, request, context):
        held, refused = self._own(request, context, "release_request")
        if refused:
            return refused
        reply = self._call_held("release_request", request, held)
        if reply.status == SUCCESS:
            with self._lock:
                self._forget((request.model_name, wire.decode_handle(request)))
        return reply

    def SyncRequest(self, request, context):
        """One request; without a handle, the caller's session's requests of the model (no session:
        every request of the model)."""
        caller = caller_session(context)
        owner = caller or context.peer()  # a sync waits: it holds a thread
        open_or_abort(context, lambda: self.limits.open_stream(owner), "sync_request")
        try:
            if wire.decode_handle(request) is not None:
                held, refused = self._own(request, context, "sync_request")
                if refused or not wait_while_called(context, [held.queue]):
                    return refused or _GONE
                return self._call_held("sync_request", request, held)
            with self._lock:
                session = self._sessions.get(caller)
                mine = [self._held[k] for k in (session.requests if session else self._held)
                        if k[0] == request.model_name and k in self._held]
            if not wait_while_called(context, [h.queue for h in mine]):
                return _GONE
            if session is None:
                return self._call("sync_request", request.model_name, None)
            for held in mine:  # ended and released meanwhile: refused, nothing to wait for
                self.engine.call_with_reason("sync_request", request.model_name, held.engine_handle)
            if self._installed(request.model_name):
                return _reply(SUCCESS)
            return _refusal("sync_request", unknown_model(request.model_name))
        finally:
            self.limits.close_stream(owner)

    # ---- sessions, health, stats ---------------------------------------------------------------

    def Session(self, request, context):
        open_or_abort(context, self.limits.open_session, "session")
        try:
            yield from self._session(context)
        finally:
            self.limits.close_session()

    def _session(self, context):
        sid = uuid.uuid4().hex  # it names the session's requests: random, not to be guessed
        session = ClientSession()
        with self._lock:
            self._sessions[sid] = session
        if not context.add_callback(lambda: self._session_ended(sid)):
            self._session_ended(sid)
            return
        yield pb.SessionEvent(session_id=sid, instance_id=self.instance_id)
        told, pace, sent_at = False, stream_interval_s(), 0.0
        while True:
            session.wake.wait()
            delay = sent_at + pace - time.monotonic()
            if delay > 0 and not session.urgent():
                session.hurry.wait(delay)  # more tokens ride the same event; first ones and ends do not wait
            session.hurry.clear()
            session.wake.clear()
            if session.left:
                return
            closing = self._closing.is_set()  # read before the flush: what it finds final is all there is
            event = pb.SessionEvent()
            if self._draining and not told:
                told = True
                event.shutting_down, event.message = True, self._draining
            event.requests.extend(self._routed_events(session))
            if event.shutting_down or event.requests:
                event.session_id, event.instance_id = sid, self.instance_id
                sent_at = time.monotonic()
                yield event
            if closing:
                return

    def Health(self, request, context):
        return pb.HealthReply(ready=not self._draining, instance_id=self.instance_id, pid=os.getpid(),
                              world_size=self.engine.world_size, message=self._draining or "ready")

    def GetStats(self, request, context):
        stats = self.engine.get_stats()
        with self._lock:
            stats.update(streams=sum(h.streaming for h in self._held.values()),
                         sessions=len(self._sessions), draining=bool(self._draining))
        return wire.encode_stats(stats, _reply(SUCCESS))

    def Query(self, request, context):
        if request.method not in QUERIES:
            return wire.encode_query_reply(None, _reply(AsStatus.ALLSPARK_PARAM_ERROR,
                                                        f"no query named {request.method!r}"))
        try:
            args = wire.decode_query_args(request)
        except ValueError as e:
            return wire.encode_query_reply(None, _reply(AsStatus.ALLSPARK_PARAM_ERROR, f"{request.method}: {e}"))
        try:
            result, status, why = self.engine.call_with_status(request.method, *args)
        except TypeError as e:  # arguments the method does not take
            return wire.encode_query_reply(None, _reply(AsStatus.ALLSPARK_PARAM_ERROR, f"{request.method}: {e}"))
        return wire.encode_query_reply(result, _reply(status, why))

    # ---- shutdown ------------------------------------------------------------------------------

    def begin_draining(self, why: str) -> None:
        """Refuse new work from now on and tell every session."""
        with self._lock:
            self._draining = why
            sessions = list(self._sessions.values())
        for s in sessions:
            s.interrupt()

    def unfinished(self) -> list:
        with self._lock:
            return [h.queue for h in self._held.values() if not h.queue.finished]

    def close_sessions(self) -> None:
        with self._lock:
            self._closing.set()
            sessions = list(self._sessions.values())
        for s in sessions:
            s.interrupt()

    # ---- internals -----------------------------------------------------------------------------

    def _call(self, method, *args) -> pb.Reply:
        status, why = self.engine.call_with_reason(method, *args)
        return _reply(status, why)

    def _denied(self, what) -> pb.Reply:
        return _reply(DENIED, f"{what}: {self._draining}")

    def _own(self, request, context, what):
        """(the held request a RequestRef names, None) when it is the caller's, else (None, the
        Engine's refusal of a handle it never gave out: another session's is not told from none)."""
        model, handle = request.model_name, wire.decode_handle(request)
        with self._lock:
            held = self._held.get((model, handle))
        if held is not None and held.session in (None, caller_session(context)):
            return held, None
        if held is not None:
            log.warning("%s: request %s of %r belongs to another session; refused", what, handle, model)
        return None, _refusal(what, unknown_handle(model, handle) if handle is None or self._installed(model)
                              else unknown_model(model))

    def _call_held(self, method, request, held) -> pb.Reply:
        """The Engine's `method` on a held request; released meanwhile: refused by the caller's handle."""
        reply = self._call(method, request.model_name, held.engine_handle)
        if reply.status == AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID:
            return _refusal(method, unknown_handle(request.model_name, wire.decode_handle(request)))
        return reply

    def _installed(self, model) -> bool:
        return model in self.engine.get_stats()["models"]

    def _routed_events(self, session) -> list:
        """The session's events (ClientSession.events); the requests that ended stream no more."""
        events, ended = session.events()
        with self._lock:
            for key in ended:
                held = self._held.get(key)
                if held:
                    held.streaming = False
        return events

    def _forget(self, key) -> None:
        """Drop a released request (lock held)."""
        held = self._held.pop(key, None)
        if held and held.session in self._sessions:
            self._sessions[held.session].requests.discard(key)

    def _stream_ended(self, key, held) -> None:
        """gRPC callback at the end of a request's stream: if the request was still going, its
        client is gone (cancelled or disconnected): stop and release it."""
        if not held.streaming:
            return
        held.streaming = False
        with self._lock:
            if self._held.get(key) is not held:
                return  # released meanwhile
            self._forget(key)
        status, why = self.engine.call_with_reason("release_request", key[0], held.engine_handle)
        log.info("request %s of %r: the client left mid-stream; released (%s%s)", key[1], key[0],
                 AsStatus(status).name, f": {why}" if why else "")

    def _expire_finished(self) -> None:
        """Release the requests that finished on their own stream without a session and were never
        released, finished_request_ttl seconds after their last event."""
        ttl = self.finished_request_ttl
        while not self._closing.wait(min(max(ttl / 4, 0.05), 30.0)):
            now = time.monotonic()
            with self._lock:
                expired = [(k, h.engine_handle) for k, h in self._held.items()
                           if h.session is None and h.ended_at is not None and now - h.ended_at >= ttl]
                for key, _ in expired:
                    self._forget(key)
            for (model, handle), engine_handle in expired:
                self.engine.call_with_reason("release_request", model, engine_handle)
                log.info("request %s of %r: finished on its own stream %.0f s ago, never released: released",
                         handle, model, ttl)

    def _session_ended(self, sid) -> None:
        """gRPC callback at the end of a session: release what its client still held."""
        with self._lock:
            session = self._sessions.pop(sid, None)
            if session is None:
                return
            session.left = True
            keys = [k for k in session.requests if k in self._held]
            held = [self._held[k] for k in keys]
            for key, h in zip(keys, held):
                h.streaming = False
                self._forget(key)
        session.interrupt()
        for key, h in zip(keys, held):
            self.engine.call_with_reason("release_request", key[0], h.engine_handle)
        if keys:
            log.info("session %s ended: released %d request(s) its client held", sid[:8], len(keys))
