"""A client that dies without closing: a ClientEngine process killed (SIGKILL) while its spawned
two-rank group runs a request leaves nothing behind, neither the group's socket nor its MPICH
segments in /dev/shm."""
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

import dashinfer_client as allspark
from helpers import build_tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Spawns a two-rank group, starts a long request and says where the group is.
CLIENT = """
import sys
import dashinfer_client as allspark
engine = allspark.ClientEngine(nodes=2, threads_per_rank=1, startup_timeout=90,
                               env={"DASHINFER_NUMA_NODES": "0:0;1:1"})
cfg = (allspark.AsModelRuntimeConfigBuilder().model_name("tiny").model_dir(sys.argv[1], "tiny")
       .max_length(4096).max_batch(4).build())
assert engine.install_model(cfg) == 0 and engine.start_model("tiny") == 0
gen = allspark.ASGenerationConfigBuilder().update({"top_k": 1, "max_length": 4095,
                                                   "early_stopping": False}).build()
status, _, queue = engine.start_request_ids("tiny", None, [5, 17, 101], gen)
assert status == 0 and queue.Get() is not None
print(engine.server.socket, engine.server.proc.pid, flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def serialized(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    hf = build_tiny_model(str(root / "hf"), max_position_embeddings=4096)
    loader = allspark.HuggingFaceModel(hf, "tiny", user_set_data_type="float32")
    loader.load_model().read_model_config().serialize_to_path(None, str(root / "ser")).free_model()
    return str(root / "ser")


def _tree(pid):
    """`pid` and its descendants (mpiexec, its proxy and the ranks: the proxy starts its own session)."""
    parents = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                parents[int(stat.split("/")[2])] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree = {pid} if pid in parents else set()
    while True:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        if not more:
            return tree
        tree |= more


def _mapped_segments(pids):
    segments = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                segments.update(line.split(None, 5)[5].strip() for line in f if "mpich_sh" in line)
        except (OSError, IndexError):
            continue
    return segments


def _eventually(predicate, timeout):
    """Whether `predicate` holds within `timeout` s (a bound for cleanup, not a speed check)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_killed_client_leaves_no_socket_and_no_shared_memory(serialized):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    client = subprocess.Popen([sys.executable, "-c", CLIENT, serialized], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, text=True)
    try:
        socket_path, leader = client.stdout.readline().split()
        group = _tree(int(leader))
        segments = _mapped_segments(group)
        assert os.path.exists(socket_path) and segments, "the group should be serving with two ranks"
        client.send_signal(signal.SIGKILL)
        client.wait()
        assert _eventually(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in group), 60), \
            "the group outlived its client"
        assert not os.path.exists(socket_path), "the killed client's group left its socket"
        assert _eventually(lambda: not any(os.path.exists(s) for s in segments), 30), \
            "the group left MPICH segments"
    finally:
        client.kill()
        client.wait()
