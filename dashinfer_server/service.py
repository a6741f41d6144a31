"""The gRPC service of server rank 0: DashInfer's API over an Engine (proto/dashinfer.proto).

Every call runs the Engine's own method and answers its status with this call's reason
(Engine.call_with_reason). StartRequest starts the request and then streams its ResultQueue: one
event per Get() (everything produced since the previous event), each carrying the queue's status
and statistics, the last one its final status and error.

Requests belong to whoever holds them: a stream that breaks before its request ended (the client
went away) stops and releases that request; a Session that ends releases every request started
under it that its client never released.

serve(engine, address) -> Server (accepting); Server.shutdown(grace) drains: new work is refused
with ALLSPARK_REQUEST_DENIED, running requests get `grace` seconds to finish and are interrupted
after that, then the models are stopped and the service closes.
"""
import json
import logging
import os
import socket
import threading
import time
import uuid
from concurrent import futures

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dashinfer_client.config import AsModelRuntimeConfig
from dashinfer_client.proto import load as load_stubs
from dashinfer_client.types import AsStatus, GenerateRequestStatus

pb, pb_grpc = load_stubs()
log = logging.getLogger("dashinfer_server.service")

SUCCESS = AsStatus.ALLSPARK_SUCCESS
DENIED = AsStatus.ALLSPARK_REQUEST_DENIED
# Streams hold a worker thread each (the sync gRPC server); threads are created when needed.
DEFAULT_MAX_WORKERS = 512


def default_address() -> str:
    """A unix socket private to this process: $XDG_RUNTIME_DIR (else /tmp)/dashinfer-<uid>-<pid>.sock."""
    folder = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return f"unix://{folder}/dashinfer-{os.getuid()}-{os.getpid()}.sock"


def unix_socket_path(address: str):
    """The file of a unix:PATH / unix:///PATH address, else None."""
    if not address.startswith("unix:"):
        return None
    path = address[len("unix:"):]
    return path[2:] if path.startswith("//") else path


