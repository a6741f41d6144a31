"""The in-process Engine: DashInfer's API over ModelRunner (one scheduler thread per model).

Every call returns an AsStatus (and logs why when it is an error); nothing a caller passes
raises from deep inside or stops the other requests.
"""
import enum
import logging
import threading

import numpy as np

from dashinfer_client.config import ASGenerationConfig, ASGenerationConfigBuilder, AsModelRuntimeConfig
from dashinfer_client.types import AsStatus, ResultQueue

from .sequence import Sequence

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
        self.runner = None
        self.requests = {}  # handle -> Sequence


class Engine:
    def __init__(self, group=None):
        from .parallel import LocalGroup
        self._group = group or LocalGroup()
        self._models = {}
        self._lock = threading.RLock()
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
                from .runner import ModelRunner
                m.runner = ModelRunner(m.model, m.cfg, self._group)
            m.runner.start()
            m.state = ModelState.Running
        return self._call("start_model", start)

    def stop_model(self, model_name: str) -> AsStatus:
        def stop():
            m = self._model(model_name, (ModelState.Running,))
            m.runner.stop()
            self._group.command("stop_model", {"model_name": model_name})
            m.state = ModelState.Stopped
        return self._call("stop_model", stop)

    def release_model(self, model_name: str) -> AsStatus:
        def release():
            m = self._model(model_name, (ModelState.Initial, ModelState.Running, ModelState.Stopped))
            if m.state == ModelState.Running:
                m.runner.stop()
            self._group.command("release_model", {"model_name": model_name})
            m.state = ModelState.Released
            del self._models[model_name]
        return self._call("release_model", release)

    def get_model_state(self, model_name: str):
        with self._lock:
            m = self._models.get(model_name)
            return m.state if m else ModelState.Released

    # ---- requests --------------------------------------------------------------------------

    def start_request_ids(self, model_name: str, model, input_ids, generate_config):
        """-> (AsStatus, handle, ResultQueue); handle and queue are None when refused."""
        out = {}

        def start():
            m = self._model(model_name, (ModelState.Running,))
            ids = self._check_ids(input_ids, m)
            gen = self._check_generation(generate_config, m, len(ids))
            from .sampler import RequestSamplingState
            seq = Sequence(ids, gen.max_length)
            seq.queue = ResultQueue(str(seq.handle))
            seq.queue.update_stats(context_token_length=len(ids))
            seq.sampling = RequestSamplingState(self._sampling_params(gen), ids)
            m.requests[seq.handle] = seq
            m.runner.submit(seq)
            out["handle"], out["queue"] = seq.handle, seq.queue
        status = self._call("start_request", start)
        return status, out.get("handle"), out.get("queue")

    def start_request_text(self, model_name: str, model, text, generate_config):
        """Tokenize with the loader's tokenizer (or the installed model's), then start_request_ids.
        A list of texts starts one request each: -> (AsStatus, [handles], [queues])."""
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
            ids = loader.get_tokenizer()(text)["input_ids"]
        except EngineError as e:
            return self._refuse("start_request_text", e), None, None
        return self.start_request_ids(model_name, model, ids, generate_config)

    def stop_request(self, model_name: str, request_handle) -> AsStatus:
        def stop():
            m, seq = self._request(model_name, request_handle)
            if m.runner is not None and not seq.queue.finished:
                m.runner.stop_request(seq)
        return self._call("stop_request", stop)

    def release_request(self, model_name: str, request_handle) -> AsStatus:
        def release():
            m, seq = self._request(model_name, request_handle)
            if m.runner is not None and not seq.queue.finished:
                m.runner.stop_request(seq)
            del m.requests[seq.handle]
        return self._call("release_request", release)

    def sync_request(self, model_name: str, request_handle=None) -> AsStatus:
        """Block until the request (None: every request of the model) has ended."""
        try:
            with self._lock:
                if request_handle is None:
                    seqs = list(self._model(model_name).requests.values())
                else:
                    seqs = [self._request(model_name, request_handle)[1]]
        except EngineError as e:
            return self._refuse("sync_request", e)
        for seq in seqs:
            seq.queue.wait_finished()
        return AsStatus.ALLSPARK_SUCCESS

    # ---- checks ----------------------------------------------------------------------------

    def _call(self, what, fn) -> AsStatus:
        try:
            with self._lock:
                fn()
            return AsStatus.ALLSPARK_SUCCESS
        except EngineError as e:
            return self._refuse(what, e)
        except Exception as e:  # not the caller's fault: say so and keep serving
            log.exception("%s failed", what)
            return self._refuse(what, EngineError(AsStatus.ALLSPARK_RUNTIME_ERROR, f"{type(e).__name__}: {e}"))

    def _refuse(self, what, e: EngineError) -> AsStatus:
        self.last_error = self._reason.text = f"{what}: {e}"
        log.error("%s refused (%s): %s", what, e.status.name, e)
        return e.status

    def _model(self, name, states=None) -> _Installed:
        m = self._models.get(name)
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

    @staticmethod
    def _check_ids(input_ids, m) -> list:
        try:
            arr = np.asarray(input_ids.tolist() if hasattr(input_ids, "tolist") else input_ids)
        except Exception:
            arr = None
        if arr is None or arr.dtype.kind not in "iu" and arr.size:
            raise EngineError(AsStatus.ALLSPARK_PARAM_ERROR, "input_ids must be a list of integers")
        arr = arr.reshape(-1) if arr.ndim == 2 and arr.shape[0] == 1 else arr
        if arr.ndim != 1:
            raise EngineError(AsStatus.ALLSPARK_PARAM_ERROR,
                              f"input_ids must be one sequence of ids, got shape {arr.shape}")
        if arr.size == 0:
            raise EngineError(AsStatus.ALLSPARK_EMPTY_REQUEST, "input_ids is empty")
        vocab = m.model.config.vocab_size
        bad = arr[(arr < 0) | (arr >= vocab)]
        if bad.size:
            raise EngineError(AsStatus.ALLSPARK_PARAM_ERROR,
                              f"input id {int(bad[0])} is outside the vocabulary [0, {vocab})")
        if arr.size >= m.cfg.max_length:
            raise EngineError(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                              f"prompt of {arr.size} tokens leaves no room under max_length {m.cfg.max_length}")
        if arr.size + 1 > m.runner.block_capacity:
            raise EngineError(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                              f"prompt of {arr.size} tokens exceeds the KV cache of {m.runner.block_capacity}")
        return [int(i) for i in arr]

    @staticmethod
    def _check_generation(gen, m, prompt_len) -> ASGenerationConfig:
        if isinstance(gen, ASGenerationConfigBuilder):
            gen = gen.build()
        if isinstance(gen, dict):
            gen = ASGenerationConfigBuilder().update(gen).build()
        if not isinstance(gen, ASGenerationConfig):
            raise EngineError(AsStatus.ALLSPARK_PARAM_ERROR,
                              f"generate_config must be an ASGenerationConfig(Builder), got {type(gen).__name__}")
        for key in ("lora_name", "mm_info", "response_format"):
            if getattr(gen, key):
                raise EngineError(AsStatus.ALLSPARK_REQUEST_DENIED,
                                  f"{key} is not supported by this CPU runtime")
        if gen.max_length > m.cfg.max_length:
            raise EngineError(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                              f"generation max_length {gen.max_length} exceeds the engine's {m.cfg.max_length}")
        if gen.max_length <= prompt_len:
            raise EngineError(AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR,
                              f"generation max_length {gen.max_length} leaves no room after the "
                              f"{prompt_len}-token prompt")
        from .sampler import validate
        try:
            validate(Engine._sampling_params(gen), m.model.config.vocab_size, prompt_len)
        except ValueError as e:
            raise EngineError(AsStatus.ALLSPARK_PARAM_ERROR, str(e)) from e
        return gen

    @staticmethod
    def _sampling_params(gen):
        from .sampler import SamplingParams
        return SamplingParams.from_config(gen)
