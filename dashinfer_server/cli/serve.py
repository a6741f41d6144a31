"""`dashinfer serve MODEL`: the OpenAI-compatible HTTP API over one model.

The socket is listening (and /health answers 503) while the model loads; READY=1 goes to systemd
once the model serves. SIGTERM / Ctrl-C: STOPPING=1, new requests get 503, running ones get the
grace period to finish, then the model and its ranks are stopped. The socket keeps listening
through that drain, so a load balancer's health check reads the 503 instead of a refused
connection.
"""
import logging
import os
import signal
import socket
import sys
import threading
import time

from dashinfer_client import settings
from dashinfer_client.frontend.parsers import REASONING_PARSERS, TOOL_PARSERS
from dashinfer_server.arguments import at_least, port
from dashinfer_server.http.admission import MAX_WAITING, Admission

from .common import (CONFIG_ERROR, CliError, add_engine_options, add_model_options, check_ranks, first_paragraph,
                     resolve)

log = logging.getLogger("dashinfer_server.http")
KV_CACHE_MODES = {"default": "AsCacheDefault", "int8": "AsCacheQuantI8", "uint4": "AsCacheQuantU4"}


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                       description=first_paragraph(__doc__))
    p.add_argument("model", nargs="?", default=None,
                   help="a Hugging Face directory, a GGUF file, a serialized model directory, or the "
                        "default model's name (default: SmolLM2-135M-Instruct)")
    add_engine_options(p)
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--kv-cache", default="default", choices=tuple(KV_CACHE_MODES), help="KV cache storage")
    p.add_argument("--max-batch", type=int, default=32, help="requests running at once")
    p.add_argument("--api-key", default=settings.get("DASHINFER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default $DASHINFER_API_KEY)")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="requests queued beyond --max-batch before new ones are refused with 429 "
                        f"(default $DASHINFER_MAX_WAITING, else {MAX_WAITING})")
    p.add_argument("--request-timeout", type=float, default=None,
                   help="seconds a request may take when its body names no 'timeout'; it then ends with "
                        "finish_reason 'timeout' (default $DASHINFER_REQUEST_TIMEOUT, else 0: no deadline)")
    p.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS),
                   help="the tool-call format of the answers (default: the one the chat template speaks, "
                        "else 'json' with the tools described in the prompt)")
    p.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING_PARSERS) + ["none"],
                   help="split reasoning out of the answers (default: when the chat template uses <think>)")
    p.add_argument("--grace-period", type=at_least(0, float), default=30.0,
                   help="seconds running requests get to finish at shutdown")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    p.set_defaults(run=run)


def run(args) -> int:
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    from dashinfer_client.proto.wire import REQUEST_LOGGER
    from dashinfer_client.spawned import server_request_log
    if args.log_level != "DEBUG":  # ServedModel.finish logs each request once, with its HTTP id
        for name in (REQUEST_LOGGER, server_request_log.name):
            logging.getLogger(name).setLevel(logging.WARNING)
    check_ranks(args.tp, args.threads)
    admission = _admission(args)
    model_dir, prefix = resolve(args.model, args.dtype, args.quant)
    name = args.served_model_name or _default_name(args.model, prefix)
    from dashinfer_client.errors import ModelSerializerException
    from dashinfer_server.http.served import ServedModel
    try:
        served = ServedModel(model_dir, prefix, name, tp=args.tp, threads=args.threads,
                             max_batch=args.max_batch, max_length=args.max_model_len,
                             kv_cache_mode=KV_CACHE_MODES[args.kv_cache], tool_parser=args.tool_call_parser,
                             reasoning_parser=args.reasoning_parser)
    except (ValueError, ModelSerializerException) as e:  # a runtime option the config refuses, bad files
        raise CliError(str(e), CONFIG_ERROR) from None
    sock = _listen(args.host, args.port)
    import uvicorn

    from dashinfer_server.http.app import create_app
    app = create_app(served, api_key=args.api_key, admission=admission)
    config = uvicorn.Config(app, log_level=args.log_level.lower(), access_log=args.log_level == "DEBUG",
                            timeout_graceful_shutdown=args.grace_period, log_config=None)
    host, port = sock.getsockname()[:2]
    server = _server(config, served, admission, f"listening on http://{host}:{port} (model {name!r} loading)")
    loader = threading.Thread(target=_load, args=(served, server), name="dashinfer-load", daemon=True)
    loader.start()
    try:
        server.run(sockets=[sock])
    finally:
        loader.join()
        served.close()
    if server.load_error:
        raise CliError(f"cannot serve {name!r}: {server.load_error}", server.load_error_code)
    if server.interrupted:
        raise KeyboardInterrupt
    return 0


