"""ClientEngine: the Engine API over gRPC to a server group (proto/dashinfer.proto).

    engine = ClientEngine()                       # spawns a local group, shut down on close()
    engine = ClientEngine("unix:///run/dashinfer.sock")   # or connects to a running one

Every method has the in-process Engine's signature, status codes and messages (the server runs
the Engine's own method; `last_error` holds the reason of the last refused call). Each request's
events travel on this client's session stream, batched with those of its other requests; one
reader thread feeds every ResultQueue (the in-process class) from it, so Get/GetWithTimeout/
GetNoWait/GenerateStatus/GeneratedLength/RequestStatInfo behave as in-process, logprobs included.

Faults: if the server dies or the connection breaks, every open request's queue turns
GenerateInterrupted with the reason in ResultQueue.error, and calls return
ALLSPARK_RUNTIME_ERROR instead of hanging. The next call reconnects; a group this ClientEngine
spawned is started again. A new server knows nothing of the old one, so the models this
ClientEngine installed are installed again (and started again if they were running) before that
call proceeds; if that fails the call returns the error and the model must be installed by the
user. Handles of the old server stay usable for stop/sync/release (the request has ended).
"""
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections import deque

import numpy as np

from .config import ASGenerationConfig, ASGenerationConfigBuilder, AsModelRuntimeConfig
from .types import AsStatus, GenerateRequestStatus, RequestStatInfo, ResultQueue

log = logging.getLogger("dashinfer_client")
server_log = logging.getLogger("dashinfer_client.server")
# A log line of dashinfer_server's format: "<date> <time> <logger>[<pid>] <LEVEL> <message>".
_SERVER_RECORD = re.compile(r"^\S+ \S+ (\S+\[\d+\]) (DEBUG|INFO|WARNING|ERROR|CRITICAL) (.*)$")

SUCCESS = AsStatus.ALLSPARK_SUCCESS
FAILED = AsStatus.ALLSPARK_RUNTIME_ERROR
INTERRUPTED = GenerateRequestStatus.GenerateInterrupted
_FINAL = (GenerateRequestStatus.GenerateFinished, GenerateRequestStatus.GenerateInterrupted,
          GenerateRequestStatus.InternalError)
_COUNT_KEYS = frozenset(RequestStatInfo.COUNT_KEYS)
# Local sockets answer within milliseconds: retry connecting often (gRPC's default waits 1-120 s).
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.keepalive_time_ms", 30000),
                    ("grpc.max_receive_message_length", 64 * 2**20)]


def group_command(address, nodes=None, threads_per_rank=None) -> list:
    """The command that starts a local server group serving on `address`: the launcher, one rank
    per NUMA node (nodes: how many; default every node), threads_per_rank OpenMP threads each
    (default: the cores of its node). Rank 0 shuts the group down when our end of its stdin closes."""
    cmd = [sys.executable, "-m", "dashinfer_server.launch", "--address", address]
    if nodes:
        cmd += ["--nodes", str(int(nodes))]
    if threads_per_rank:
        cmd += ["--threads-per-rank", str(int(threads_per_rank))]
    return cmd + ["--exit-on-stdin-eof"]


def _unique_address() -> str:
    folder = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    if not os.access(folder, os.W_OK):
        folder = "/tmp"
    return f"unix://{folder}/dashinfer-{os.getuid()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"


class Unavailable(Exception):
    """No server to talk to (it could not be started, reached or it is closed)."""


