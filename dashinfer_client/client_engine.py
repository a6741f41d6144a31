"""ClientEngine: the Engine API over gRPC to a server (proto/dashinfer.proto).

    engine = ClientEngine()                       # spawns a local server, shut down on close()
    engine = ClientEngine("unix:///run/dashinfer.sock")   # or connects to a running one

The front half is EngineAPI's (dashinfer_client/api.py), the in-process Engine's too; the server
runs the Engine's own primitives, so statuses and messages are the same (`last_error` holds the
reason of the last refused call). Each request's events travel on this client's session stream
(connection.py), batched with those of its other requests; one reader thread feeds every
ResultQueue (the in-process class) from it, so Get/GetWithTimeout/GetNoWait/GenerateStatus/
GeneratedLength/RequestStatInfo behave as in-process, logprobs included.

Faults: if the server dies or the connection breaks, every open request's queue turns
GenerateInterrupted with the reason in ResultQueue.error, and calls return
ALLSPARK_RUNTIME_ERROR instead of hanging. The next call reconnects; a server this ClientEngine
spawned is started again. A new server knows nothing of the old one, so the models this
ClientEngine installed are installed again (and started again if they were running) before that
call proceeds; if that fails the call returns the error and the model must be installed by the
user. Handles of the old server stay usable for stop/sync/release (the request has ended).
"""
import itertools
import json
import logging
import os
import threading
import weakref

from . import settings
from . import spawned
from .api import EngineAPI, ModelState
from .refusals import Refused, unknown_handle, unknown_model
from .connection import Connection, Unavailable
from .proto import wire
from .types import AsStatus, ResultQueue

__all__ = ["ClientEngine", "Unavailable"]

log = logging.getLogger("dashinfer_client")

SUCCESS = AsStatus.ALLSPARK_SUCCESS
FAILED = AsStatus.ALLSPARK_RUNTIME_ERROR


