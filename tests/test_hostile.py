"""A client that dies without closing: a ClientEngine process killed (SIGKILL) while its spawned
two-rank group runs a request leaves nothing behind, neither the group's socket nor its MPICH
segments in /dev/shm."""
import os
import signal
import subprocess
import sys

import dashinfer_client as allspark
from dashinfer_client.proto.wire import encode_runtime_config
from dashinfer_server.launch import mapped_mpich_segments
from tests.engine_helpers import API_CONTEXT
from tests.group_helpers import process_tree
from tests.helpers import eventually

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Spawns a two-rank group, starts a long request and says where the group is.
CLIENT = """
import json
import sys
import dashinfer_client as allspark
engine = allspark.ClientEngine(nodes=2, threads_per_rank=1, startup_timeout=90,
                               env={"DASHINFER_NUMA_NODES": "0:0;1:1"})
cfg = allspark.AsModelRuntimeConfig.from_dict(json.loads(sys.argv[1]))
assert engine.install_model(cfg) == 0 and engine.start_model("tiny") == 0
gen = allspark.ASGenerationConfigBuilder().update({"top_k": 1, "max_length": 4095,
                                                   "early_stopping": False}).build()
status, _, queue = engine.start_request_ids("tiny", None, [5, 17, 101], gen)
assert status == 0 and queue.Get() is not None
print(engine.server.socket, engine.server.proc.pid, flush=True)
sys.stdin.read()
"""


def _mapped_segments(pids):
    return set().union(*(mapped_mpich_segments(f"/proc/{pid}/maps") for pid in pids))


def test_a_group_killed_outright_leaves_no_socket_and_no_shared_memory():
    """Every rank and mpiexec SIGKILLed at once (an OOM kill, a kill -9 of the tree): no rank gets
    to clean up, so the sweeper the group started with removes its socket and segments."""
    engine = allspark.ClientEngine(nodes=2, threads_per_rank=1, startup_timeout=90,
                                   env={"DASHINFER_NUMA_NODES": "0:0;1:1"})
    group = process_tree(engine.server.proc.pid)
    segments = _mapped_segments(group)
    assert os.path.exists(engine.server.socket) and segments, "the group should be serving with two ranks"
    sweepers = {pid for pid in group if b"sweep_after_exit" in open(f"/proc/{pid}/cmdline", "rb").read()}
    assert len(sweepers) == 1
    for pid in set(group) - sweepers:
        os.kill(pid, signal.SIGKILL)
    assert eventually(lambda: not os.path.exists(engine.server.socket), 30), "the killed group left its socket"
    assert eventually(lambda: not any(os.path.exists(s) for s in segments), 30), \
        f"the group left MPICH segments: {_who_maps([s for s in segments if os.path.exists(s)])}"
    assert eventually(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in sweepers), 30)


def _who_maps(paths) -> dict:
    """{path: [(pid, command line) of each process mapping it]}, to say why a segment stayed."""
    found = {p: [] for p in paths}
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        mapped = _mapped_segments([pid])
        for path in found:
            if path in mapped:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        found[path].append((pid, f.read().replace(b"\0", b" ")[:200].decode(errors="replace")))
                except OSError:
                    continue
    return found


def test_a_killed_client_leaves_no_socket_and_no_shared_memory(serialized_tiny):
    cfg = serialized_tiny("llama", max_position_embeddings=API_CONTEXT).create_reference_runtime_config_builder(
        "tiny", allspark.TargetDevice.CPU, [0], max_batch=2).max_length(4096).build()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    client = subprocess.Popen([sys.executable, "-c", CLIENT, encode_runtime_config(cfg)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, text=True)
    try:
        socket_path, leader = client.stdout.readline().split()
        group = process_tree(int(leader))
        segments = _mapped_segments(group)
        assert os.path.exists(socket_path) and segments, "the group should be serving with two ranks"
        client.send_signal(signal.SIGKILL)
        client.wait()
        assert eventually(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in group), 60), \
            "the group outlived its client"
        assert not os.path.exists(socket_path), "the killed client's group left its socket"
        assert eventually(lambda: not any(os.path.exists(s) for s in segments), 30), \
            f"the group left MPICH segments: {_who_maps([s for s in segments if os.path.exists(s)])}"
    finally:
        client.kill()
        client.wait()