def _admission(args) -> Admission:
    """The admission gate of --max-waiting and --request-timeout (or their variables)."""
    try:
        max_waiting = args.max_waiting if args.max_waiting is not None else \
            settings.get("DASHINFER_MAX_WAITING")
        timeout = args.request_timeout if args.request_timeout is not None else \
            settings.get("DASHINFER_REQUEST_TIMEOUT")
        return Admission(args.max_batch, max_waiting, timeout)
    except ValueError as e:
        raise CliError(f"--max-waiting / --request-timeout: {e}", CONFIG_ERROR) from None


def _server(config, served, admission, listening: str):
    """uvicorn's server, whose shutdown signals drain the model first and tell systemd; it logs
    `listening` once it has them (a Ctrl-C before would interrupt its start with a traceback).

    A signal only starts the drain (served.drain: /health and new requests 503; STOPPING=1):
    uvicorn's own shutdown closes the listening socket first, so it starts once the requests the
    admission gate holds have ended, or at the end of the grace period; its wait for the open
    connections gets what is left of that period, then it cancels what still runs."""
    import uvicorn

    from dashinfer_server.systemd import notify
    grace = config.timeout_graceful_shutdown

    class Server(uvicorn.Server):
        load_error = ""
        load_error_code = 0
        interrupted = False
        drain_deadline = None  # monotonic time the grace period ends, once a signal came

        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            log.info("%s", listening)

        def handle_exit(self, sig, frame):  # uvicorn's, without raising the signal again at the end
            if self.drain_deadline is None and not self.should_exit:
                log.info("shutting down: draining (grace period %.0f s)", grace)
                served.drain()
                notify("STOPPING=1")
                self.interrupted = sig == signal.SIGINT
                self.drain_deadline = time.monotonic() + grace
            elif sig == signal.SIGINT:  # a second Ctrl-C: stop waiting
                self.should_exit = self.force_exit = True

        async def on_tick(self, counter) -> bool:  # every 0.1 s on the event loop
            if self.drain_deadline is not None and not self.should_exit:
                left = self.drain_deadline - time.monotonic()
                if admission.held == 0 or left <= 0:
                    self.config.timeout_graceful_shutdown = max(left, 0.0)
                    self.should_exit = True
            return await super().on_tick(counter)
    return Server(config)


def _load(served, server) -> None:
    from dashinfer_server.systemd import notify
    try:
        served.load()
    except Exception as e:  # the model cannot serve: say why and stop
        log.error("cannot serve model %r: %s", served.name, e)
        served.state, served.why = "failed", str(e)
        server.load_error = str(e).splitlines()[0]
        server.load_error_code = CONFIG_ERROR if isinstance(e, ValueError) else 1
        server.should_exit = True
        return
    if server.should_exit:
        return
    notify("READY=1")
    notify(f"STATUS=serving {served.name}")


def _listen(host, port) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {e.strerror}", CONFIG_ERROR) from None
    sock.set_inheritable(False)
    return sock


def _default_name(model, prefix) -> str:
    if model is None:
        return "default"
    return os.path.basename(os.path.normpath(model)) or prefix
