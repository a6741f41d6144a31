"""Who may call the gRPC service of rank 0 (docs/security.md): the token every call must carry
when one is set, the admin calls (models: install, start, stop, release) and who may make them,
and the listening rules (a token whenever the address is not local; TLS over TCP only).

Access holds the policy; AccessGate applies it to every call before the service sees it. The
standard grpc.health.v1 service stays open to anyone (probes carry no token): it says SERVING or
NOT_SERVING and nothing else.
"""
import hmac
import logging
import os
import secrets
import stat

import grpc

from dashinfer_client import settings
from dashinfer_client.proto.wire import (SESSION_METADATA, TOKEN_METADATA, check_token, is_local_address,
                                        unix_socket_path)

log = logging.getLogger("dashinfer_server.service")

SERVICE = "/dashinfer.DashInfer/"
HEALTH = "/grpc.health.v1.Health/"
# Calls that change a model for every client: an admin's.
ADMIN_METHODS = frozenset(SERVICE + m for m in ("InstallModel", "StartModel", "StopModel", "ReleaseModel"))


def read_token(value=None, path=None, what="token") -> str:
    """The token given as a value or in a file (its first line); None when neither is given.
    Raises ValueError on an empty token or one that cannot travel as call metadata."""
    if path:
        try:
            with open(path) as f:
                value = f.readline().strip()
            mode = os.stat(path).st_mode
        except OSError as e:
            raise ValueError(f"cannot read the {what} file {path}: {e.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("the %s file %s is readable by others (mode %04o); chmod 600 it", what, path,
                        stat.S_IMODE(mode))
    return None if value is None else check_token(value, what)


class Access:
    """The policy. token: required on every call (the admin token is accepted in its place);
    admin_token: what an admin call must carry; without one, admin calls are allowed on a unix
    socket (its permissions already say who can connect) and refused over TCP."""

    def __init__(self, token=None, admin_token=None):
        self.token = token
        self.admin_token = admin_token

    def check_listen(self, address: str, tls: bool) -> None:
        """Raises ValueError when serving `address` this way would open the service to anyone."""
        if not is_local_address(address) and not self.token:
            raise ValueError(f"refusing to listen on {address} without a token: anyone who can reach it "
                             f"could use the service; set one (--token-file, DASHINFER_TOKEN or --token)")
        if tls and unix_socket_path(address) is not None:
            raise ValueError(f"TLS is for TCP addresses, not the unix socket {address}")

    def refusal(self, method: str, metadata: dict, unix: bool):
        """(grpc status code, message) refusing the call, or None when it may go on."""
        if method.startswith(HEALTH):
            return None
        given = metadata.get(TOKEN_METADATA, "")
        is_admin = _matches(given, self.admin_token)
        if self.token and not is_admin and not _matches(given, self.token):
            why = "a wrong token" if given else "no token"
            return (grpc.StatusCode.UNAUTHENTICATED,
                    f"this server requires a token and the call carries {why}: send '{TOKEN_METADATA}: "
                    f"Bearer <token>' (ClientEngine(token=...) or DASHINFER_TOKEN)")
        if method in ADMIN_METHODS and not is_admin and (self.admin_token or not unix):
            name = method[len(SERVICE):]
            return (grpc.StatusCode.PERMISSION_DENIED,
                    f"{name}: installing, starting, stopping and releasing models is an admin action: "
                    + ("the call must carry the admin token" if self.admin_token else
                       "over TCP it needs a server started with an admin token (--admin-token-file) and "
                       "a call that carries it"))
        return None


def _matches(given: str, token) -> bool:
    """Whether the metadata value `given` is 'Bearer <token>' (compared in constant time)."""
    if not token:
        return False
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def new_handle(taken) -> int:
    """A request handle for the wire: 63 random bits (a positive int64, the field's whole positive
    range), for which taken(handle) is false. Sequential handles would let anyone act on the
    requests of others."""
    while True:
        handle = secrets.randbits(63)
        if handle and not taken(handle):
            return handle


def caller_session(context):
    """The session a call says it acts for (its metadata), or None."""
    return dict(context.invocation_metadata() or ()).get(SESSION_METADATA)


class AccessGate(grpc.ServerInterceptor):
    """Refuses a call the Access policy refuses, with its status and message, before any of the
    service's code runs."""

    def __init__(self, access: Access, address: str):
        self.access = access
        self.unix = unix_socket_path(address) is not None

    def intercept_service(self, continuation, details):
        metadata = {k: v for k, v in details.invocation_metadata or () if isinstance(v, str)}
        refused = self.access.refusal(details.method, metadata, self.unix)
        handler = continuation(details)
        if refused is None or handler is None:
            return handler
        code, message = refused

        def deny(request, context):
            context.abort(code, message)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)


# ---- the command line ---------------------------------------------------------------------------

def add_arguments(p) -> None:
    """The flags of `python -m dashinfer_server` that say who may call it."""
    g = p.add_argument_group("access (docs/security.md)")
    g.add_argument("--token", help="require this token on every call (visible in ps: prefer "
                                   "--token-file or $DASHINFER_TOKEN)")
    g.add_argument("--token-file", help="read the token from this file's first line "
                                        "(default $DASHINFER_TOKEN_FILE)")
    g.add_argument("--admin-token", help="the token that allows installing, starting, stopping and releasing "
                                         "models (prefer --admin-token-file or $DASHINFER_ADMIN_TOKEN)")
    g.add_argument("--admin-token-file", help="read the admin token from this file (default "
                                              "$DASHINFER_ADMIN_TOKEN_FILE)")
    g.add_argument("--tls-cert", help="serve TLS on a TCP address with this certificate chain (PEM)")
    g.add_argument("--tls-key", help="the private key (PEM) of --tls-cert")


def from_arguments(args, env):
    """(Access, tls or None) of the parsed flags, environment defaults applied; ValueError when a
    token or a TLS file is bad or missing."""
    token = read_token(args.token or settings.get("DASHINFER_TOKEN", env),
                       args.token_file or settings.get("DASHINFER_TOKEN_FILE", env))
    admin = read_token(args.admin_token or settings.get("DASHINFER_ADMIN_TOKEN", env),
                       args.admin_token_file or settings.get("DASHINFER_ADMIN_TOKEN_FILE", env), "admin token")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert:
        try:
            with open(args.tls_cert, "rb") as cert, open(args.tls_key, "rb") as key:
                tls = (cert.read(), key.read())
        except OSError as e:
            raise ValueError(f"cannot read {e.filename}: {e.strerror}") from None
    return Access(token, admin), tls
