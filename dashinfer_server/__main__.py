"""One server rank: `python -m dashinfer_server --address ADDR [options]`.

Rank 0 runs the Engine and serves gRPC on ADDR (default: a unix socket private to the process;
a token is required on any other than a unix socket or loopback, see docs/security.md); under
mpiexec the other ranks run the worker loop. With --model-dir/--model-prefix/--model-name
the model is installed and started before the service accepts calls (the systemd use case).
The line "dashinfer_server: ready ..." is printed once the service accepts calls; under systemd
(Type=notify) rank 0 then sends READY=1, and STOPPING=1 when it begins to drain.
SIGTERM or SIGINT: stop admitting requests, let running ones finish for --grace-period seconds
(then interrupt them), stop the models, close, exit 0.
A configuration error (bad flags, a model path that holds no model, a placement this machine
cannot give, a model the runtime refuses) exits 78 (EX_CONFIG): restarting cannot fix it, and
the systemd units say RestartPreventExitStatus=78.
"""
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from dashinfer_client import settings
from dashinfer_client.config import AsModelRuntimeConfigBuilder
from dashinfer_client.model.serialized import DashInferModel
from dashinfer_client.proto.wire import unix_socket_path
from dashinfer_client.types import AsStatus

from . import access, limits, logs, systemd
from . import kernels as K
from .engine import Engine
from .grpc_server import remove_socket, serve
from .group import init_group
from .launch import mapped_mpich_segments
from .startup_log import log_startup, startup_summary
from .arguments import UsageParser, at_least, grpc_address
from .systemd import EX_CONFIG
from .topology import PlacementError
from .worker import run_worker

log = logging.getLogger("dashinfer_server")
# Engine refusals of install_model that a restart cannot fix: the files or the options are wrong.
CONFIG_STATUSES = {"ALLSPARK_PARAM_ERROR", "ALLSPARK_IO_ERROR", "ALLSPARK_EXCEED_LIMIT_ERROR",
                   "ALLSPARK_INVALID_CALL_ERROR"}


class ConfigError(Exception):
    """A configuration a restart cannot fix: exit EX_CONFIG."""


def parse_args(argv=None):
    p = UsageParser(prog="python -m dashinfer_server", description=__doc__.split("\n")[0])
    p.add_argument("--address", type=grpc_address, default=None,
                   help="unix:///path.sock or HOST:PORT (default: a unix socket under $XDG_RUNTIME_DIR or /tmp)")
    p.add_argument("--threads", type=int, default=0, help="compute threads of this rank (default: all its cores)")
    p.add_argument("--model-dir", help="serialized model directory to install at start")
    p.add_argument("--model-prefix", help="file prefix of the serialized model ({dir}/{prefix}.asgraph)")
    p.add_argument("--model-name", help="name to install the model under")
    p.add_argument("--max-batch", type=int, default=None)
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--kv-cache-mode", default=None, help="AsCacheDefault, AsCacheQuantI8 or AsCacheQuantU4")
    p.add_argument("--grace-period", type=at_least(0, float), default=30.0,
                   help="seconds running requests get to finish on SIGTERM before they are interrupted")
    p.add_argument("--exit-on-stdin-eof", action="store_true",
                   help="shut down when stdin closes (set by a ClientEngine that spawned this server)")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=logs.LEVELS)
    p.add_argument("--log-format", default="text", choices=logs.FORMATS,
                   help="text (one line per record) or json (one JSON object per line)")
    access.add_arguments(p)
    limits.add_arguments(p)
    args = p.parse_args(argv)
    try:  # before any model loads: a server that may not listen this way does not start
        args.access, args.tls = access.from_arguments(args, os.environ)
        args.limits = limits.from_arguments(args)
        if args.address:
            args.access.check_listen(args.address, args.tls is not None)
    except ValueError as e:
        p.error(str(e))
    model_flags = (args.model_dir, args.model_prefix, args.model_name)
    if any(model_flags) and not all(model_flags):
        p.error("--model-dir, --model-prefix and --model-name go together")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    if args.model_dir:
        graph = os.path.join(args.model_dir, args.model_prefix + ".asgraph")
        if not os.path.isfile(graph):
            p.error(f"no serialized model at {graph} (--model-dir {args.model_dir}, --model-prefix "
                    f"{args.model_prefix})")
    return args


def runtime_config(args):
    b = AsModelRuntimeConfigBuilder().model_name(args.model_name).model_dir(
        os.path.abspath(args.model_dir), args.model_prefix)
    if args.threads:
        b.thread_num(args.threads)
    if args.max_batch is not None:
        b.max_batch(args.max_batch)
    if args.max_length is not None:
        b.max_length(args.max_length)
    if args.kv_cache_mode is not None:
        b.kv_cache_mode(args.kv_cache_mode)
    return b.build()