class _Refused(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class _Group:
    """A server group this client spawned: the process, its output tail, its socket."""

    def __init__(self, command, address, env):
        self.address = address
        self.socket = address[len("unix://"):] if address.startswith("unix://") else None
        self.tail = deque(maxlen=40)
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._reader = threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True,
                                        name="dashinfer-server-output")
        self._reader.start()

    def _drain(self, pipe) -> None:
        """Keep the output's tail, and pass its log records on to this process's logging at their
        level (logger dashinfer_client.server), as if the server ran in-process."""
        level = logging.INFO
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            record = _SERVER_RECORD.match(line)
            if record:  # else a continuation (traceback) or foreign output: the previous level
                level = logging.getLevelName(record.group(2))
                line = f"{record.group(1)}: {record.group(3)}"
            server_log.log(level, "%s", line)
        pipe.close()

    @staticmethod
    def _sweep() -> None:
        """A group that died leaves MPICH's shared-memory segments in /dev/shm: remove those no
        process maps any more (the launcher's sweep, run as a process of the server package)."""
        code = ("from dashinfer_server.launch import sweep_stale_mpich_segments as sweep; "
                "sweep(min_age_s=0)")
        subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=60, check=False)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe_exit(self, wait=0.0) -> str:
        """Why the group is gone: its exit code and last output lines ("" while it runs)."""
        try:
            code = self.proc.wait(wait) if wait else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return ""
        self._reader.join(1.0)  # its last lines
        lines = "\n    ".join(list(self.tail)[-15:]) or "(no output)"
        return f"the server process exited with code {code}; its last output:\n    {lines}"

    def stop(self, timeout=15.0) -> None:
        """SIGTERM to the leader (rank 0 or its launcher drains and stops the others), SIGKILL to
        the whole process group after `timeout` s; reap; remove the socket file."""
        proc = self.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the server group did not stop within %.0f s; killing it", timeout)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left (its own session)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.wait() != 0:
            _wait_group_gone(proc.pid)  # its ranks unmap their segments only as they exit
            self._sweep()
        if proc.stdin:
            try:
                proc.stdin.close()
            except OSError:
                pass
        if self.socket:
            try:
                os.unlink(self.socket)
            except FileNotFoundError:
                pass


