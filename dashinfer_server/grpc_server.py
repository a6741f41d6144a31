"""The gRPC server of rank 0 around one Engine: listening (a unix socket private to this user by
default; TCP with a token, TLS optional), draining and closing; who may call is access.py's, the
limits limits.py's, the calls themselves service.py's.

serve(engine, address) -> Server (accepting); Server.shutdown(grace) drains: new work is refused
with ALLSPARK_REQUEST_DENIED, running requests get `grace` seconds to finish and are interrupted
after that, then the models are stopped and the service closes.
"""
import logging
import os
import socket
import stat
import threading
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dashinfer_client.api import ModelState
from dashinfer_client.proto.wire import (MESSAGE_SIZE_OPTIONS, default_address, is_local_address,
                                        keepalive_options, pb, pb_grpc, unix_socket_path)
from dashinfer_client.types import GenerateRequestStatus

from .access import Access, AccessGate
from .limits import DEFAULT_FINISHED_REQUEST_TTL, StreamLimits, WorkerPool
from .service import DashInferService

log = logging.getLogger("dashinfer_server.service")


def _claim_unix_socket(path: str) -> None:
    """Make `path` bindable: refuse if a live server listens there or if it is not a socket (a
    refused connect does not tell a stale socket from a regular file), remove a stale socket."""
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise RuntimeError(f"cannot use {path}: it exists and is not a socket; choose another --address")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # left by a server that died
        except OSError as e:
            raise RuntimeError(f"cannot use {path}: {e}") from e
        else:
            raise RuntimeError(f"{path} is in use by a running server; choose another --address")
        finally:
            probe.close()
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)


def remove_socket(path) -> None:
    """Remove the unix socket at `path` (None: a TCP address), if it is there still."""
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class Server:
    """The gRPC server of rank 0 around one Engine (see serve).

    access: who may call (access.Access; default: anyone who can connect, admin calls on a unix
    socket only); a non-local address without a token is refused (ValueError). tls: (certificate
    chain PEM, private key PEM) bytes, to serve TLS on a TCP address. limits: limits.StreamLimits.
    finished_request_ttl: seconds a request finished on its own stream (no session) is kept
    unreleased."""

    def __init__(self, engine, address=None, access=None, tls=None, limits=None,
                 finished_request_ttl=DEFAULT_FINISHED_REQUEST_TTL):
        self.engine = engine
        self.address = address or default_address()
        self.access = access or Access()
        self.access.check_listen(self.address, tls is not None)
        self.tls = tls
        limits = limits or StreamLimits()
        self.service = DashInferService(engine, limits, finished_request_ttl)
        self.socket_path = unix_socket_path(self.address)
        self.pool = WorkerPool(limits.threads_needed)
        self._server = grpc.server(self.pool, interceptors=[AccessGate(self.access, self.address)],
                                   options=[("grpc.so_reuseport", 0), *keepalive_options(server=True),
                                            *MESSAGE_SIZE_OPTIONS])
        pb_grpc.add_DashInferServicer_to_server(self.service, self._server)
        # grpc.health.v1 for probes and load balancers: SERVING once started, NOT_SERVING from the drain on
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self._stopped = threading.Event()

    def start(self) -> "Server":
        if self.socket_path:
            _claim_unix_socket(self.socket_path)
        # the socket file is made with its mode (this user and its group only), never open to all
        # for a moment: the umask is the process's, so it is set for the bind alone
        umask = os.umask(0o117) if self.socket_path else None
        try:
            if self.tls:
                chain, key = self.tls
                port = self._server.add_secure_port(self.address, grpc.ssl_server_credentials([(key, chain)]))
            else:
                port = self._server.add_insecure_port(self.address)
            self._server.start()
        except RuntimeError as e:
            raise RuntimeError(f"cannot listen on {self.address}: {e}") from e
        finally:
            if umask is not None:
                os.umask(umask)
        if not self.socket_path and self.address.rsplit(":", 1)[-1] == "0":
            self.address = f"{self.address.rsplit(':', 1)[0]}:{port}"  # the port the OS chose
        if not self.socket_path and not self.tls and self.access.token and not is_local_address(self.address):
            log.warning("serving %s without TLS: the token travels in clear (--tls-cert/--tls-key)", self.address)
        for name in (health.OVERALL_HEALTH, pb.DESCRIPTOR.services_by_name["DashInfer"].full_name):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def shutdown(self, grace: float = 30.0) -> None:
        """Drain (refuse new work, give running requests `grace` seconds, then interrupt them),
        stop the models and close. Every model stays installed (release is the caller's)."""
        why = "the server is shutting down: no new requests are accepted"
        self.service.begin_draining(why)
        self.health.enter_graceful_shutdown()  # every service NOT_SERVING from now on
        deadline = time.monotonic() + grace
        queues = self.service.unfinished()
        if queues:
            log.info("draining: waiting up to %.0f s for %d running request(s)", grace, len(queues))
        for q in queues:
            q.wait_finished(max(0.0, deadline - time.monotonic()))
        late = [q for q in queues if not q.finished]
        for q in late:
            q.set_status(GenerateRequestStatus.GenerateInterrupted,
                         f"the server shut down before the request finished (grace period {grace:g} s)")
        if late:
            log.warning("draining: interrupted %d request(s) still running after %.0f s", len(late), grace)
        self.stop_models()
        self.service.close_sessions()
        self._server.stop(grace=5.0).wait()
        self.pool.shutdown(wait=False)
        self._remove_socket()
        self._stopped.set()

    def stop_models(self) -> None:
        """Stop every running model (its unfinished requests are interrupted)."""
        for name, m in self.engine.get_stats()["models"].items():
            if m["state"] is ModelState.Running:
                self.engine.call_with_reason("stop_model", name)

    def stop(self) -> None:
        """Close at once (no drain): open streams are cancelled."""
        self.health.enter_graceful_shutdown()
        self.service.close_sessions()
        self._server.stop(grace=None).wait()
        self.pool.shutdown(wait=False)
        self._remove_socket()
        self._stopped.set()

    def wait(self, timeout=None) -> bool:
        return self._stopped.wait(timeout)

    def _remove_socket(self) -> None:
        remove_socket(self.socket_path)


def serve(engine, address=None, **options) -> Server:
    """Serve `engine` on `address` (default: a unix socket private to this process; a TCP address
    such as 127.0.0.1:PORT listens only where it names, never on every interface unless it says
    so) and return the started Server: it accepts calls when this returns. options: Server's."""
    return Server(engine, address, **options).start()
