"""The in-process Engine: DashInfer's API over ModelLoop (one main-loop thread per model).

Every call returns an AsStatus (and logs why when it is an error); nothing a caller passes
raises from deep inside or stops the other requests. Calls that wait (stop_request,
release_request, sync_request, stop_model) wait without holding the engine's lock, so other
user threads keep starting and stopping requests meanwhile.

Semantics follow DashInfer's AsEngine:
  stop_model     graceful: new requests are refused at once (ALLSPARK_REQUEST_DENIED), the
                 requests already started run to their end, then the scheduler thread stops.
                 (DashInfer also waits for every request to be released; that makes a caller who
                 stops before releasing wait forever, so here the queues simply stay readable.)
  start_model    on a Stopped model restarts it (warm-up included).
  release_model  stops the model if it runs, then frees its weights, KV cache and workspaces.
  stop_request   returns once the request has ended: GenerateFinished, its tokens so far
                 delivered, its KV blocks freed; its queue stays readable until release_request.
  release_request  stop_request, then forget the handle (later calls: ILLEGAL_REQUEST_ID).
  sync_request   blocks until the request (handle None: every request of the model) has ended.
"""
import ctypes
import enum
import gc
import logging
import threading

from dashinfer_client.config import AsModelRuntimeConfig
from dashinfer_client.types import AsStatus

from .request import ModelLimits, RequestError, new_request

log = logging.getLogger("dashinfer_server")


class ModelState(enum.Enum):
    Initial = "Initial"
    Running = "Running"
    Stopped = "Stopped"
    Released = "Released"


class EngineError(Exception):
    """A refused call: its status and the reason."""

    def __init__(self, status: AsStatus, message: str):
        super().__init__(message)
        self.status = status


class _Installed:
    def __init__(self, cfg, model):
        self.cfg, self.model = cfg, model
        self.state = ModelState.Initial
        self.stopping = False  # stop_model is waiting for the running requests
        self.runner = None
        self.requests = {}  # handle -> Sequence, until release_request


