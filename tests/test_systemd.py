"""sd_notify: the datagrams systemd would receive on $NOTIFY_SOCKET (path and abstract sockets);
`python -m dashinfer_server` (one rank, and two under the launcher) as a Type=notify service:
READY=1 only once it serves, STOPPING=1 on drain, exit 78 on a configuration error, and its
startup summary in the JSON log format, checked against the model's files and config."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

import dashinfer_client as allspark
from dashinfer_server import systemd
from tests.helpers import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
    caplog.set_level("WARNING", logger="dashinfer_server")  # a pipeline earlier may have set ERROR
    assert systemd.notify("READY=1") is False
    assert "sd_notify" in caplog.text


# ---- `python -m dashinfer_server` under a service manager ------------------------------------------

def _serve(loader, tmp_path, extra_env=None, launcher=False, *flags):
    """Start a server group on the tiny model (one rank, or the launcher's ranks) with
    NOTIFY_SOCKET pointing at a socket of this test -> (process, notify socket, address)."""
    cfg = loader.create_reference_runtime_config_builder("tiny", allspark.TargetDevice.CPU, [0], max_batch=2).build()
    notify_path = str(tmp_path / "notify.sock")
    listener = _listener(notify_path)
    listener.settimeout(120)
    address = f"unix://{tmp_path}/svc.sock"
    env = dict(os.environ, NOTIFY_SOCKET=notify_path, **(extra_env or {}),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    module = "dashinfer_server.launch" if launcher else "dashinfer_server"
    cmd = [sys.executable, "-m", module, "--address", address, "--model-dir", cfg.model_dir,
           "--model-prefix", cfg.model_prefix, "--model-name", "svc", "--max-length", "256",
           "--max-batch", "2", "--log-format", "json", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, listener, address, cfg


def _messages(listener, until):
    """Datagrams as {key: value} dicts, read until one has key `until`."""
    out = []
    while not out or until not in out[-1]:
        out.append(dict(line.split("=", 1) for line in listener.recv(4096).decode().splitlines()))
    return out


def _startup_records(stderr) -> dict:
    """topic -> [fields] of the JSON startup records (every line of stderr must be JSON)."""
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    by_topic = {}
    for r in records:
        assert {"time", "level", "logger", "pid", "message"} <= set(r), r
        if r.get("event") == "startup":
            by_topic.setdefault(r["topic"], []).append(r)
    return by_topic


@pytest.mark.parametrize("ranks", [1, 2])
def test_ready_only_once_serving_stopping_on_drain_and_the_startup_log(serialized_tiny, tmp_path, ranks):
    loader = serialized_tiny("llama")
    sim = {"DASHINFER_NUMA_NODES": "0:0;1:1"} if ranks == 2 else {}
    proc, listener, address, cfg = _serve(loader, tmp_path, sim, ranks == 2)
    try:
        before = _messages(listener, "READY")
        assert any("loading model 'svc'" in m.get("STATUS", "") for m in before)
        # READY=1 means it serves: the model answers right away
        with allspark.ClientEngine(address) as client:
            assert client.get_stats()["models"]["svc"]["state"] == "Running"
        assert proc.stdout.readline().startswith("dashinfer_server: ready on " + address)
        proc.send_signal(signal.SIGTERM)
        assert "draining" in _messages(listener, "STOPPING")[-1]["STATUS"]
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        proc.kill()
        proc.wait()
        listener.close()
    topics = _startup_records(err)
    (model,), (kv,), (limits,), (listen,) = (topics[t] for t in ("model", "kv_cache", "limits", "listen"))
    assert topics["kernels"][0]["isa"] in ("portable", "avx2", "avx512")
    assert [r["rank"] for r in topics["rank"]] == list(range(ranks)) and topics["rank"][0]["world"] == ranks
    if ranks == 2:  # one rank per simulated node, one cpu each
        assert [(r["node"], r["cpus"], r["threads"]) for r in topics["rank"]] == [(0, [0], 1), (1, [1], 1)]
    else:
        assert topics["rank"][0]["cpus"] == sorted(os.sched_getaffinity(0))
    param_file = os.path.join(cfg.model_dir, cfg.model_prefix + ".asparam")
    assert model["weights_bytes"] == os.path.getsize(param_file)
    assert (model["architecture"], model["dtype"], model["quantization"]) == ("llama", "float32", "none")
    assert model["layers"] == TINY["num_hidden_layers"] and model["vocab_size"] == TINY["vocab_size"]
    # AsCacheDefault without a memory budget: max_batch requests of max_length, in blocks of 32
    assert kv["kv_blocks"] == 2 * (256 // 32) and kv["kv_tokens"] == 2 * 256 and kv["kv_format"] == "fp32"
    layers, kv_heads, head_dim = TINY["num_hidden_layers"], TINY["num_key_value_heads"], \
        TINY["hidden_size"] // TINY["num_attention_heads"]
    assert kv["kv_bytes"] == 2 * layers * kv_heads * head_dim * 4 * kv["kv_tokens"]  # K and V, fp32
    assert (limits["max_batch"], limits["max_length"]) == (2, 256) and listen["address"] == address
    assert topics["timing"][0]["start_s"] > 0


def test_a_configuration_error_exits_78_without_ready(serialized_tiny, tmp_path):
    proc, listener, _, _ = _serve(serialized_tiny("llama"), tmp_path, None, False, "--max-length", "999999")
    try:
        _, err = proc.communicate(timeout=60)
        listener.settimeout(0.1)
        with pytest.raises(socket.timeout):
            while True:
                assert b"READY" not in listener.recv(4096)
    finally:
        listener.close()
    assert proc.returncode == systemd.EX_CONFIG and "exceeds the model's context" in err


@pytest.mark.parametrize("spawned", [False, True])
def test_a_server_a_client_spawned_tells_systemd_nothing(tmp_path, spawned):
    """--exit-on-stdin-eof marks a server a ClientEngine spawned: it may inherit NOTIFY_SOCKET from
    a service running that client, but it is not that service."""
    notify_path = str(tmp_path / "notify.sock")
    env = dict(os.environ, NOTIFY_SOCKET=notify_path, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with _listener(notify_path) as listener:
        proc = subprocess.Popen([sys.executable, "-m", "dashinfer_server", "--address", f"unix://{tmp_path}/s.sock"]
                                + (["--exit-on-stdin-eof"] if spawned else []),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout.readline().startswith("dashinfer_server: ready on")
            if spawned:
                proc.stdin.close()  # the client is gone: the server shuts down
            else:
                assert listener.recv(4096).startswith(b"READY=1")
                proc.send_signal(signal.SIGTERM)
                assert listener.recv(4096).startswith(b"STOPPING=1")
            assert proc.wait(60) == 0
            listener.settimeout(0.2)
            with pytest.raises(socket.timeout):
                listener.recv(4096)  # nothing (more) was sent
        finally:
            proc.kill()
            proc.wait()