def _watch_stdin(stop: threading.Event, address: str) -> None:
    """Wake `stop` when stdin reaches EOF: the spawning client is gone, even if it was killed. Its
    socket goes at once, and our output to /dev/null: the client read it, and mpiexec, writing it
    to a pipe nobody reads, would die of SIGPIPE and take the group down before it cleaned up."""
    def watch():
        try:
            while os.read(sys.stdin.fileno(), 4096):
                pass
        except OSError:
            pass
        remove_socket(unix_socket_path(address) if address else None)
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        log.info("stdin closed: the client that spawned this server is gone; shutting down")
        stop.set()
    threading.Thread(target=watch, name="dashinfer-stdin-watch", daemon=True).start()


def _sweep_after_exit(address: str) -> None:
    """Start a detached process that removes this group's unix socket and MPICH segments once its
    ranks are gone: MPICH removes its segments only when the job ends cleanly, and when the client
    dies mpiexec loses its output pipe and may kill the ranks before rank 0 removes anything, so
    the sweeper starts now and sleeps on the ranks' exits."""
    paths = sorted(mapped_mpich_segments("/proc/self/maps"))
    socket = unix_socket_path(address) if address else None
    paths += [socket] if socket else []
    if paths:
        code = ("import sys; from dashinfer_server.launch import sweep_after_exit; "
                "sweep_after_exit(int(sys.argv[1]), sys.argv[2:])")
        subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), *paths], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        settings.check_environment()
        group = init_group(args.threads or None)  # first: it places the rank before the kernels load
    except (PlacementError, settings.SettingError) as e:
        log.error("%s", e)
        return EX_CONFIG
    if group.rank > 0:
        return run_worker(group) or 0

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    # A server a ClientEngine spawned is that client's, not the service's: it tells systemd nothing
    # (it may inherit NOTIFY_SOCKET from a service that runs the client).
    notify = (lambda state: False) if args.exit_on_stdin_eof else systemd.notify
    if args.exit_on_stdin_eof:
        _watch_stdin(stop, args.address)
        _sweep_after_exit(args.address)
    if args.threads:
        K.set_num_threads(args.threads)

    engine = Engine(group)
    try:
        try:
            cfg, timings = _start_model(engine, args, notify) if args.model_dir else (None, {})
        except ConfigError as e:
            log.error("%s", e)
            return EX_CONFIG
        except RuntimeError as e:
            log.error("%s", e)
            return 1
        if stop.is_set():
            return 0
        try:
            server = serve(engine, args.address, access=args.access, tls=args.tls, limits=args.limits,
                           finished_request_ttl=args.finished_request_ttl)
        except RuntimeError as e:
            log.error("%s", e)
            return 1
        _log_startup(cfg, group.world, server.address, args.threads, timings)
        print(f"dashinfer_server: ready on {server.address} (pid {os.getpid()}, {group.world} rank(s))",
              flush=True)
        # under mpiexec this rank is not the unit's main process: the units say NotifyAccess=all
        notify(f"READY=1\nSTATUS=serving on {server.address}")
        stop.wait()
        log.info("shutting down (grace period %.0f s)", args.grace_period)
        notify("STOPPING=1\nSTATUS=draining: running requests finish, new ones are refused")
        server.shutdown(args.grace_period)
        return 0
    finally:
        engine.close()  # releases the models
        group.close()  # the other ranks exit


def _start_model(engine, args, notify):
    """Install and start the model of the flags -> (runtime config, {"load_s", "start_s"});
    ConfigError when the options or files are wrong, RuntimeError when it cannot start."""
    try:
        cfg = runtime_config(args)
    except ValueError as e:
        raise ConfigError(f"bad model options: {e}") from None
    notify(f"STATUS=loading model {cfg.model_name!r} from {cfg.model_dir}")
    began = time.monotonic()
    status, why = engine.call_with_reason("install_model", cfg)
    loaded = time.monotonic()
    if status != 0:
        error = ConfigError if AsStatus(status).name in CONFIG_STATUSES else RuntimeError
        raise error(f"cannot install model {cfg.model_name!r}: {why}")
    notify(f"STATUS=starting model {cfg.model_name!r} (weights, warm-up)")
    status, why = engine.call_with_reason("start_model", cfg.model_name)
    if status != 0:
        raise RuntimeError(f"cannot start model {cfg.model_name!r}: {why}")
    return cfg, {"load_s": loaded - began, "start_s": time.monotonic() - loaded}


def _log_startup(cfg, world, address, threads, timings) -> None:
    model = DashInferModel(cfg.model_dir, cfg.model_prefix) if cfg else None
    log_startup(startup_summary(cfg, model, world=world, address=address, threads=threads or None, **timings))


if __name__ == "__main__":
    sys.exit(main())