class _Foreign:
    """A handle that is not an int, named by its client-side repr (for the Engine's refusal)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


class _Held:
    """A request the service started: its queue, the session owning it, whether it streams."""
    __slots__ = ("queue", "session", "streaming")

    def __init__(self, queue, session):
        self.queue, self.session, self.streaming = queue, session, True


class _Session:
    __slots__ = ("wake", "left", "requests", "routed", "dirty", "lock")

    def __init__(self):
        self.wake = threading.Event()
        self.left = False
        self.requests = set()  # (model_name, handle)
        self.routed = {}  # key -> (queue, stats sent): requests whose events go on this stream
        self.dirty = {}  # keys of routed requests with news, in order (a dict as ordered set)
        self.lock = threading.Lock()

    def route(self, key, queue, sent) -> None:
        """Carry the events of request `key` from now on; `sent`: the statistics already sent."""
        with self.lock:
            self.routed[key] = (queue, sent)
        queue.listen(lambda: self.mark(key))

    def mark(self, key) -> None:
        """A routed queue changed (called under that queue's lock: only sets and wakes)."""
        with self.lock:
            self.dirty[key] = None
        self.wake.set()

    def take_dirty(self) -> list:
        """[(key, queue, sent)] of the routed requests with news since the last call."""
        with self.lock:
            keys, self.dirty = list(self.dirty), {}
            return [(k, *self.routed[k]) for k in keys if k in self.routed]


def _reply(status, message=""):
    return pb.Reply(status=int(status), message=message)


class DashInferService(pb_grpc.DashInferServicer):
    def __init__(self, engine):
        self.engine = engine
        self.instance_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._draining = ""  # why new work is refused, once shutdown has begun
        self._closing = False
        self._held = {}  # (model_name, handle) -> _Held
        self._sessions = {}  # session id -> _Session

    # ---- models --------------------------------------------------------------------------------

    def InstallModel(self, request, context):
        if self._draining:
            return self._denied("install_model")
        try:
            cfg = AsModelRuntimeConfig.from_dict(json.loads(request.runtime_config_json))
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
        model = request.model_name
        try:
            ids = self._input_ids(request)
            gen = json.loads(request.generation_config_json or "{}")
        except ValueError as e:
            yield pb.RequestEvent(started=_reply(AsStatus.ALLSPARK_PARAM_ERROR, f"start_request: {e}"))
            return
        with self._lock:  # a request admitted here is one the drain waits for
            if self._draining:
                yield pb.RequestEvent(started=self._denied("start_request"))
                return
            (status, handle, queue), why = self.engine.call_with_reason(
                "start_request_ids", model, None, ids, gen)
            if status != SUCCESS:
                yield pb.RequestEvent(started=_reply(status, why))
                return
            key = (model, handle)
            session = self._sessions.get(request.session_id)
            self._held[key] = held = _Held(queue, request.session_id if session else None)
            if session:
                session.requests.add(key)
        routed = session is not None and request.events_on_session
        if request.events_on_session and not routed:
            log.warning("request %s of %r: events_on_session without an open session: streamed on "
                        "its own call", handle, model)
        if not routed and not context.add_callback(lambda: self._stream_ended(key, held)):
            self._stream_ended(key, held)  # the client is gone already
            return
        sent = {}
        first = _event(queue, None, sent)
        first.started.CopyFrom(_reply(SUCCESS))
        first.handle = handle
        if routed:  # the session's stream carries the rest (maybe before this reply arrives)
            session.route(key, queue, sent)
        yield first
        if routed:
            return
        while True:
            elements = queue.Get()
            if queue.finished:
                elements = _merge(elements, queue.GetNoWait())  # pushed before the final status
                held.streaming = False
                yield _event(queue, elements, sent)
                return
            yield _event(queue, elements, sent)

    def StopRequest(self, request, context):
        return self._call("stop_request", request.model_name, self._handle(request))

    def ReleaseRequest(self, request, context):
        reply = self._call("release_request", request.model_name, self._handle(request))
        if reply.status == SUCCESS:
            with self._lock:
                self._forget((request.model_name, self._handle(request)))
        return reply

    def SyncRequest(self, request, context):
        handle = self._handle(request) if request.HasField("handle") else None
        return self._call("sync_request", request.model_name, handle)

    # ---- sessions, health, stats ---------------------------------------------------------------

    def Session(self, request, context):
        sid = uuid.uuid4().hex
        session = _Session()
        with self._lock:
            self._sessions[sid] = session
        if not context.add_callback(lambda: self._session_ended(sid)):
            self._session_ended(sid)
            return
        yield pb.SessionEvent(session_id=sid, instance_id=self.instance_id)
        told = False
        while True:
            session.wake.wait()
            session.wake.clear()
            if session.left:
                return
            closing = self._closing  # read before the flush: what it finds final is all there is
            event = pb.SessionEvent()
            if self._draining and not told:
                told = True
                event.shutting_down, event.message = True, self._draining
            event.requests.extend(self._routed_events(session))
            if event.shutting_down or event.requests:
                event.session_id, event.instance_id = sid, self.instance_id
                yield event
            if closing:
                return

    def Health(self, request, context):
        world = getattr(self.engine._group, "world", 1)
        return pb.HealthReply(ready=not self._draining, instance_id=self.instance_id, pid=os.getpid(),
                              world_size=world, message=self._draining or "ready")

    def GetStats(self, request, context):
        with self._lock:
            streams = sum(h.streaming for h in self._held.values())
            sessions = len(self._sessions)
        return pb.StatsReply(reply=_reply(SUCCESS), models=_model_stats(self.engine), streams=streams,
                             sessions=sessions, draining=bool(self._draining))

    # ---- shutdown ------------------------------------------------------------------------------

    def begin_draining(self, why: str) -> None:
        """Refuse new work from now on and tell every session."""
        with self._lock:
            self._draining = why
            sessions = list(self._sessions.values())
        for s in sessions:
            s.wake.set()

    def unfinished(self) -> list:
        with self._lock:
            return [h.queue for h in self._held.values() if not h.queue.finished]

    def close_sessions(self) -> None:
        with self._lock:
            self._closing = True
            sessions = list(self._sessions.values())
        for s in sessions:
            s.wake.set()

    # ---- internals -----------------------------------------------------------------------------

    def _call(self, method, *args) -> pb.Reply:
        status, why = self.engine.call_with_reason(method, *args)
        return _reply(status, why)

    def _denied(self, what) -> pb.Reply:
        return _reply(DENIED, f"{what}: {self._draining}")

    @staticmethod
    def _handle(request):
        return request.id if request.WhichOneof("handle") == "id" else _Foreign(request.foreign)

    @staticmethod
    def _input_ids(request):
        if request.input_ids_json:
            return json.loads(request.input_ids_json)
        ids = np.array(request.input_ids, dtype=np.int64)
        shape = tuple(request.input_shape)
        if int(np.prod(shape)) != ids.size:
            raise ValueError(f"input_ids: {ids.size} values do not fill the shape {list(shape)}")
        return ids.reshape(shape)

    def _routed_events(self, session) -> list:
        """One RequestEvent per routed request with news; a request whose last event goes out
        leaves the session's routing (its handle stays held until released)."""
        events = []
        for key, queue, sent in session.take_dirty():
            final = queue.finished  # before taking: every token pushed before the final status
            elements = queue.GetNoWait()
            event = _event(queue, elements, sent)
            event.handle = key[1]
            events.append(event)
            if final:
                with session.lock:
                    session.routed.pop(key, None)
                with self._lock:
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
        status, why = self.engine.call_with_reason("release_request", *key)
        log.info("request %s of %r: the client left mid-stream; released (%s%s)", key[1], key[0],
                 AsStatus(status).name, f": {why}" if why else "")

    def _session_ended(self, sid) -> None:
        """gRPC callback at the end of a session: release what its client still held."""
        with self._lock:
            session = self._sessions.pop(sid, None)
            if session is None:
                return
            session.left = True
            keys = [k for k in session.requests if k in self._held]
            for key in keys:
                self._held[key].streaming = False
                self._forget(key)
        session.wake.set()
        for key in keys:
            self.engine.call_with_reason("release_request", *key)
        if keys:
            log.info("session %s ended: released %d request(s) its client held", sid[:8], len(keys))


def _merge(a, b):
    """Two GeneratedElements in delivery order as one (either may be None)."""
    if a is None or b is None:
        return a or b
    a.ids_from_generate += b.ids_from_generate
    a.log_probs_list += b.log_probs_list
    a.token_logprobs_list += b.token_logprobs_list
    a.tensors_from_model_inference.update(b.tensors_from_model_inference)
    a.prefix_cache_len, a.prefix_len_gpu, a.prefix_len_cpu = b.prefix_cache_len, b.prefix_len_gpu, b.prefix_len_cpu
    return a


def _event(queue, elements, sent) -> pb.RequestEvent:
    """What the client's queue needs to mirror this one after `elements` were taken from it.
    sent: the statistics the stream has carried so far (updated): only changed entries go, and
    never generated_token_length, which the client's queue counts itself."""
    stats = queue.RequestStatInfo()
    reason = stats.pop("finish_reason")  # a string: it has its own field
    changed = {k: v for k, v in stats.items() if sent.get(k) != v and k != "generated_token_length"}
    sent.update(changed)
    event = pb.RequestEvent(status=int(queue.GenerateStatus()), error=queue.error or "", stats=changed,
                            finish_reason=reason)
    if elements is not None:
        event.ids.extend(elements.ids_from_generate)
        for top in elements.log_probs_list:
            event.log_probs.add(ids=[i for i, _ in top], logprobs=[p for _, p in top])
        event.token_logprobs.extend(elements.token_logprobs_list)
        for name, value in elements.tensors_from_model_inference.items():
            arr = np.ascontiguousarray(value)
            event.tensors[name].CopyFrom(pb.Tensor(dtype=arr.dtype.str, shape=arr.shape, data=arr.tobytes()))
        event.prefix_cache_len = elements.prefix_cache_len
        event.prefix_len_gpu = elements.prefix_len_gpu
        event.prefix_len_cpu = elements.prefix_len_cpu
    return event


def _installed(engine) -> list:
    """(name, installed model) of every model the Engine holds, read under its lock. The service
    reads the Engine's tables only here, for stats and shutdown."""
    with engine._lock:
        return list(engine._models.items())


def _model_stats(engine) -> list:
    """Per installed model: state, config, requests held and the scheduler's queues (counted)."""
    out = []
    for name, m in _installed(engine):
        runner = m.runner
        stats = pb.ModelStats(model_name=name, state=m.state.value, requests=len(m.requests),
                              runtime_config_json=json.dumps(m.cfg.to_dict()))
        if runner is not None:
            stats.running = len(runner.scheduler.running)
            stats.waiting = len(runner.scheduler.waiting)
            stats.kv_blocks_total = len(runner.pool.blocks)
            stats.kv_blocks_free = runner.pool.num_available
        out.append(stats)
    return out


def release_models(engine) -> None:
    """Release every installed model (stopping those that run): the last step of a shutdown."""
    for name, _ in _installed(engine):
        engine.call_with_reason("release_model", name)


def _claim_unix_socket(path: str) -> None:
    """Make `path` bindable: refuse if a live server listens there, remove a stale socket file."""
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # left by a server that died
        except OSError as e:
            raise RuntimeError(f"cannot use {path}: {e}") from e
        else:
            raise RuntimeError(f"{path} is in use by a running server; choose another --address")
        finally:
            probe.close()
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)


