"""DashInfer's API, written once for both engines: the in-process Engine (dashinfer_server) and
ClientEngine (over gRPC) inherit EngineAPI, so they have the same methods, check their arguments
the same way and refuse with the same status and message.

Every call returns an AsStatus (and logs why when it is an error); `last_error` holds the reason
of the last refused call, call_with_reason the reason of this thread's own call. Nothing a caller
passes raises (but the get_* calls, which return data, not a status: they raise TypeError on
anything that is not a ResultQueue). What does not depend on the engine is checked here: the model name (a str that
UTF-8 can carry), the handle (an int), the configs (build() called here; a failing build() is
the caller's ALLSPARK_PARAM_ERROR), the texts of start_request_text and their tokenizer (one
request per text of a list; Hugging Face fast tokenizers are not safe across threads: one lock).

An engine implements the primitives (the underscored methods below that raise
NotImplementedError, plus get_stats, close and world_size). They get checked arguments and
refuse by raising Refused; any other exception is reported as ALLSPARK_RUNTIME_ERROR (a bug,
logged with its traceback) and the engine keeps serving.

DashInfer's raw request API and LoRA refusals (raw_requests.RawRequestAPI) and its queries
(queries.QueryAPI) are mixins of EngineAPI, over the same primitives; refusals.py has Refused and
the checks that do not depend on the engine.

serialize_model_from_torch is DashInfer 1.3's conversion, not an engine call: like the loaders'
serialize_to_path it raises ModelSerializerException for what it cannot convert.
"""
import dataclasses
import logging
import threading

from . import settings
from .config import ASGenerationConfig, ASGenerationConfigBuilder, AsModelRuntimeConfig
from .generation_config import check_generation
from .queries import QueryAPI
from .raw_requests import RawRequestAPI
from .refusals import CALLER_MISTAKES, PARAM_ERROR, SUCCESS, Refused, checked_model_name, unknown_handle
from .types import AsStatus, ModelState
from .unserved import UnservedAPI


