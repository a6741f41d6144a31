"""The loop of a rank > 0: mirror rank 0's commands and run its shard of every step.

Commands (install/start/stop/release model) are answered with ok or the error, so rank 0's
Engine returns an error status. A failure during a step cannot be answered: rank 0 and the
other workers wait in a collective for this rank, so the rank aborts the whole MPI job at once
and the supervisor (systemd Restart=, or ClientEngine) starts a new group.
"""
import logging
import signal

from dashinfer_client.config import AsModelRuntimeConfig

log = logging.getLogger("dashinfer_server")


class _Model:
    def __init__(self, cfg, files):
        self.cfg, self.files = cfg, files
        self.decoder = None  # built by start_model, kept across stop/start as on rank 0


class Worker:
    """The models of this rank, by name, and what each command does to them."""

    def __init__(self, group):
        self.group = group
        self.models = {}

    def install_model(self, payload: dict) -> None:
        from dashinfer_client.model.serialized import DashInferModel
        cfg = AsModelRuntimeConfig.from_dict(payload)
        # a retry after a failure elsewhere in the group replaces what this rank had
        self.models[cfg.model_name] = _Model(cfg, DashInferModel(cfg.model_dir, cfg.model_prefix))

    def start_model(self, payload: dict) -> None:
        from .model import apply_thread_num, build_decoder
        m = self._model(payload)
        apply_thread_num(m.cfg)
        if m.decoder is None:
            m.decoder = build_decoder(m.files, m.cfg, self.group)

    def stop_model(self, payload: dict) -> None:
        self._model(payload)

    def release_model(self, payload: dict) -> None:
        self.models.pop(self._model(payload).cfg.model_name)

    def _model(self, payload: dict) -> _Model:
        name = payload["model_name"]
        if name not in self.models:
            raise KeyError(f"model {name!r} is not installed on rank {self.group.rank}")
        return self.models[name]

    def step(self, model_name: str, plan) -> None:
        m = self.models.get(model_name)
        if m is None or m.decoder is None:
            raise RuntimeError(f"a step for model {model_name!r}, which is not started on this rank")
        m.decoder.forward(plan)


COMMANDS = ("install_model", "start_model", "stop_model", "release_model")


def run_worker(group) -> int:
    """Serve rank 0 until it says shutdown; returns the exit code (0)."""
    # Rank 0 drains on SIGTERM and then shuts the workers down; mpiexec forwards the signal to
    # every rank, so a worker must not die of it on its own.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: log.info("rank %d: %s: waiting for rank 0 to shut down",
                                                 group.rank, signal.Signals(s).name))
    worker = Worker(group)
    log.info("rank %d of %d: worker ready", group.rank, group.world)
    while True:
        message = group.receive()
        if message[0] == "shutdown":
            log.info("rank %d: shutdown", group.rank)
            return 0
        if message[0] == "command":
            _, name, payload = message
            try:
                if name not in COMMANDS:
                    raise ValueError(f"unknown command {name!r}")
                getattr(worker, name)(payload)
            except Exception as e:
                log.exception("rank %d: %s failed", group.rank, name)
                group.reply(f"{type(e).__name__}: {e}")
            else:
                group.reply(None)
            continue
        _, model_name, plan = message
        try:
            worker.step(model_name, plan)
        except BaseException:
            log.critical("rank %d: step failed: aborting the group", group.rank, exc_info=True)
            group.abort(1)