def _wait_group_gone(pgid, timeout=5.0) -> None:
    """Wait until no process of process group `pgid` is left (or `timeout` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


class _Connection:
    """A channel to one server instance and the session that owns this client's requests on it
    and carries their events."""

    def __init__(self, address, timeout, group=None):
        import grpc
        from .proto import load
        self.grpc = grpc
        self.pb, pb_grpc = load()
        self.address = address
        self.group = group
        self.channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self.stub = pb_grpc.DashInferStub(self.channel)
        self.broken = ""  # why this connection cannot be used any more
        self.routed = {}  # server handle -> queue, until its last event
        self._early = {}  # server handle -> events that came before the handle was registered
        self._lock = threading.Lock()
        try:
            self._wait_healthy(timeout)
            self._session = self.stub.Session(self.pb.SessionRequest())
            first = next(self._session)
        except grpc.RpcError as e:
            self.channel.close()
            raise Unavailable(f"cannot open a session with {address}: {e.code().name}: {e.details()}") from e
        except BaseException:
            self.channel.close()
            raise
        self.session_id, self.instance_id = first.session_id, first.instance_id
        threading.Thread(target=self._watch_session, daemon=True, name="dashinfer-session").start()

    def _wait_healthy(self, timeout) -> None:
        """Poll Health with a growing per-try deadline until it answers; fail early when the group
        this client spawned has exited."""
        grpc = self.grpc
        deadline = time.monotonic() + timeout
        wait = 0.05
        while True:
            if self.group is not None and not self.group.alive():
                raise Unavailable(f"the server group did not start: {self.group.describe_exit(1.0)}")
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"no dashinfer server answered at {self.address} within {timeout:g} s"
                if self.group is not None:
                    why += "; its output so far:\n    " + "\n    ".join(self.group.tail)
                raise Unavailable(why)
            try:
                self.stub.Health(self.pb.Empty(), timeout=min(wait, left), wait_for_ready=True)
                return
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
        except self.grpc.RpcError as e:
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
                _apply(event, queue)
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
                _apply(event, queue)
                if queue.finished:
                    del self.routed[event.handle]

    def _interrupt_routed(self, why) -> None:
        with self._lock:
            queues, self.routed, self._early = list(self.routed.values()), {}, {}
        for queue in queues:
            queue.set_status(INTERRUPTED, why)

    def mark_broken(self, why) -> None:
        if not self.broken:
            self.broken = f"lost the connection to the dashinfer server at {self.address} ({why})"

    def lost(self, error) -> str:
        """The message for a call or stream that failed with `error` (a grpc.RpcError)."""
        return self.broken_by(f"{error.code().name}: {error.details()}")

    def broken_by(self, why) -> str:
        """Mark the connection broken by `why` (the first reason stays) and return the message
        for what it ended: the reason, and how the spawned group exited if it has."""
        self.mark_broken(why)
        exit_note = self.group.describe_exit(1.0) if self.group is not None else ""
        return self.broken + (f"; {exit_note}" if exit_note else "")

    def close(self, why) -> None:
        """End the session (open requests' queues end as interrupted) and close the channel; the
        server releases this session's requests."""
        self.mark_broken(why)
        self._interrupt_routed(why)
        self._session.cancel()
        self.channel.close()


class ClientEngine:
    """The Engine API over gRPC; see the module docstring.

    address: the server's address (unix:///path or HOST:PORT). None: spawn a local group on a
    new private unix socket (nodes ranks, threads_per_rank threads each) and stop it on close(),
    at exit or when this object is garbage-collected. startup_timeout: seconds to wait for the
    server to answer its health check (at start, and when a spawned group is started again).
    reconnect_timeout: seconds a call waits for a server at `address` to answer again after the
    connection broke (a supervisor restarting it). shutdown_timeout: seconds the spawned group gets
    to stop after SIGTERM before it is killed. env: extra environment variables for the spawned group.
    """

    def __init__(self, address=None, nodes=None, threads_per_rank=None, startup_timeout=120.0,
                 reconnect_timeout=10.0, shutdown_timeout=15.0, env=None):
        self._spawn = address is None
        self.address = _unique_address() if self._spawn else address
        self._command = group_command(self.address, nodes, threads_per_rank) if self._spawn else None
        self._env = dict(os.environ, **(env or {}))
        if self._spawn:
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            self._env["PYTHONPATH"] = os.pathsep.join(
                p for p in (root, self._env.get("PYTHONPATH")) if p)  # the server runs this same code
        self.startup_timeout = startup_timeout
        self.reconnect_timeout = reconnect_timeout
        self.shutdown_timeout = shutdown_timeout
        self.last_error = None
        self._reason = threading.local()
        self._lock = threading.RLock()
        self._state = _State()
        self._models = {}  # name -> {"config": dict, "running": bool}, in install order
        self._tokenizers = {}  # model name -> loader whose tokenizer start_request_text uses
        self._tokenizer_lock = threading.Lock()
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
        the group this ClientEngine spawned. Idempotent."""
        with self._lock:
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def call_with_reason(self, method: str, *args):
        """(what `method(*args)` returns, why it was refused or ""): as Engine.call_with_reason."""
        self._reason.text = ""
        result = getattr(self, method)(*args)
        return result, self._reason.text

    # ---- models ---------------------------------------------------------------------------------

    def install_model(self, runtime_cfg) -> AsStatus:
        try:
            cfg = runtime_cfg.build() if hasattr(runtime_cfg, "build") else runtime_cfg
        except Exception as e:  # the Engine reports a failing build() the same way
            return self._refuse("install_model", FAILED, f"{type(e).__name__}: {e}")
        if not isinstance(cfg, AsModelRuntimeConfig):
            return self._refuse("install_model", AsStatus.ALLSPARK_PARAM_ERROR,
                                f"install_model takes an AsModelRuntimeConfig, got {type(cfg).__name__}")
        d = cfg.to_dict()
        d["model_dir"] = os.path.abspath(d["model_dir"])  # the server's working directory is not ours
        status = self._unary("install_model", "InstallModel",
                             lambda conn: conn.pb.InstallModelRequest(runtime_config_json=json.dumps(d)))
        if status == SUCCESS:
            with self._lock:
                self._models[cfg.model_name] = {"config": d, "running": False}
        return status

    def start_model(self, model_name: str) -> AsStatus:
        status = self._unary("start_model", "StartModel", lambda conn: conn.pb.ModelRef(model_name=model_name))
        self._note_model(model_name, status, running=True)
        return status

    def stop_model(self, model_name: str) -> AsStatus:
        queues = self._queues(model_name, None)
        status = self._unary("stop_model", "StopModel", lambda conn: conn.pb.ModelRef(model_name=model_name))
        self._note_model(model_name, status, running=False)
        if status == SUCCESS:
            _wait_delivered(queues)
        return status

    def release_model(self, model_name: str) -> AsStatus:
        queues = self._queues(model_name, None)
        status = self._unary("release_model", "ReleaseModel", lambda conn: conn.pb.ModelRef(model_name=model_name))
        if status == SUCCESS:
            _wait_delivered(queues)
            with self._lock:
                self._models.pop(model_name, None)
                self._tokenizers.pop(model_name, None)
                for handle in [h for h, r in self._requests.items() if r.model == model_name]:
                    del self._requests[handle]  # the server forgot them with the model
        return status

    def get_stats(self) -> dict:
        """The server's view: {"models": {name: {state, requests, running, waiting, kv_blocks_total,
        kv_blocks_free, runtime_config}}, "streams", "sessions", "draining"}; raises Unavailable."""
        try:
            conn = self._connection()
        except _Refused as e:
            raise Unavailable(str(e)) from e
        try:
            reply = conn.stub.GetStats(conn.pb.Empty())
        except conn.grpc.RpcError as e:
            raise Unavailable(conn.lost(e)) from e
        models = {m.model_name: {"state": m.state, "requests": m.requests, "running": m.running,
                                 "waiting": m.waiting, "kv_blocks_total": m.kv_blocks_total,
                                 "kv_blocks_free": m.kv_blocks_free,
                                 "runtime_config": json.loads(m.runtime_config_json)}
                  for m in reply.models}
        return {"models": models, "streams": reply.streams, "sessions": reply.sessions,
                "draining": reply.draining}

    # ---- requests -------------------------------------------------------------------------------

    def start_request_ids(self, model_name: str, model, input_ids, generate_config):
        """-> (AsStatus, handle, ResultQueue); handle and queue are None when refused."""
        try:
            conn = self._connection()
            request = conn.pb.StartRequestRequest(model_name=model_name, session_id=conn.session_id,
                                                  events_on_session=True,
                                                  generation_config_json=_generation_json(generate_config),
                                                  **_encode_ids(input_ids))
        except _Refused as e:
            return self._refuse("start_request", e.status, str(e)), None, None
        except Unavailable as e:
            return self._refuse("start_request", FAILED, str(e)), None, None
        try:
            first = next(iter(conn.stub.StartRequest(request)))  # the only event: the rest come on the session
        except conn.grpc.RpcError as e:
            return self._refuse("start_request", FAILED, conn.lost(e)), None, None
        status = AsStatus(first.started.status)
        if status != SUCCESS:
            return self._refuse_as_server(status, first.started.message), None, None
        handle = next(self._handles)
        queue = ResultQueue(str(handle))
        _apply(first, queue)  # the server's arrival time and prompt length
        with self._lock:
            self._requests[handle] = _Request(conn, model_name, first.handle, queue)
        conn.route(first.handle, queue)
        return SUCCESS, handle, queue

    def start_request_text(self, model_name: str, model, text, generate_config):
        """Tokenize here with the loader's tokenizer (or that of the installed model's files), then
        start_request_ids. A list of texts starts one request each: -> (AsStatus, [handles], [queues])."""
        if isinstance(text, (list, tuple)):
            results = [self.start_request_text(model_name, model, t, generate_config) for t in text]
            bad = [r[0] for r in results if r[0] != SUCCESS]
            return (bad[0] if bad else SUCCESS, [r[1] for r in results], [r[2] for r in results])
        try:
            loader = model if model is not None and hasattr(model, "get_tokenizer") else self._loader(model_name)
            if not isinstance(text, str):
                raise _Refused(AsStatus.ALLSPARK_PARAM_ERROR,
                               f"start_request_text takes a str or a list of str, got {type(text).__name__}")
            with self._tokenizer_lock:  # Hugging Face fast tokenizers are not safe across threads
                ids = loader.get_tokenizer()(text)["input_ids"]
        except _Refused as e:
            return self._refuse("start_request_text", e.status, str(e)), None, None
        return self.start_request_ids(model_name, model, ids, generate_config)

    def stop_request(self, model_name: str, request_handle) -> AsStatus:
        return self._request_call("stop_request", "StopRequest", model_name, request_handle)

    def release_request(self, model_name: str, request_handle) -> AsStatus:
        status = self._request_call("release_request", "ReleaseRequest", model_name, request_handle)
        if status == SUCCESS:
            with self._lock:
                self._requests.pop(request_handle, None)
        return status

    def sync_request(self, model_name: str, request_handle=None) -> AsStatus:
        """Block until the request (None: every request of the model) has ended, and its queue here
        holds everything the server produced."""
        return self._request_call("sync_request", "SyncRequest", model_name, request_handle)

    # ---- internals ------------------------------------------------------------------------------

    def _request_call(self, method, rpc, model_name, request_handle) -> AsStatus:
        """A call that returns once the request(s) ended on the server (stop, release, sync); on
        success it also waits until their queues here hold the last events (_wait_delivered)."""
        queues = self._queues(model_name, request_handle)
        status = self._unary(method, rpc, lambda conn: self._request_ref(conn, model_name, request_handle))
        if status == SUCCESS:
            _wait_delivered(queues)
        return status

    def _connection(self) -> _Connection:
        """The live connection; reconnects (respawning the group this client started) when it broke."""
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
                if state.group is not None:
                    state.group.stop(self.shutdown_timeout)  # a group we cannot talk to is of no use
                try:
                    state.group = _Group(self._command, self.address, self._env)
                except OSError as e:
                    raise Unavailable(f"cannot start the server group ({' '.join(self._command)}): {e}") from e
            elif self._instance_id is not None:
                timeout = self.reconnect_timeout
            conn = _Connection(self.address, timeout, state.group)
            state.conn = conn
            if self._instance_id is not None and conn.instance_id != self._instance_id:
                self._instance_id = conn.instance_id
                self._reinstall(conn)
            self._instance_id = conn.instance_id
            return conn

    def _reinstall(self, conn) -> None:
        """A new server: install (and start) again the models this client had installed."""
        pb = conn.pb
        for name, m in list(self._models.items()):
            log.warning("the server restarted: installing model %r again", name)
            try:
                reply = conn.stub.InstallModel(pb.InstallModelRequest(runtime_config_json=json.dumps(m["config"])))
                if reply.status == SUCCESS and m["running"]:
                    reply = conn.stub.StartModel(pb.ModelRef(model_name=name))
            except conn.grpc.RpcError as e:
                raise Unavailable(conn.lost(e)) from e
            if reply.status != SUCCESS:
                del self._models[name]
                raise _Refused(AsStatus(reply.status),
                               f"the server restarted and installing model {name!r} again failed "
                               f"({reply.message}); install it again")

    def _unary(self, what, rpc, make_request) -> AsStatus:
        try:
            conn = self._connection()
        except Unavailable as e:
            return self._refuse(what, FAILED, str(e))
        except _Refused as e:
            return self._refuse(what, e.status, str(e))
        request = make_request(conn)
        if request is None:
            return SUCCESS  # a request of a server that is gone: it has ended already
        try:
            reply = getattr(conn.stub, rpc)(request)
        except conn.grpc.RpcError as e:
            return self._refuse(what, FAILED, conn.lost(e))
        status = AsStatus(reply.status)
        if status != SUCCESS:
            return self._refuse_as_server(status, reply.message)
        return status

    def _queues(self, model_name, handle) -> list:
        """The queues here of the request `handle` (None: every request) of the model."""
        with self._lock:
            return [r.queue for h, r in self._requests.items() if r.model == model_name and handle in (None, h)]

    def _note_model(self, name, status, running) -> None:
        if status == SUCCESS:
            with self._lock:
                if name in self._models:
                    self._models[name]["running"] = running

    def _loader(self, model_name):
        """The serialized model whose tokenizer start_request_text uses when no loader is given."""
        loader = self._tokenizers.get(model_name)
        if loader is not None:
            return loader
        cfg = self._models.get(model_name, {}).get("config")
        if cfg is None:
            try:
                cfg = self.get_stats()["models"].get(model_name, {}).get("runtime_config")
            except Unavailable as e:
                raise _Refused(FAILED, str(e)) from e
        if cfg is None:
            raise _Refused(AsStatus.ALLSPARK_PARAM_ERROR, f"unknown model {model_name!r}")
        from .model.serialized import DashInferModel
        try:
            loader = DashInferModel(cfg["model_dir"], cfg["model_prefix"])
        except Exception as e:
            raise _Refused(AsStatus.ALLSPARK_PARAM_ERROR,
                           f"cannot read the tokenizer of {model_name!r} here ({e}); pass its loader as "
                           f"`model`") from e
        self._tokenizers[model_name] = loader
        return loader

    def _request_ref(self, conn, model_name, handle):
        """The RequestRef naming `handle` on the server, or None when the handle is one of a server
        that has gone (the request ended with it). A handle this client did not give out goes as
        its repr, for the server to refuse in the Engine's words."""
        pb = conn.pb
        if handle is None:
            return pb.RequestRef(model_name=model_name)
        with self._lock:
            known = self._requests.get(handle) if _is_int(handle) else None
        if known is None or known.model != model_name:
            return pb.RequestRef(model_name=model_name, foreign=repr(handle))
        if known.conn is not conn:
            return None
        return pb.RequestRef(model_name=model_name, id=known.server_handle)

    def _refuse(self, what, status, message) -> AsStatus:
        """A call refused here, before or without the server."""
        message = f"{what}: {message}"
        self.last_error = self._reason.text = message
        log.error("%s (%s)", message, AsStatus(status).name)
        return AsStatus(status)

    def _refuse_as_server(self, status, message) -> AsStatus:
        """A call the server refused, logged here as the in-process Engine logs it (a spawned
        server's own line of it comes through too, later: logger dashinfer_client.server)."""
        self.last_error = self._reason.text = message
        log.error("%s (%s)", message, AsStatus(status).name)
        return AsStatus(status)


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
        self.group = None

    def close(self, why, timeout) -> None:
        if self.conn is not None:
            self.conn.close(why)
            self.conn = None
        if self.group is not None:
            self.group.stop(timeout)
            self.group = None


