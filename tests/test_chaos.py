"""Chaos: a random rank of a two-rank group (simulated NUMA nodes, one cpu each) is killed with
SIGKILL while it generates 16 requests of two clients (one ClientEngine spawned the group, the
other connected by its address). Every request must end, Interrupted or Finished, within
END_S of the kill; the group must be back, serving a new request correctly for both clients,
within BACK_S; and nothing the group's processes made may be left in /tmp or /dev/shm.

Other tests and helpers make files in /tmp and /dev/shm meanwhile, so "ours" is what this
test's processes were seen holding (mapped or open, sampled at every stage), its sockets, and
what appeared in the listings under a name that carries one of our pids.
"""
import os
import random
import signal
import time

import pytest

import dashinfer_client as allspark
from dashinfer_client import AsStatus, GenerateRequestStatus as S
from tests.engine_helpers import collect, greedy
from tests.group_helpers import SHARED_DIRS, held_files, process_tree, rank_pids
from tests.helpers import eventually

END_S, BACK_S = 5.0, 30.0
PER_CLIENT = 8  # 16 requests in all
PROMPT = [5, 17, 101, 33, 7, 250, 64, 12]
OK = AsStatus.ALLSPARK_SUCCESS


def _listing() -> set:
    return {os.path.join(d, name) for d in SHARED_DIRS for name in os.listdir(d)}


def _entry(path) -> str:
    """The entry of /tmp or /dev/shm that `path` is, or is under."""
    for d in SHARED_DIRS:
        if path.startswith(d + "/"):
            return os.path.join(d, path[len(d) + 1:].split("/")[0])
    return path


class _Ours:
    """What this test's processes made: the entries of /tmp and /dev/shm they were seen holding
    that were not there before, their sockets, and new entries named after one of their pids."""

    def __init__(self, before):
        self.before, self.paths, self.pids = before, set(), {os.getpid()}

    def sample(self, engine):
        if engine.server is not None:
            group = process_tree(engine.server.proc.pid)
            self.pids |= group
            self.paths |= {_entry(p) for p in held_files(group)} - self.before
            self.paths.add(engine.server.socket)

    def left(self) -> set:
        named = {p for p in _listing() - self.before
                 if any(str(pid) in os.path.basename(p) for pid in self.pids)}
        return {p for p in self.paths | named if os.path.exists(p)}


def _runtime(tiny_model):
    return (allspark.AsModelRuntimeConfigBuilder().model_name("tiny").model_dir(tiny_model, "tiny")
            .max_length(4096).max_batch(2 * PER_CLIENT).build())


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The greedy ids of PROMPT in this process (Engine, one rank)."""
    from dashinfer_server.engine import Engine
    engine = Engine()
    assert engine.install_model(_runtime(tiny_model)) == OK and engine.start_model("tiny") == OK
    _, _, queue = engine.start_request_ids("tiny", None, PROMPT, greedy(len(PROMPT) + 24))
    yield collect(queue)[0]
    engine.close()


def _serves_correctly(engine, expected) -> bool:
    status, handle, queue = engine.start_request_ids("tiny", None, PROMPT, greedy(len(PROMPT) + 24))
    if status != OK:
        return False
    ids = collect(queue, BACK_S)[0]
    assert queue.GenerateStatus() == S.GenerateFinished and ids == expected, (queue.error, ids)
    assert engine.release_request("tiny", handle) == OK
    return True


def test_a_rank_killed_under_16_requests_of_2_clients(tiny_model, reference):
    ours = _Ours(_listing())
    spawner = allspark.ClientEngine(nodes=2, threads_per_rank=1, startup_timeout=120,
                                    env={"DASHINFER_NUMA_NODES": "0:0;1:1"})
    other = allspark.ClientEngine(spawner.address, reconnect_timeout=2.0)
    try:
        assert spawner.install_model(_runtime(tiny_model)) == OK, spawner.last_error
        assert spawner.start_model("tiny") == OK
        assert _serves_correctly(spawner, reference) and _serves_correctly(other, reference)
        queues = []
        for i in range(PER_CLIENT):
            for engine in (spawner, other):
                status, _, queue = engine.start_request_ids("tiny", None, PROMPT + [i], greedy(4000))
                assert status == OK, engine.last_error
                queues.append(queue)
        assert all(q.Get() is not None for q in queues), "every request should be generating"
        ours.sample(spawner)
        victim = random.choice([0, 1])
        ranks = rank_pids(spawner.server.proc.pid)
        assert sorted(ranks) == [0, 1], ranks

        os.kill(ranks[victim], signal.SIGKILL)
        killed = time.monotonic()
        for queue in queues:
            assert queue.wait_finished(max(0.0, killed + END_S - time.monotonic())), \
                f"killing rank {victim}: a request had not ended {END_S} s later"
            assert queue.GenerateStatus() in (S.GenerateInterrupted, S.GenerateFinished)
        assert any(q.GenerateStatus() == S.GenerateInterrupted and q.error for q in queues)

        # The spawning client's next call starts a new group and installs the model again; the
        # other client finds it at the same address.
        assert eventually(lambda: _serves_correctly(spawner, reference),
                          killed + BACK_S - time.monotonic(), poll_s=0.2), \
            f"killing rank {victim}: the group was not back {BACK_S} s later ({spawner.last_error})"
        assert eventually(lambda: _serves_correctly(other, reference),
                          max(1.0, killed + BACK_S - time.monotonic()), poll_s=0.2), other.last_error
        ours.sample(spawner)
    finally:
        other.close()
        spawner.close()

    assert ours.paths, "the groups' files should have been seen"
    assert eventually(lambda: not ours.left(), 30), f"the groups left {sorted(ours.left())}"
