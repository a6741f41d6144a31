"""One server rank: `python -m dashinfer_server --address ADDR [options]`.

Rank 0 runs the Engine and serves gRPC on ADDR (default: a unix socket private to the process);
under mpiexec the other ranks run the worker loop. With --model-dir/--model-prefix/--model-name
the model is installed and started before the service accepts calls (the systemd use case).
The line "dashinfer_server: ready ..." is printed once the service accepts calls.
SIGTERM or SIGINT: stop admitting requests, let running ones finish for --grace-period seconds
(then interrupt them), stop the models, close, exit 0.
"""
import argparse
import logging
import os
import signal
import sys
import threading

from . import kernels as K
from .engine import Engine
from .group import init_group
from .service import release_models, serve
from .worker import run_worker

log = logging.getLogger("dashinfer_server")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m dashinfer_server", description=__doc__.split("\n")[0])
    p.add_argument("--address", default=None,
                   help="unix:///path.sock or HOST:PORT (default: a unix socket under $XDG_RUNTIME_DIR or /tmp)")
    p.add_argument("--threads", type=int, default=0, help="compute threads of this rank (default: all its cores)")
    p.add_argument("--model-dir", help="serialized model directory to install at start")
    p.add_argument("--model-prefix", help="file prefix of the serialized model ({dir}/{prefix}.asgraph)")
    p.add_argument("--model-name", help="name to install the model under")
    p.add_argument("--max-batch", type=int, default=None)
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--kv-cache-mode", default=None, help="AsCacheDefault, AsCacheQuantI8 or AsCacheQuantU4")
    p.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds running requests get to finish on SIGTERM before they are interrupted")
    p.add_argument("--exit-on-stdin-eof", action="store_true",
                   help="shut down when stdin closes (set by a ClientEngine that spawned this server)")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = p.parse_args(argv)
    model_flags = (args.model_dir, args.model_prefix, args.model_name)
    if any(model_flags) and not all(model_flags):
        p.error("--model-dir, --model-prefix and --model-name go together")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    return args


def runtime_config(args):
    from dashinfer_client.config import AsModelRuntimeConfigBuilder
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


def _watch_stdin(stop: threading.Event) -> None:
    """Wake `stop` when stdin reaches EOF: the spawning client is gone, even if it was killed."""
    def watch():
        try:
            while os.read(sys.stdin.fileno(), 4096):
                pass
        except OSError:
            pass
        log.info("stdin closed: the client that spawned this server is gone; shutting down")
        stop.set()
    threading.Thread(target=watch, name="dashinfer-stdin-watch", daemon=True).start()


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    group = init_group(args.threads or None)  # first: it places the rank, then loads the kernels
    if group.rank > 0:
        return run_worker(group) or 0

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    if args.exit_on_stdin_eof:
        _watch_stdin(stop)
    if args.threads:
        K.set_num_threads(args.threads)

    engine = Engine(group)
    try:
        if args.model_dir:
            try:
                cfg = runtime_config(args)
            except ValueError as e:
                log.error("bad model options: %s", e)
                return 2
            for call, arg in (("install_model", cfg), ("start_model", cfg.model_name)):
                status, why = engine.call_with_reason(call, arg)
                if status != 0:
                    log.error("cannot serve model %r: %s", cfg.model_name, why)
                    return 1
        if stop.is_set():
            return 0
        try:
            server = serve(engine, args.address)
        except RuntimeError as e:
            log.error("%s", e)
            return 1
        print(f"dashinfer_server: ready on {server.address} (pid {os.getpid()}, {group.world} rank(s))",
              flush=True)
        log.info("serving on %s", server.address)
        stop.wait()
        log.info("shutting down (grace period %.0f s)", args.grace_period)
        server.shutdown(args.grace_period)
        return 0
    finally:
        release_models(engine)
        group.close()  # the other ranks exit


if __name__ == "__main__":
    sys.exit(main())
