"""The in-process Engine: DashInfer's API over ModelLoop (one main-loop thread per model).

The API's front half (argument checks, refusals, last_error, start_request_text) is
dashinfer_client.api.EngineAPI's, shared with ClientEngine; here are its primitives. Nothing a
caller passes raises from deep inside or stops the other requests. Calls that wait (stop_request,
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
import gc
import logging
import threading

from dashinfer_client.api import EngineAPI, ModelState
from dashinfer_client.refusals import Refused, unknown_handle, unknown_model
from dashinfer_client.introspection import file_information, version_full
from dashinfer_client.model.serialized import DashInferModel
from dashinfer_client.types import AsStatus

from . import op_profile
from .engine_stat import engine_stat, model_info
from .group import LocalGroup
from .guided import Grammars
from .memory_fit import check_fits
from .model_loop import ModelLoop
from .request import ModelLimits, RequestError, new_request

log = logging.getLogger("dashinfer_server")


class _Installed:
    def __init__(self, cfg, model):
        self.cfg, self.model = cfg, model
        self.state = ModelState.Initial
        self.stopping = False  # stop_model is waiting for the running requests
        self.loop = None
        self.requests = {}  # handle -> Sequence, until release_request
        self.grammars = Grammars(model.get_tokenizer, model.config.vocab_size)  # response_format


class Engine(EngineAPI):
    """DashInfer's API in-process: the front half is EngineAPI's, the primitives are here."""
    log = log

    def __init__(self, group=None):
        super().__init__()
        self._group = group or LocalGroup()
        self._models = {}
        self._lock = threading.RLock()

    @property
    def world_size(self) -> int:
        return self._group.world

    def close(self) -> None:
        """Release every model (stopping those that run); the Engine stays usable."""
        with self._lock:
            names = list(self._models)
        for name in names:
            self.release_model(name)

    def get_stats(self) -> dict:
        with self._lock:
            models = {name: _model_stats(m) for name, m in self._models.items()}
        return {"models": models, "streams": 0, "sessions": 0, "draining": False}

    # ---- models ----------------------------------------------------------------------------

    def _install_model(self, cfg) -> None:
        with self._lock:
            if cfg.model_name in self._models:
                raise Refused(AsStatus.ALLSPARK_INVALID_CALL_ERROR,
                              f"model {cfg.model_name!r} is already installed")
            try:
                model = DashInferModel(cfg.model_dir, cfg.model_prefix)
            except Exception as e:
                raise Refused(AsStatus.ALLSPARK_IO_ERROR, f"cannot load model files: {e}") from e
            context = model.config.max_position_embeddings
            if cfg.max_length > context:
                raise Refused(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                              f"max_length {cfg.max_length} exceeds the model's context {context}")
            check_fits(cfg, model, self._group.world)  # refused now, not killed halfway through loading
            self._group.command("install_model", cfg.to_dict())
            self._models[cfg.model_name] = _Installed(cfg, model)

    def _start_model(self, name) -> None:
        with self._lock:
            m = self._model(name, (ModelState.Initial, ModelState.Stopped))
            self._group.command("start_model", {"model_name": name})
            if m.loop is None:
                m.loop = ModelLoop(m.model, m.cfg, self._group)
            m.loop.start()
            m.state = ModelState.Running

    def _stop_model(self, name) -> None:
        with self._lock:
            m = self._model(name, (ModelState.Running,))
            if m.stopping:
                raise Refused(AsStatus.ALLSPARK_INVALID_CALL_ERROR, f"model {name!r} is already being stopped")
            m.stopping = True
        self._wait_ended(m, list(m.requests.values()))
        with self._lock:
            m.loop.stop()
            m.stopping = False
            self._group.command("stop_model", {"model_name": name})
            m.state = ModelState.Stopped

    def _release_model(self, name) -> None:
        with self._lock:
            m = self._models.get(name)
            running = m is not None and m.state == ModelState.Running and not m.stopping
        if running:
            self._stop_model(name)
        with self._lock:
            m = self._model(name, (ModelState.Initial, ModelState.Stopped))
            self._group.command("release_model", {"model_name": name})
            m.state = ModelState.Released
            m.loop = m.model = None
            del self._models[name]
        _return_memory_to_os()

    # ---- requests --------------------------------------------------------------------------

    def _start_request(self, name, loader, input_ids, gen):
        with self._lock:
            m = self._model(name)
            if m.stopping or m.state == ModelState.Stopped:
                raise Refused(AsStatus.ALLSPARK_REQUEST_DENIED, f"model {name!r} is stopped or stopping: no new requests")
            self._model(name, (ModelState.Running,))
            limits = ModelLimits(m.model.config.vocab_size, m.cfg.max_length, m.loop.block_capacity)
            try:
                seq = new_request(input_ids, gen, limits, m.grammars)
            except RequestError as e:
                raise Refused(e.status, str(e)) from e
            m.requests[seq.handle] = seq
            m.loop.submit(seq)
            return seq.handle, seq.queue

    def _tokenizer_loader(self, name):
        with self._lock:
            return self._model(name).model

    def _stop_request(self, name, handle) -> None:
        self._wait_ended(*self._stop(name, handle))

    def _release_request(self, name, handle) -> None:
        m, seqs = self._stop(name, handle)
        self._wait_ended(m, seqs)
        with self._lock:
            m.requests.pop(handle, None)

    def _sync_request(self, name, handle) -> None:
        with self._lock:
            if handle is None:
                m = self._model(name)
                seqs = list(m.requests.values())
            else:
                m, seq = self._request(name, handle)
                seqs = [seq]
        self._wait_ended(m, seqs)

    def _stop(self, name, handle):
        with self._lock:
            m, seq = self._request(name, handle)
            if m.loop is not None and not seq.queue.finished:
                m.loop.stop_request(seq)
            return m, [seq]

    @staticmethod
    def _wait_ended(m, seqs) -> None:
        """Wait (no lock held) until every queue of `seqs` is final; give up on a dead scheduler
        thread rather than hang (it only dies on a bug, which it has logged)."""
        for seq in seqs:
            while not seq.queue.wait_finished(0.1):
                loop = m.loop
                if loop is None or not loop.alive:
                    log.error("request %d: the scheduler thread of %r is not running", seq.handle,
                              m.cfg.model_name)
                    return

    # ---- introspection -----------------------------------------------------------------------

    def _introspect(self, what, *args):
        if what == "get_version_full":
            return version_full()
        if what == "get_rank_id":
            return self._group.rank
        if what == "is_allspark_work_as_service":
            return False
        if what == "get_file_information":
            return _file_information(*args)
        with self._lock:
            m = self._model(args[0])
        if what in ("get_as_engine_stat", "get_free_frame"):
            stat = engine_stat(args[0], m.model.config.num_hidden_layers, m.loop)
            return stat.to_dict() if what == "get_as_engine_stat" else stat.free_span
        if what == "get_model_info":
            return model_info(args[0], m.model, m.cfg)
        if what == "get_op_profiling_info":
            profiler = m.loop.profiler if m.loop is not None else None
            if profiler is None:
                log.warning("get_op_profiling_info(%r): the model runs unprofiled; start it with "
                            "%s=ON in the environment of the serving process", args[0], op_profile.ENV)
                return ""
            return profiler.report(self._group.rank)
        if what in ("unload_device_mem", "load_device_mem"):
            return None
        raise ValueError(f"unknown query {what!r}")

    # ---- checks ----------------------------------------------------------------------------

    def _model(self, name, states=None) -> _Installed:
        m = self._models.get(name)
        if m is None:
            raise unknown_model(name)
        if states and m.state not in states:
            raise Refused(AsStatus.ALLSPARK_INVALID_CALL_ERROR,
                          f"model {name!r} is {m.state.value}, this call needs "
                          + " or ".join(s.value for s in states))
        return m

    def _check_installed(self, name) -> None:
        self._model(name)

    def _request(self, model_name, handle):
        m = self._model(model_name)
        seq = m.requests.get(handle)
        if seq is None:
            raise unknown_handle(model_name, handle)
        return m, seq


def _model_stats(m) -> dict:
    """One model's entry of get_stats()."""
    loop = m.loop
    return {"state": m.state, "requests": len(m.requests),
            "running": len(loop.scheduler.running) if loop else 0,
            "waiting": len(loop.scheduler.waiting) if loop else 0,
            "kv_blocks_total": len(loop.pool.blocks) if loop else 0,
            "kv_blocks_free": loop.pool.num_available if loop else 0,
            "preemptions": loop.scheduler.preemptions if loop and loop.scheduler else 0,
            "runtime_config": m.cfg.to_dict()}


def _file_information(graph, param) -> dict:
    try:
        return file_information(graph, param).to_dict()
    except OSError as e:
        raise Refused(AsStatus.ALLSPARK_IO_ERROR, f"cannot read {e.filename}: {e.strerror}") from e
    except ValueError as e:
        raise Refused(AsStatus.ALLSPARK_PARAM_ERROR, str(e)) from e


def _return_memory_to_os() -> None:
    """After a model is released: collect it now and hand glibc's freed heap back to the OS
    (packed weights are many mid-sized buffers that otherwise stay in the process)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