class Engine:
    def __init__(self, group=None):
        from .parallel import LocalGroup
        self._group = group or LocalGroup()
        self._models = {}
        self._lock = threading.RLock()
        self._tokenizer_lock = threading.Lock()  # HF fast tokenizers are not safe across threads
        self.last_error = None  # the reason of the last refused call, for logs
        self._reason = threading.local()  # the reason of the calling thread's last refused call

    def call_with_reason(self, method: str, *args):
        """(what `method(*args)` returns, why it was refused or "" when it was not).

        For the gRPC service: the reason is this call's own, even when other threads call the
        Engine at the same time (last_error may already hold another call's reason)."""
        self._reason.text = ""
        result = getattr(self, method)(*args)
        return result, self._reason.text

    # ---- models ----------------------------------------------------------------------------

    def install_model(self, runtime_cfg) -> AsStatus:
        def install():
            cfg = runtime_cfg.build() if hasattr(runtime_cfg, "build") else runtime_cfg
            if not isinstance(cfg, AsModelRuntimeConfig):
                raise EngineError(AsStatus.ALLSPARK_PARAM_ERROR,
                                  f"install_model takes an AsModelRuntimeConfig, got {type(cfg).__name__}")
            if cfg.model_name in self._models:
                raise EngineError(AsStatus.ALLSPARK_INVALID_CALL_ERROR,
                                  f"model {cfg.model_name!r} is already installed")
            from dashinfer_client.model.serialized import DashInferModel
            try:
                model = DashInferModel(cfg.model_dir, cfg.model_prefix)
            except Exception as e:
                raise EngineError(AsStatus.ALLSPARK_IO_ERROR, f"cannot load model files: {e}") from e
            context = model.config.max_position_embeddings
            if cfg.max_length > context:
                raise EngineError(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                                  f"max_length {cfg.max_length} exceeds the model's context {context}")
            self._group.command("install_model", cfg.to_dict())
            self._models[cfg.model_name] = _Installed(cfg, model)
        return self._call("install_model", install)

    def start_model(self, model_name: str) -> AsStatus:
        def start():
            m = self._model(model_name, (ModelState.Initial, ModelState.Stopped))
            self._group.command("start_model", {"model_name": model_name})
            if m.runner is None:
                from .model_loop import ModelLoop
                m.runner = ModelLoop(m.model, m.cfg, self._group)
            m.runner.start()
            m.state = ModelState.Running
        return self._call("start_model", start)

    def stop_model(self, model_name: str) -> AsStatus:
        def begin():
            m = self._model(model_name, (ModelState.Running,))
            if m.stopping:
                raise EngineError(AsStatus.ALLSPARK_INVALID_CALL_ERROR,
                                  f"model {model_name!r} is already being stopped")
            m.stopping = True
            return m
        status, m = self._call_for("stop_model", begin)
        if status != AsStatus.ALLSPARK_SUCCESS:
            return status
        self._wait_ended(m, list(m.requests.values()))

        def stop():
            m.runner.stop()
            m.stopping = False
            self._group.command("stop_model", {"model_name": model_name})
            m.state = ModelState.Stopped
        return self._call("stop_model", stop)

    def release_model(self, model_name: str) -> AsStatus:
        with self._lock:
            m = self._models.get(model_name)
            running = m is not None and m.state == ModelState.Running and not m.stopping
        if running:
            status = self.stop_model(model_name)
            if status != AsStatus.ALLSPARK_SUCCESS:
                return status

        def release():
            m = self._model(model_name, (ModelState.Initial, ModelState.Stopped))
            self._group.command("release_model", {"model_name": model_name})
            m.state = ModelState.Released
            m.runner = m.model = None
            del self._models[model_name]
        status = self._call("release_model", release)
        if status == AsStatus.ALLSPARK_SUCCESS:
            _return_memory_to_os()
        return status

    def get_model_state(self, model_name: str):
        with self._lock:
            m = self._models.get(model_name)
            return m.state if m else ModelState.Released

    # ---- requests --------------------------------------------------------------------------

    def start_request_ids(self, model_name: str, model, input_ids, generate_config):
        """-> (AsStatus, handle, ResultQueue); handle and queue are None when refused."""
        def start():
            m = self._model(model_name)
            if m.stopping or m.state == ModelState.Stopped:
                raise EngineError(AsStatus.ALLSPARK_REQUEST_DENIED,
                                  f"model {model_name!r} is stopped or stopping: no new requests")
            self._model(model_name, (ModelState.Running,))
            limits = ModelLimits(m.model.config.vocab_size, m.cfg.max_length, m.runner.block_capacity)
            try:
                seq = new_request(input_ids, generate_config, limits)
            except RequestError as e:
                raise EngineError(e.status, str(e)) from e
            m.requests[seq.handle] = seq
            m.runner.submit(seq)
            return seq
        status, seq = self._call_for("start_request", start)
        return (status, seq.handle, seq.queue) if seq is not None else (status, None, None)

    def start_request_text(self, model_name: str, model, text, generate_config):
        """Tokenize with the loader's tokenizer (or the installed model's), then start_request_ids.
        A list of texts starts one request each: -> (AsStatus, [handles], [queues]), the status
        being the first failure if any."""
        if isinstance(text, (list, tuple)):
            results = [self.start_request_text(model_name, model, t, generate_config) for t in text]
            bad = [r[0] for r in results if r[0] != AsStatus.ALLSPARK_SUCCESS]
            return (bad[0] if bad else AsStatus.ALLSPARK_SUCCESS,
                    [r[1] for r in results], [r[2] for r in results])
        try:
            with self._lock:
                installed = self._models.get(model_name)
            loader = model if model is not None and hasattr(model, "get_tokenizer") else \
                (installed.model if installed else None)
            if loader is None:
                raise EngineError(AsStatus.ALLSPARK_PARAM_ERROR, f"unknown model {model_name!r}")
            if not isinstance(text, str):
                raise EngineError(AsStatus.ALLSPARK_PARAM_ERROR,
                                  f"start_request_text takes a str or a list of str, got {type(text).__name__}")
            with self._tokenizer_lock:
                ids = loader.get_tokenizer()(text)["input_ids"]
        except EngineError as e:
            return self._refuse("start_request_text", e), None, None
        except Exception as e:
            return self._refuse("start_request_text", EngineError(
                AsStatus.ALLSPARK_PARAM_ERROR, f"cannot tokenize the text: {type(e).__name__}: {e}")), None, None
        return self.start_request_ids(model_name, model, ids, generate_config)

    def stop_request(self, model_name: str, request_handle) -> AsStatus:
        status, found = self._call_for("stop_request", lambda: self._stop(model_name, request_handle))
        if status == AsStatus.ALLSPARK_SUCCESS:
            self._wait_ended(*found)
        return status

    def release_request(self, model_name: str, request_handle) -> AsStatus:
        status, found = self._call_for("release_request", lambda: self._stop(model_name, request_handle))
        if status != AsStatus.ALLSPARK_SUCCESS:
            return status
        self._wait_ended(*found)
        m, (seq,) = found
        with self._lock:
            m.requests.pop(seq.handle, None)
        return status

    def sync_request(self, model_name: str, request_handle=None) -> AsStatus:
        """Block until the request (None: every request of the model) has ended."""
        def find():
            if request_handle is None:
                m = self._model(model_name)
                return m, list(m.requests.values())
            m, seq = self._request(model_name, request_handle)
            return m, [seq]
        status, found = self._call_for("sync_request", find)
        if status == AsStatus.ALLSPARK_SUCCESS:
            self._wait_ended(*found)
        return status

    def _stop(self, model_name, handle):
        m, seq = self._request(model_name, handle)
        if m.runner is not None and not seq.queue.finished:
            m.runner.stop_request(seq)
        return m, [seq]

    @staticmethod
    def _wait_ended(m, seqs) -> None:
        """Wait (no lock held) until every queue of `seqs` is final; give up on a dead scheduler
        thread rather than hang (it only dies on a bug, which it has logged)."""
        for seq in seqs:
            while not seq.queue.wait_finished(0.1):
                runner = m.runner
                if runner is None or not runner.alive:
                    log.error("request %d: the scheduler thread of %r is not running", seq.handle,
                              m.cfg.model_name)
                    return

    # ---- checks ----------------------------------------------------------------------------

    def _call(self, what, fn) -> AsStatus:
        return self._call_for(what, fn)[0]

    def _call_for(self, what, fn):
        """Run fn under the lock -> (AsStatus, fn's result or None)."""
        try:
            with self._lock:
                return AsStatus.ALLSPARK_SUCCESS, fn()
        except EngineError as e:
            return self._refuse(what, e), None
        except MemoryError as e:
            log.exception("%s failed", what)
            return self._refuse(what, EngineError(AsStatus.ALLSPARK_MEMORY_ERROR, f"out of memory: {e}")), None
        except Exception as e:  # not the caller's fault: say so and keep serving
            log.exception("%s failed", what)
            return self._refuse(what, EngineError(AsStatus.ALLSPARK_RUNTIME_ERROR,
                                                  f"{type(e).__name__}: {e}")), None

    def _refuse(self, what, e: EngineError) -> AsStatus:
        self.last_error = self._reason.text = f"{what}: {e}"
        log.error("%s refused (%s): %s", what, e.status.name, e)
        return e.status

    def _model(self, name, states=None) -> _Installed:
        m = self._models.get(name) if isinstance(name, str) else None
        if m is None:
            raise EngineError(AsStatus.ALLSPARK_PARAM_ERROR, f"unknown model {name!r}")
        if states and m.state not in states:
            raise EngineError(AsStatus.ALLSPARK_INVALID_CALL_ERROR,
                              f"model {name!r} is {m.state.value}, this call needs "
                              + " or ".join(s.value for s in states))
        return m

    def _request(self, model_name, handle):
        m = self._model(model_name)
        seq = m.requests.get(handle) if isinstance(handle, int) else None
        if seq is None:
            raise EngineError(AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID,
                              f"unknown request handle {handle!r} for model {model_name!r}")
        return m, seq


def _return_memory_to_os() -> None:
    """After a model is released: collect it now and hand glibc's freed heap back to the OS
    (packed weights are many mid-sized buffers that otherwise stay in the process)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