class EngineAPI(RawRequestAPI, QueryAPI, UnservedAPI):
    log = logging.getLogger("dashinfer_client")

    def __init__(self):
        settings.check_environment()  # a bad DASHINFER_* value refuses the engine, before any work
        self.last_error = None  # the reason of the last refused call, for logs
        self._reason = threading.local()  # the reason of the calling thread's last refused call
        self._tokenizer_lock = threading.Lock()

    def call_with_reason(self, method: str, *args):
        """(what `method(*args)` returns, why it was refused or "" when it was not); the reason
        is this call's own, even when other threads call the engine at the same time (for the
        gRPC service; last_error may already hold another call's reason)."""
        result, _, reason = self.call_with_status(method, *args)
        return result, reason

    def call_with_status(self, method: str, *args):
        """(what `method(*args)` returns, its AsStatus, why it was refused or ""): as
        call_with_reason, with the status too, for the calls that return a value, not a status
        (DashInfer's queries)."""
        self._reason.text, self._reason.status = "", SUCCESS
        result = getattr(self, method)(*args)
        return result, self._reason.status, self._reason.text

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- models ----------------------------------------------------------------------------------

    def install_model(self, as_model_config_struct) -> AsStatus:
        """as_model_config_struct: a runtime config (built or its builder; DashInfer's keyword)."""
        return self._guarded("install_model",
                             lambda: self._install_model(_runtime_config(as_model_config_struct)))[0]

    def build_model_from_config_struct(self, as_model_config) -> AsStatus:
        """DashInfer's install under its older name: an AsModelConfig struct (model_path and
        weights_path name the serialized files, .asgraph/.asparam or DashInfer 1.3's
        .dimodel/.ditensors) or any config install_model takes."""
        return self.install_model(as_model_config)

    def serialize_model_from_torch(self, model_name, model_type, torch_model, model_config, save_dir,
                                   multinode_mode=1, data_type="float32", do_dynamic_quantize_convert=False,
                                   quant_config=None, use_dynamic_ntk=False, use_logn_attn=False,
                                   model_sequence_length=2048, seqlen_extrapolation=1.0, rotary_base=None,
                                   **options):
        """DashInfer 1.3's conversion of a torch model in memory into {save_dir}/{model_name}.dimodel
        and .ditensors, in its argument order (dashinfer_client/model/torch_model.py says what each
        does). Needs no engine: both engines offer it because DashInfer's did. Raises
        ModelSerializerException for what it cannot convert, as the loaders' serialize_to_path does."""
        from .model.torch_model import serialize_model_from_torch
        return serialize_model_from_torch(
            model_name, model_type, torch_model, model_config, save_dir, multinode_mode, data_type,
            do_dynamic_quantize_convert, quant_config, use_dynamic_ntk, use_logn_attn, model_sequence_length,
            seqlen_extrapolation, rotary_base, **options)

    def start_model(self, model_name: str) -> AsStatus:
        return self._guarded("start_model", lambda: self._start_model(checked_model_name(model_name)))[0]

    def stop_model(self, model_name: str) -> AsStatus:
        return self._guarded("stop_model", lambda: self._stop_model(checked_model_name(model_name)))[0]

    def release_model(self, model_name: str) -> AsStatus:
        return self._guarded("release_model", lambda: self._release_model(checked_model_name(model_name)))[0]

    def get_model_state(self, model_name: str) -> ModelState:
        """The model's state; Released for a model not installed. A query, not a call: like
        get_stats it raises (ClientEngine: Unavailable) when there is no server to ask."""
        model = self.get_stats()["models"].get(model_name) if isinstance(model_name, str) else None
        return model["state"] if model else ModelState.Released

    # ---- requests --------------------------------------------------------------------------------

    def start_request_ids(self, model_name: str, model, input_ids, generate_config_builder):
        """-> (AsStatus, handle, ResultQueue); handle and queue are None when refused. model: the
        loader (unused by the engines; DashInfer's signature). generate_config_builder: an
        ASGenerationConfigBuilder, or its built dict."""
        return self._start(model_name, model, lambda: input_ids, generate_config_builder)

    def start_request_text(self, model_name: str, model, input_str_or_array, generate_config_builder):
        """Tokenize with the loader's tokenizer (model; else that of the installed model's files),
        then start_request_ids. A list of texts starts one request each: -> (AsStatus, [handles],
        [queues]), the status being the first failure if any."""
        text = input_str_or_array
        if isinstance(text, (list, tuple)):
            results = [self.start_request_text(model_name, model, t, generate_config_builder) for t in text]
            bad = [r[0] for r in results if r[0] != SUCCESS]
            return bad[0] if bad else SUCCESS, [r[1] for r in results], [r[2] for r in results]
        status, ids = self._guarded("start_request_text", lambda: self._tokenize(model_name, model, text))
        if status != SUCCESS:
            return status, None, None
        return self.start_request_ids(model_name, model, ids, generate_config_builder)

    def stop_request(self, model_name: str, request_handle) -> AsStatus:
        """Returns once the request has ended; its queue stays readable until release_request."""
        return self._guarded("stop_request", lambda: self._stop_request(*_request(model_name, request_handle)))[0]

    def release_request(self, model_name: str, request_handle) -> AsStatus:
        """stop_request, then forget the handle."""
        return self._guarded("release_request",
                             lambda: self._release_request(*_request(model_name, request_handle)))[0]

    def sync_request(self, model_name: str, request_handle=None) -> AsStatus:
        """Block until the request (None: every request of the model) has ended."""
        def sync():
            if request_handle is None:
                return self._sync_request(checked_model_name(model_name), None)
            return self._sync_request(*_request(model_name, request_handle))
        return self._guarded("sync_request", sync)[0]

    # ---- typed calls (the front doors'): they raise Refused instead of returning a status --------

    def serve_model(self, runtime_config) -> None:
        """install_model, then start_model; Refused (its status and reason) when either refuses."""
        cfg = self._typed("install_model", lambda: _runtime_config(runtime_config))
        self._typed("install_model", lambda: self._install_model(cfg))
        self._typed("start_model", lambda: self._start_model(cfg.model_name))

    def submit(self, model_name: str, input_ids, generation):
        """start_request_ids -> (handle, ResultQueue); Refused when the engine refuses the request
        (its reason says what is wrong, without the call's name: a front door's client made no call
        of that name)."""
        return self._typed("start_request", lambda: self._start_request(
            checked_model_name(model_name), None, input_ids, _generation_config(generation)))

    # ---- primitives --------------------------------------------------------------------------------

    def get_stats(self) -> dict:
        """{"models": {name: {"state": ModelState, "requests" (handles held), "running" (in the
        batch), "waiting" (queued for it), "kv_blocks_total", "kv_blocks_free", "preemptions" (sequences
        preempted for KV blocks so far, each recomputed later), "runtime_config"
        (AsModelRuntimeConfig.to_dict())}}, "streams", "sessions" (of the gRPC service: request
        streams and client sessions open; 0 in-process), "draining" (the service is shutting down)}."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def world_size(self) -> int:
        """Tensor-parallel ranks serving the models."""
        raise NotImplementedError

    def _install_model(self, cfg: AsModelRuntimeConfig) -> None:
        raise NotImplementedError

    def _start_model(self, name: str) -> None:
        raise NotImplementedError

    def _stop_model(self, name: str) -> None:
        raise NotImplementedError

    def _release_model(self, name: str) -> None:
        raise NotImplementedError

    def _start_request(self, name: str, loader, input_ids, gen):
        """gen: an ASGenerationConfig or a dict of its options -> (handle, queue)."""
        raise NotImplementedError

    def _stop_request(self, name: str, handle: int) -> None:
        raise NotImplementedError

    def _release_request(self, name: str, handle: int) -> None:
        raise NotImplementedError

    def _sync_request(self, name: str, handle) -> None:
        raise NotImplementedError

    def _tokenizer_loader(self, name: str):
        """The loader whose tokenizer start_request_text uses when it is given none."""
        raise NotImplementedError

    def _check_installed(self, name: str) -> None:
        """Refuse (Refused) a model the serving engine does not hold, or an engine it cannot ask."""
        raise NotImplementedError

    # ---- internals ---------------------------------------------------------------------------------

    def _start(self, model_name, model, input_ids, gen):
        """The request of start_request(_ids): input_ids() -> the ids (it may refuse)."""
        status, started = self._guarded("start_request", lambda: self._start_request(
            checked_model_name(model_name), model, input_ids(), _generation_config(gen)))
        return (status, *started) if started is not None else (status, None, None)

    def _tokenize(self, model_name, model, text) -> list:
        name = checked_model_name(model_name)
        loader = model if model is not None and hasattr(model, "get_tokenizer") else self._tokenizer_loader(name)
        if not isinstance(text, str):
            raise Refused(PARAM_ERROR, f"start_request_text takes a str or a list of str, got {type(text).__name__}")
        try:
            with self._tokenizer_lock:
                return loader.get_tokenizer()(text)["input_ids"]
        except Exception as e:
            raise Refused(PARAM_ERROR, f"cannot tokenize the text: {type(e).__name__}: {e}") from e

    def _raising(self, what, fn):
        """fn()'s result; any failure raised as Refused (one not the caller's fault is logged with
        its traceback and becomes ALLSPARK_MEMORY_ERROR or ALLSPARK_RUNTIME_ERROR)."""
        try:
            return fn()
        except Refused:
            raise
        except MemoryError as e:
            self.log.exception("%s failed", what)
            raise Refused(AsStatus.ALLSPARK_MEMORY_ERROR, f"out of memory: {e}") from e
        except Exception as e:  # not the caller's fault: say so and keep serving
            self.log.exception("%s failed", what)
            raise Refused(AsStatus.ALLSPARK_RUNTIME_ERROR, f"{type(e).__name__}: {e}") from e

    def _typed(self, what, fn):
        """fn()'s result; a refusal is logged and kept in last_error as the status-returning calls
        do, then raised."""
        try:
            return self._raising(what, fn)
        except Refused as e:
            self._refuse(what, e)
            raise

    def _guarded(self, what, fn):
        """fn() -> (SUCCESS, its result), or (the refusal's status, None)."""
        try:
            return SUCCESS, self._raising(what, fn)
        except Refused as e:
            return self._refuse(what, e), None

    def _refuse(self, what, e: Refused) -> AsStatus:
        self.last_error = self._reason.text = str(e) if e.named else f"{what}: {e}"
        self._reason.status = e.status
        level = logging.WARNING if e.status in CALLER_MISTAKES else logging.ERROR
        self.log.log(level, "%s (%s)", self.last_error, e.status.name)
        return e.status


# ---- the checks that do not depend on the engine -------------------------------------------------------

def _request(model_name, handle):
    """(model name, handle) checked: the handle must be an int (one this engine gave out)."""
    name = checked_model_name(model_name)
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise unknown_handle(name, handle)
    return name, handle


def _runtime_config(cfg) -> AsModelRuntimeConfig:
    if hasattr(cfg, "build"):
        try:
            cfg = cfg.build()
        except Exception as e:
            raise Refused(PARAM_ERROR, f"the runtime config does not build: {type(e).__name__}: {e}") from e
    if not isinstance(cfg, AsModelRuntimeConfig):
        raise Refused(PARAM_ERROR, f"install_model takes an AsModelRuntimeConfig, got {type(cfg).__name__}")
    try:  # checked again: its fields can be set after build(); a checked copy, the caller's stays
        cfg = dataclasses.replace(cfg)
    except (ValueError, TypeError) as e:
        raise Refused(PARAM_ERROR, f"the runtime config: {e}") from e
    if not checked_model_name(cfg.model_name):
        raise Refused(PARAM_ERROR, "the runtime config: model_name must be set (a non-empty string)")
    return cfg


def _generation_config(gen) -> dict:
    """A builder built, an ASGenerationConfig or a dict of options checked -> a plain dict of
    every option in its normal form (ints, floats, lists: what a ClientEngine sends as JSON
    unchanged; a set, a numpy scalar or bytes would not survive the trip). The engine checks it
    again against the model."""
    if isinstance(gen, ASGenerationConfigBuilder):
        try:
            gen = gen.build()
        except Exception as e:
            raise Refused(PARAM_ERROR, f"generate_config: {e}") from e
    if not isinstance(gen, (ASGenerationConfig, dict)):
        raise Refused(PARAM_ERROR,
                      f"generate_config must be an ASGenerationConfig(Builder), got {type(gen).__name__}")
    try:
        return check_generation(gen)
    except ValueError as e:
        raise Refused(PARAM_ERROR, f"generate_config: {e}") from e
