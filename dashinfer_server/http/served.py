"""The model an HTTP server serves: its engine (Engine for tp 1, a ClientEngine over tp ranks),
its tokenizer and chat template, and its state (loading, serving, failed, draining).

Everything here blocks (engine calls, gRPC): the app calls it from worker threads.
"""
import logging
import threading
import time

from dashinfer_client.frontend import Prompts, start_engine
from dashinfer_client.refusals import Refused

from .errors import refused, unavailable

log = logging.getLogger("dashinfer_server.http")


class ServedModel:
    """name: the model's name in the API; tp: tensor-parallel ranks (1: in-process Engine)."""

    def __init__(self, model_dir, prefix, name, tp=1, threads=0, max_batch=32, max_length=None,
                 kv_cache_mode="AsCacheDefault", engine_env=None, tool_parser=None, reasoning_parser=None):
        """tool_parser / reasoning_parser: a parser's name (frontend/parsers) instead of the one the
        chat template speaks; ValueError for an unknown one."""
        from dashinfer_client.model.serialized import DashInferModel
        self.loader = DashInferModel(model_dir, prefix)
        self.tokenizer = self.loader.get_tokenizer()
        self.prompts = Prompts(self.tokenizer, tool_parser, reasoning_parser)
        self.name, self.tp, self.threads, self.engine_env = name, tp, threads, engine_env
        # Longer than the context is refused by install_model, with its message.
        self.max_length = max_length or min(self.loader.get_model_context_length(), 2048)
        self.runtime = (self.loader.create_reference_runtime_config_builder(name, "CPU", [0], max_batch)
                        .max_length(self.max_length).kv_cache_mode(kv_cache_mode).thread_num(threads)
                        .build())
        # The model's own generation defaults (its eos ids), under each request's options.
        self.defaults = self.loader.create_reference_generation_config_builder(self.runtime).build().to_dict()
        del self.defaults["seed"]  # each request draws its own unless it names one
        self.engine = None
        self.owns_model = True  # False: attached to a model someone else installed
        self.state = "loading"  # -> serving -> draining, or -> failed
        self.why = "the model is loading"
        self.restarts = 0  # times the rank group was found lost and came back
        self._instance = None
        self._probe = None
        self._recovering = threading.Lock()

    @classmethod
    def attach(cls, engine, name):
        """The model `name` a running rank group (engine: a ClientEngine) already serves."""
        models = engine.get_stats()["models"]
        if name is None and len(models) == 1:
            name = next(iter(models))
        if name not in models:
            raise RuntimeError(f"the server serves {', '.join(map(repr, models)) or 'no model'}"
                               + (f", not {name!r}" if name else "; name one"))
        cfg = models[name]["runtime_config"]
        served = cls(cfg["model_dir"], cfg["model_prefix"], name, max_batch=cfg["max_batch"],
                     max_length=cfg["max_length"])
        served.engine, served.owns_model, served.state, served.why = engine, False, "serving", ""
        return served

    # ---- lifetime -------------------------------------------------------------------------------

    def load(self) -> None:
        """Start the engine and the model; raises ValueError when the engine refuses the model or its
        limits, RuntimeError (EngineStartError) when the rank group cannot start."""
        started = time.monotonic()
        try:
            self.engine = start_engine(self.runtime, self.tp, self.threads, self.engine_env)
        except Refused as e:  # the engine refuses this configuration
            raise ValueError(str(e)) from None
        if self.tp > 1:
            self._probe = _GroupProbe(self.engine.address)
            self._instance = self._probe.instance()
        self.state, self.why = "serving", ""
        log.info("model %r serving: %d rank(s), max_length %d, max_batch %d, loaded in %.1f s",
                 self.name, self.tp, self.max_length, self.runtime.max_batch, time.monotonic() - started)

    def drain(self, why="the server is shutting down") -> None:
        self.state, self.why = "draining", why

    def close(self) -> None:
        if self.engine is None:
            return
        if self.owns_model:
            self.engine.release_model(self.name)
        if hasattr(self.engine, "close"):
            self.engine.close()
        if self._probe is not None:
            self._probe.close()

    # ---- requests -------------------------------------------------------------------------------

    def start(self, job):
        """-> (handle, queue); ApiError when the engine refuses."""
        if self.state != "serving":
            raise unavailable(self.why)
        try:
            return self.engine.submit(self.name, job.prompt_ids, dict(self.defaults, **job.generation))
        except Refused as e:
            raise refused(e) from None

    def finish(self, handle, queue, request_id="") -> None:
        """Stop the request if it still runs, free everything it holds, log one line about it."""
        self.engine.release_request(self.name, handle)
        info = queue.RequestStatInfo()
        log.info("request %s finished: %d prompt + %d generated tokens, TTFT %.0f ms, %.1f tok/s, "
                 "finish_reason %s", request_id or handle, info["context_token_length"],
                 info["generated_token_length"], info["time_to_first_token"], info["generate_tps"],
                 info["finish_reason"] or "?")

    # ---- health and stats -----------------------------------------------------------------------

    def stats(self):
        """{running, waiting, kv_blocks_total, kv_blocks_free, ...} of the model, or None (also while
        the rank group is down: get_stats would wait for its restart)."""
        if self.state not in ("serving", "draining") or not hasattr(self.engine, "get_stats"):
            return None
        if self._probe is not None and self._probe.instance() is None:
            return None
        try:
            return self.engine.get_stats()["models"].get(self.name)
        except Exception as e:  # the group is lost: health says so
            log.debug("stats unavailable: %s", e)
            return None

    def health(self):
        """-> (serving, why not)."""
        if self.state != "serving":
            return False, self.why
        if self._probe is None:
            return True, ""
        instance = self._probe.instance()
        if instance is None:
            self._recover()
            return False, "the rank group does not answer (a rank failed); it is being restarted"
        if instance != self._instance:
            self._instance = instance
            self.restarts += 1
            log.warning("the rank group was restarted (%d restart(s) so far)", self.restarts)
        model = self.stats()
        if not model or model.get("state") != "Running":
            self._recover()
            return False, "the model is being installed again after a rank group restart"
        return True, ""

    def _recover(self) -> None:
        """Let the ClientEngine bring the group and the model back (its next call does), once at a time."""
        if not self._recovering.acquire(blocking=False):
            return

        def call():
            try:
                self.engine.get_stats()
            except Exception as e:
                log.warning("the rank group is not back yet: %s", e)
            finally:
                self._recovering.release()
        threading.Thread(target=call, name="dashinfer-http-recover", daemon=True).start()


class _GroupProbe:
    """The rank group's own health RPC, on a channel of its own: it never waits for a restart."""

    def __init__(self, address):
        import grpc

        from dashinfer_client.proto import load
        self.grpc = grpc
        self.pb, pb_grpc = load()
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.DashInferStub(self.channel)

    def instance(self):
        """The serving instance's id, or None when it does not answer or is draining."""
        try:
            reply = self.stub.Health(self.pb.Empty(), timeout=1.0)
        except self.grpc.RpcError:
            return None
        return reply.instance_id if reply.ready else None

    def close(self) -> None:
        self.channel.close()