class Server:
    """The gRPC server of rank 0 around one Engine (see serve)."""

    def __init__(self, engine, address=None, max_workers=DEFAULT_MAX_WORKERS):
        self.engine = engine
        self.address = address or default_address()
        self.service = DashInferService(engine)
        self.socket_path = unix_socket_path(self.address)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers, thread_name_prefix="dashinfer-grpc"),
                                   options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_DashInferServicer_to_server(self.service, self._server)
        # grpc.health.v1 for probes and load balancers: SERVING once started, NOT_SERVING from the drain on
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self._stopped = threading.Event()

    def start(self) -> "Server":
        if self.socket_path:
            _claim_unix_socket(self.socket_path)
        try:
            port = self._server.add_insecure_port(self.address)
        except RuntimeError as e:
            raise RuntimeError(f"cannot listen on {self.address}: {e}") from e
        if not self.socket_path and self.address.rsplit(":", 1)[-1] == "0":
            self.address = f"{self.address.rsplit(':', 1)[0]}:{port}"  # the port the OS chose
        self._server.start()
        if self.socket_path:
            os.chmod(self.socket_path, 0o660)  # this user and its group only
        for name in (health.OVERALL_HEALTH, pb.DESCRIPTOR.services_by_name["DashInfer"].full_name):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def shutdown(self, grace: float = 30.0) -> None:
        """Drain (refuse new work, give running requests `grace` seconds, then interrupt them),
        stop the models and close. Every model stays installed (release is the caller's)."""
        why = "the server is shutting down: no new requests are accepted"
        self.service.begin_draining(why)
        self.health.enter_graceful_shutdown()  # every service NOT_SERVING from now on
        deadline = time.monotonic() + grace
        queues = self.service.unfinished()
        if queues:
            log.info("draining: waiting up to %.0f s for %d running request(s)", grace, len(queues))
        for q in queues:
            q.wait_finished(max(0.0, deadline - time.monotonic()))
        late = [q for q in queues if not q.finished]
        for q in late:
            q.set_status(GenerateRequestStatus.GenerateInterrupted,
                         f"the server shut down before the request finished (grace period {grace:g} s)")
        if late:
            log.warning("draining: interrupted %d request(s) still running after %.0f s", len(late), grace)
        self.stop_models()
        self.service.close_sessions()
        self._server.stop(grace=5.0).wait()
        self._remove_socket()
        self._stopped.set()

    def stop_models(self) -> None:
        """Stop every running model (its unfinished requests are interrupted)."""
        for name, m in _installed(self.engine):
            if m.state.value == "Running":
                self.engine.call_with_reason("stop_model", name)

    def stop(self) -> None:
        """Close at once (no drain): open streams are cancelled."""
        self.health.enter_graceful_shutdown()
        self.service.close_sessions()
        self._server.stop(grace=None).wait()
        self._remove_socket()
        self._stopped.set()

    def wait(self, timeout=None) -> bool:
        return self._stopped.wait(timeout)

    def _remove_socket(self) -> None:
        if self.socket_path:
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass


def serve(engine, address=None, max_workers=DEFAULT_MAX_WORKERS) -> Server:
    """Serve `engine` on `address` (default: a unix socket private to this process; a TCP address
    such as 127.0.0.1:PORT listens only where it names, never on every interface unless it says
    so) and return the started Server: it accepts calls when this returns."""
    return Server(engine, address, max_workers).start()