class ClientEngine(EngineAPI):
    """The Engine API over gRPC; see the module docstring.

    address: the server's address (unix:///path or HOST:PORT). None: spawn a local server on a
    new private unix socket (nodes ranks, threads_per_rank threads each; DashInfer's AS_NUMA_NUM,
    AS_NUMA_OFFSET and AS_DAEMON_PATH are honoured: spawned.upstream_settings) and stop it on close(),
    at exit or when this object is garbage-collected. startup_timeout: seconds to wait for the
    server to answer its health check (at start, and when a spawned server is started again).
    reconnect_timeout: seconds a call waits for a server at `address` to answer again after the
    connection broke (a supervisor restarting it). shutdown_timeout: seconds the spawned server
    gets to stop after SIGTERM before it is killed. env: extra environment variables for it.
    token: sent with every call, for a server that requires one (default $DASHINFER_TOKEN; a
    spawned server is started with it; ValueError when it is not printable ASCII without spaces).
    tls_ca: connect with TLS, trusting this CA certificate file (PEM; True: the system's roots;
    default for a TCP address: $DASHINFER_TLS_CA). See docs/security.md.
    """
    log = log

    def __init__(self, address=None, nodes=None, threads_per_rank=None, startup_timeout=120.0,
                 reconnect_timeout=10.0, shutdown_timeout=15.0, env=None, token=None, tls_ca=None):
        super().__init__()
        self._token = token or settings.get("DASHINFER_TOKEN")
        if self._token is not None:
            wire.check_token(self._token)
        self._spawn = address is None
        self.address = wire.default_address(unique=True) if self._spawn else address
        tcp = wire.unix_socket_path(self.address) is None  # the environment's CA is for TCP servers
        self._tls_ca = tls_ca or (tcp and settings.get("DASHINFER_TLS_CA")) or None
        self._env = dict(os.environ, **(env or {}))
        self._command = (spawned.launch_command(self.address, nodes, threads_per_rank, self._env)
                         if self._spawn else None)
        if self._spawn:
            if self._token:  # in its environment, not its command line (ps shows that to everyone)
                self._env["DASHINFER_TOKEN"] = self._token
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            self._env["PYTHONPATH"] = os.pathsep.join(
                p for p in (root, self._env.get("PYTHONPATH")) if p)  # the server runs this same code
        self.startup_timeout = startup_timeout
        self.reconnect_timeout = reconnect_timeout
        self.shutdown_timeout = shutdown_timeout
        self._lock = threading.RLock()
        self._state = _State()
        self._models = {}  # name -> {"config_json": str, "running": bool}, in install order
        self._tokenizers = {}  # model name -> loader whose tokenizer start_request_text uses
        self._requests = {}  # client handle -> _Request, until released
        self._handles = itertools.count(1)
        self._instance_id = None
        self._finalizer = weakref.finalize(self, self._state.close, "the ClientEngine was closed",
                                           shutdown_timeout)
        try:
            self._connection()
        except Unavailable:
            self._finalizer()
            raise

    # ---- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """End open requests (their queues turn GenerateInterrupted), close the connection and stop
        the server this ClientEngine spawned. Idempotent."""
        with self._lock:
            self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def server(self):
        """The SpawnedServer this ClientEngine started (None when it connected by address)."""
        return self._state.server

    @property
    def world_size(self) -> int:
        """The ranks of the server; raises Unavailable."""
        return self._connection_for_query().world_size

    def get_stats(self) -> dict:
        """The server's view (EngineAPI.get_stats); raises Unavailable."""
        conn = self._connection_for_query()
        try:
            return wire.decode_stats(conn.stub.GetStats(wire.pb.Empty()))
        except conn.RpcError as e:
            raise Unavailable(conn.lost(e)) from e

    # ---- models ---------------------------------------------------------------------------------

    def _install_model(self, cfg) -> None:
        text = wire.encode_runtime_config(cfg)
        self._unary("InstallModel", lambda conn: wire.pb.InstallModelRequest(runtime_config_json=text))
        with self._lock:
            self._models[cfg.model_name] = {"config_json": text, "running": False}

    def _start_model(self, name) -> None:
        self._unary("StartModel", lambda conn: wire.pb.ModelRef(model_name=name))
        self._note_model(name, running=True)

    def _stop_model(self, name) -> None:
        queues = self._queues(name, None)
        self._unary("StopModel", lambda conn: wire.pb.ModelRef(model_name=name))
        self._note_model(name, running=False)
        _wait_delivered(queues)

    def _release_model(self, name) -> None:
        queues = self._queues(name, None)
        self._unary("ReleaseModel", lambda conn: wire.pb.ModelRef(model_name=name))
        _wait_delivered(queues)
        with self._lock:
            self._models.pop(name, None)
            self._tokenizers.pop(name, None)
            for handle in [h for h, r in self._requests.items() if r.model == name]:
                del self._requests[handle]  # the server forgot them with the model

    # ---- requests -------------------------------------------------------------------------------

    def _start_request(self, name, loader, input_ids, gen):
        conn = self._connected()
        request = wire.pb.StartRequestRequest(model_name=name, session_id=conn.session_id,
                                              events_on_session=True,
                                              generation_config_json=wire.encode_generation(gen),
                                              **wire.encode_ids(input_ids))
        _check_size(request)
        try:
            first = next(iter(conn.stub.StartRequest(request)))  # the only event: the rest come on the session
        except conn.RpcError as e:
            raise Refused(*conn.refusal(e)) from e
        if first.started.status != SUCCESS:  # the Engine's reason, without the call's name
            raise Refused(first.started.status, first.started.message)
        handle = next(self._handles)
        queue = ResultQueue(str(handle))
        wire.apply_event(first, queue)  # the server's arrival time and prompt length
        with self._lock:
            self._requests[handle] = _Request(conn, name, first.handle, queue)
        conn.route(first.handle, queue)
        return handle, queue

    def _stop_request(self, name, handle) -> None:
        self._request_call("StopRequest", name, handle)

    def _release_request(self, name, handle) -> None:
        self._request_call("ReleaseRequest", name, handle)
        with self._lock:
            self._requests.pop(handle, None)

    def _sync_request(self, name, handle) -> None:
        self._request_call("SyncRequest", name, handle)

    def _tokenizer_loader(self, name):
        """The serialized model files the server names for `name`, read here."""
        loader = self._tokenizers.get(name)
        if loader is not None:
            return loader
        text = self._models.get(name, {}).get("config_json")
        cfg = json.loads(text) if text else self._server_model(name)["runtime_config"]
        from .model.serialized import DashInferModel
        try:
            loader = DashInferModel(cfg["model_dir"], cfg["model_prefix"])
        except Exception as e:
            raise Refused(AsStatus.ALLSPARK_PARAM_ERROR,
                          f"cannot read the tokenizer of {name!r} here ({e}); pass its loader as `model`") from e
        self._tokenizers[name] = loader
        return loader

    # ---- introspection ----------------------------------------------------------------------------

    def _introspect(self, what, *args):
        """Rank 0's answer (the Query RPC runs the server Engine's method), but for what this
        process knows itself: it works as a client of a service, and rank 0 answers."""
        if what == "is_allspark_work_as_service":
            return True
        if what == "get_rank_id":
            return 0
        conn = self._connected()
        try:
            reply = conn.stub.Query(wire.encode_query(what, args))
        except conn.RpcError as e:
            raise Refused(FAILED, conn.lost(e)) from e
        if reply.reply.status != SUCCESS:
            raise Refused(reply.reply.status, reply.reply.message, named=True)
        return wire.decode_query_result(reply)

    # ---- internals ------------------------------------------------------------------------------

    def _check_installed(self, name) -> None:
        self._server_model(name)

    def _server_model(self, name) -> dict:
        """The server's get_stats() entry of model `name`."""
        try:
            model = self.get_stats()["models"].get(name)
        except Unavailable as e:
            raise Refused(FAILED, str(e)) from e
        if model is None or model["state"] == ModelState.Released:
            raise unknown_model(name)
        return model

    def _request_call(self, rpc, name, handle) -> None:
        """A call that returns once the request(s) ended on the server (stop, release, sync); it
        also waits until their queues here hold the last events (_wait_delivered)."""
        queues = self._queues(name, handle)
        self._unary(rpc, lambda conn: self._request_ref(conn, name, handle))
        _wait_delivered(queues)

    def _unary(self, rpc, make_request) -> None:
        """Call `rpc` with make_request(connection); a refusal raises Refused."""
        conn = self._connected()
        request = make_request(conn)
        if request is None:
            return  # a request of a server that is gone: it has ended already
        _check_size(request)
        try:
            reply = getattr(conn.stub, rpc)(request)
        except conn.RpcError as e:
            raise Refused(*conn.refusal(e)) from e
        if reply.status != SUCCESS:
            raise Refused(reply.status, reply.message, named=True)

    def _connection_for_query(self) -> Connection:
        """_connection() for the queries, which raise Unavailable rather than return a status."""
        try:
            return self._connection()
        except Refused as e:  # the server restarted and installing a model again failed
            raise Unavailable(str(e)) from e

    def _connected(self) -> Connection:
        try:
            return self._connection()
        except Unavailable as e:
            raise Refused(FAILED, str(e)) from e

    def _connection(self) -> Connection:
        """The live connection; reconnects (restarting the server this client spawned) when it
        broke. Raises Unavailable, or Refused when installing the models again failed."""
        state = self._state
        conn = state.conn
        if conn is not None and not conn.broken:
            return conn
        with self._lock:
            if self.closed:
                raise Unavailable("this ClientEngine is closed")
            conn = state.conn
            if conn is not None and not conn.broken:
                return conn
            if conn is not None:
                log.warning("%s; reconnecting", conn.broken)
                conn.close(conn.broken)
                state.conn = None
            timeout = self.startup_timeout
            if self._spawn:
                if state.server is not None:
                    state.server.stop(self.shutdown_timeout)  # a server we cannot talk to is of no use
                try:
                    state.server = spawned.SpawnedServer(self._command, self.address, self._env)
                except OSError as e:
                    raise Unavailable(f"cannot start the server ({' '.join(self._command)}): {e}") from e
            elif self._instance_id is not None:
                timeout = self.reconnect_timeout
            conn = Connection(self.address, timeout, state.server, self._token, self._tls_ca)
            state.conn = conn
            if self._instance_id is not None and conn.instance_id != self._instance_id:
                self._instance_id = conn.instance_id
                self._reinstall(conn)
            self._instance_id = conn.instance_id
            return conn

    def _reinstall(self, conn) -> None:
        """A new server: install (and start) again the models this client had installed."""
        pb = wire.pb
        for name, m in list(self._models.items()):
            log.warning("the server restarted: installing model %r again", name)
            try:
                reply = conn.stub.InstallModel(pb.InstallModelRequest(runtime_config_json=m["config_json"]))
                if reply.status == SUCCESS and m["running"]:
                    reply = conn.stub.StartModel(pb.ModelRef(model_name=name))
            except conn.RpcError as e:
                raise Unavailable(conn.lost(e)) from e
            if reply.status != SUCCESS:
                del self._models[name]
                raise Refused(reply.status, f"the server restarted and installing model {name!r} again "
                                            f"failed ({reply.message}); install it again")

    def _queues(self, name, handle) -> list:
        """The queues here of the request `handle` (None: every request) of the model."""
        with self._lock:
            return [r.queue for h, r in self._requests.items() if r.model == name and handle in (None, h)]

    def _note_model(self, name, running) -> None:
        with self._lock:
            if name in self._models:
                self._models[name]["running"] = running

    def _request_ref(self, conn, name, handle):
        """The RequestRef naming `handle` on the server, or None when the handle is one of a server
        that has gone (the request ended with it). A handle this client did not give out is
        refused as the Engine refuses it: the model first (another client may have installed it)."""
        if handle is None:
            return wire.encode_request_ref(name)
        with self._lock:
            known = self._requests.get(handle)
        if known is None or known.model != name:
            self._server_model(name)
            raise unknown_handle(name, handle)
        if known.conn is not conn:
            return None
        return wire.encode_request_ref(name, known.server_handle)