def _wait_delivered(queues) -> None:
    """After a call that returns once requests have ended on the server (sync, stop, release):
    wait until their queues here have the last events too, which travel on the session stream and
    can arrive after the reply. A broken session ends its queues as interrupted: this cannot hang."""
    for q in queues:
        q.wait_finished()


def _apply(event, queue) -> None:
    """Mirror one server event into the client's queue: tokens first, then the status."""
    status = GenerateRequestStatus(event.status)
    if event.stats:
        queue.update_stats({k: int(v) if k in _COUNT_KEYS else v for k, v in event.stats.items()})
    if event.finish_reason:
        queue.update_stats(finish_reason=event.finish_reason)
    if status == GenerateRequestStatus.ContextFinished and queue.GenerateStatus() < status:
        queue.set_status(status)
    if event.ids or event.tensors:
        logprobs = token_logprobs = None
        if event.token_logprobs:
            logprobs = [list(zip(top.ids, top.logprobs)) for top in event.log_probs]
            token_logprobs = list(event.token_logprobs)
        tensors = {name: np.frombuffer(t.data, dtype=np.dtype(t.dtype)).reshape(tuple(t.shape))
                   for name, t in event.tensors.items()}
        queue.push(list(event.ids), logprobs, token_logprobs, prefix_cache_len=event.prefix_cache_len,
                   prefix_len_gpu=event.prefix_len_gpu, prefix_len_cpu=event.prefix_len_cpu,
                   tensors=tensors or None)
    if status in _FINAL or status > queue.GenerateStatus():
        queue.set_status(status, event.error or None)


