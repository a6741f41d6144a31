"""The model an HTTP server serves: its engine (Engine for tp 1, a ClientEngine over tp ranks),
its tokenizer and chat template, and its state (loading, serving, failed, draining).

Everything here blocks (engine calls, gRPC): the app calls it from worker threads.
"""
import logging
import threading
import time

from dashinfer_client import settings
from dashinfer_client.frontend import Prompts, start_engine
from dashinfer_client.refusals import Refused
from dashinfer_client.token_bytes import TokenBytes

from .errors import refused, unavailable
from .protocol import sampling_defaults

log = logging.getLogger("dashinfer_server.http")
PROBE_TIMEOUT_S = 0.4  # /health and /metrics answer within a second: two probes fit in it


class ServedModel:
    """name: the model's name in the API; tp: tensor-parallel ranks (1: in-process Engine)."""

    def __init__(self, model_dir, prefix, name, tp=1, threads=0, max_batch=32, max_length=None,
                 kv_cache_mode="AsCacheDefault", engine_env=None, tool_parser=None, reasoning_parser=None):
        """tool_parser / reasoning_parser: a parser's name (frontend/parsers) instead of the one the
        chat template speaks; ValueError for an unknown one."""
        from dashinfer_client.model.serialized import DashInferModel
        self.loader = DashInferModel(model_dir, prefix)
        self.tokenizer = self.loader.get_tokenizer()
        self.token_bytes = TokenBytes(self.tokenizer)  # logprobs' bytes of each token
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
        # what a request that names no sampling option samples with (shown in /v1/models)
        self.sampling_defaults = sampling_defaults(self.loader.generation_config)
        self.engine = None
        self.owns_model = True  # False: attached to a model someone else installed
        self.state = "loading"  # -> serving -> draining, or -> failed
        self.why = "the model is loading"
        self.restarts = 0  # times the rank group was found lost and came back
        self._instance = None
        self._running_on = None  # the instance last seen running the model
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
        log.info("request %s finished: %d prompt (%d cached) + %d generated tokens, TTFT %.0f ms, %.1f tok/s, "
                 "finish_reason %s", request_id or handle, info["context_token_length"],
                 info["context_cached_length"], info["generated_token_length"], info["time_to_first_token"], info["generate_tps"],
                 info["finish_reason"] or "?")

    # ---- health and stats -----------------------------------------------------------------------

    def stats(self):
        """{running, waiting, kv_blocks_total, kv_blocks_free, ...} of the model, or None (also while
        the rank group is down: get_stats would wait for its restart)."""
        if self.state not in ("serving", "draining") or not hasattr(self.engine, "get_stats"):
            return None
        if self._probe is not None:  # on the probe's own channel, bounded: a busy rank 0 answers late
            return self._probe.model_stats(self.name)
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
        if model is None and instance == self._running_on:
            return True, ""  # it answered Health, and ran the model on this instance: busy, not lost
        if not model or model.get("state") != "Running":
            self._running_on = None
            self._recover()
            return False, "the model is being installed again after a rank group restart"
        self._running_on = instance
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
    """The rank group's own health and stats RPCs, on a channel of its own: they never wait for a
    restart, nor behind the requests' calls. Its calls carry the token the ClientEngine's do."""

    def __init__(self, address):
        import os

        import grpc

        from dashinfer_client.connection import open_channel
        from dashinfer_client.proto import load
        self.grpc = grpc
        self.pb, pb_grpc = load()
        self.channel, _ = open_channel(address, settings.get("DASHINFER_TOKEN"))
        self.stub = pb_grpc.DashInferStub(self.channel)

    def instance(self):
        """The serving instance's id, or None when it does not answer or is draining."""
        try:
            reply = self.stub.Health(self.pb.Empty(), timeout=PROBE_TIMEOUT_S)
        except self.grpc.RpcError:
            return None
        return reply.instance_id if reply.ready else None

    def model_stats(self, name):
        """The model's get_stats() entry, or None when the group does not answer in time."""
        from dashinfer_client.proto import wire
        try:
            reply = self.stub.GetStats(self.pb.Empty(), timeout=PROBE_TIMEOUT_S)
        except self.grpc.RpcError as e:
            log.debug("stats unavailable: %s", e)
            return None
        return wire.decode_stats(reply)["models"].get(name)

    def close(self) -> None:
        self.channel.close()