class _Request:
    """A request this client started: where it lives and the queue its events feed."""
    __slots__ = ("conn", "model", "server_handle", "queue")

    def __init__(self, conn, model, server_handle, queue):
        self.conn, self.model, self.server_handle, self.queue = conn, model, server_handle, queue


class _State:
    """What must be cleaned up whether close() is called or not (weakref.finalize holds this,
    never the ClientEngine)."""

    def __init__(self):
        self.conn = None
        self.server = None

    def close(self, why, timeout) -> None:
        if self.conn is not None:
            self.conn.close(why)
            self.conn = None
        if self.server is not None:
            self.server.stop(timeout)
            self.server = None


def _check_size(request) -> None:
    """Refuse a request larger than a message may be, before sending it (the server would refuse
    it with RESOURCE_EXHAUSTED, a failure of the call that says nothing of why)."""
    size = request.ByteSize()
    if size > wire.MAX_MESSAGE_BYTES:
        raise Refused(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                      f"the request is {size} bytes on the wire, over the {wire.MAX_MESSAGE_BYTES} a "
                      f"message may carry")


def _wait_delivered(queues) -> None:
    """After a call that returns once requests have ended on the server (sync, stop, release):
    wait until their queues here have the last events too, which travel on the session stream and
    can arrive after the reply. A broken session ends its queues as interrupted: this cannot hang."""
    for q in queues:
        q.wait_finished()