def _encode_ids(input_ids) -> dict:
    """input_ids as StartRequestRequest fields: an integer array's values and shape, else its JSON
    (for the server's Engine to refuse with its own message)."""
    try:
        arr = np.asarray(input_ids.tolist() if hasattr(input_ids, "tolist") else input_ids)
    except Exception:
        arr = None
    if arr is not None and (arr.dtype.kind in "iu" or arr.size == 0) and arr.ndim > 0:
        if arr.size == 0 or (arr.min() >= -2**63 and arr.max() < 2**63):
            return {"input_ids": arr.astype(np.int64).ravel().tolist(), "input_shape": list(arr.shape)}
    try:
        return {"input_ids_json": json.dumps(input_ids, default=repr)}
    except (TypeError, ValueError):
        return {"input_ids_json": json.dumps(repr(input_ids))}


def _generation_json(gen) -> str:
    """The generation config as the Engine accepts it: ASGenerationConfig.to_dict() or the user's dict."""
    if isinstance(gen, ASGenerationConfigBuilder):
        try:
            gen = gen.build()
        except Exception as e:  # the Engine reports a failing build() the same way
            raise _Refused(FAILED, f"{type(e).__name__}: {e}") from e
    if isinstance(gen, ASGenerationConfig):
        gen = gen.to_dict()
    if not isinstance(gen, dict):
        raise _Refused(AsStatus.ALLSPARK_PARAM_ERROR,
                       f"generate_config must be an ASGenerationConfig(Builder), got {type(gen).__name__}")
    return json.dumps(gen, default=repr)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
