"""sd_notify: the datagrams systemd would receive on $NOTIFY_SOCKET (path and abstract sockets)."""
import os
import socket

from dashinfer_server import systemd

def _listener(address):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock

def test_notify_sends_each_state_as_one_datagram(tmp_path, monkeypatch):
    path = str(tmp_path / "notify.sock")
    with _listener(path) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert systemd.notify("READY=1")
        assert systemd.notify("STATUS=draining\nSTOPPING=1")
        assert sock.recv(4096) == b"READY=1"
        assert sock.recv(4096) == b"STATUS=draining\nSTOPPING=1"

def test_notify_reaches_an_abstract_socket(monkeypatch):
    name = f"dashinfer-test-{os.getpid()}"
    with _listener("\0" + name) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify("STOPPING=1")
        assert sock.recv(4096) == b"STOPPING=1"

def test_notify_without_a_manager_does_nothing(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify("READY=1") is False

def test_notify_to_a_missing_socket_warns_and_does_not_raise(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "absent.sock"))
    assert systemd.notify("READY=1") is False
    assert "sd_notify" in caplog.text
