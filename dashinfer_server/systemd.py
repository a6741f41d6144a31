"""systemd's readiness protocol (sd_notify): tell the service manager READY=1, STOPPING=1, STATUS=...

notify(state) sends one datagram to the socket named by $NOTIFY_SOCKET (a path, or an abstract
socket name starting with '@'); without that variable (not started by systemd as Type=notify)
it does nothing. It never raises: a service must not die because its manager cannot be told.
"""
import logging
import os
import socket

log = logging.getLogger("dashinfer_server.systemd")
# Exit status of a configuration error (sysexits' EX_CONFIG): a restart cannot fix it, and the
# units say RestartPreventExitStatus=78 so that systemd does not try every few seconds.
EX_CONFIG = 78


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1", "STOPPING=1", "STATUS=loading\\nMAINPID=123") to systemd.
    -> True when sent, False when there is no manager to tell or the send failed."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError as e:
        log.warning("sd_notify %r to %s failed: %s", state, os.environ.get("NOTIFY_SOCKET"), e)
        return False
