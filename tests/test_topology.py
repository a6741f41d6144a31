"""NUMA placement: sysfs-like trees in a temp dir, the DASHINFER_NUMA_NODES override, and every
placement that must be refused at start."""
import os
import subprocess
import sys

import pytest

from dashinfer_server import topology as T


def fake_sysfs(root, nodes, online="0-7", siblings=None):
    """nodes: {id: cpulist text}; siblings: {cpu: thread_siblings_list text}."""
    for n, cpus in nodes.items():
        os.makedirs(root / "node" / f"node{n}", exist_ok=True)
        (root / "node" / f"node{n}" / "cpulist").write_text(cpus + "\n")
    (root / "node" / "online").parent.mkdir(parents=True, exist_ok=True)
    (root / "cpu").mkdir(exist_ok=True)
    (root / "cpu" / "online").write_text(online + "\n")
    for c, sib in (siblings or {}).items():
        (root / "cpu" / f"cpu{c}" / "topology").mkdir(parents=True)
        (root / "cpu" / f"cpu{c}" / "topology" / "thread_siblings_list").write_text(sib + "\n")
    return str(root)


def test_parse_cpulist():
    assert T.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert T.parse_cpulist("5") == [5] and T.parse_cpulist("") == []
    for bad in ("3-1", "a", "1-", "0;1"):
        with pytest.raises(T.PlacementError, match="cpu list"):
            T.parse_cpulist(bad)


def test_two_socket_machine_from_sysfs(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-3", 1: "4-7", 2: ""},  # node 2: memory only (CXL)
                       siblings={c: f"{c},{c ^ 1}" for c in range(8)})
    nodes = T.numa_nodes({}, sysfs)
    assert nodes == [T.Node(0, (0, 1, 2, 3), True), T.Node(1, (4, 5, 6, 7), True)]
    p = T.plan_placement(1, 2, env={}, sysfs=sysfs)
    assert (p.node.id, p.threads, p.membind) == (1, 2, "bind")  # 2 cores of 2 SMT threads each
    assert "rank 1/2 on node 1: cpus 4-7, memory bind to node 1, 2 OpenMP" in p.describe()
    assert T.plan_placement(0, 2, threads=4, env={}, sysfs=sysfs).threads == 4


def test_offline_cpus_are_left_out_and_no_numa_means_one_node(tmp_path):
    sysfs = fake_sysfs(tmp_path / "a", {0: "0-3", 1: "4-7"}, online="0-5")
    assert [n.cpus for n in T.numa_nodes({}, sysfs)] == [(0, 1, 2, 3), (4, 5)]
    (tmp_path / "b" / "cpu").mkdir(parents=True)
    (tmp_path / "b" / "cpu" / "online").write_text("0-2")
    assert T.numa_nodes({}, str(tmp_path / "b")) == [T.Node(0, (0, 1, 2), True)]


def test_override_simulates_nodes_and_binds_memory_only_to_real_ones(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-1"}, online="0-1")
    env = {"DASHINFER_NUMA_NODES": "0:0;1:1"}
    assert T.numa_nodes(env, sysfs) == [T.Node(0, (0,), True), T.Node(1, (1,), False)]
    p0, p1 = (T.plan_placement(r, 2, env=env, sysfs=sysfs) for r in range(2))
    assert (p0.node.cpus, p1.node.cpus, p0.threads, p1.threads) == ((0,), (1,), 1, 1)
    assert "memory bind to node 0" in p0.describe()
    assert "memory not bound (node 1 is simulated)" in p1.describe()
    # the launcher names the node explicitly
    assert T.plan_placement(0, 1, env=dict(env, DASHINFER_NODE="1"), sysfs=sysfs).node.id == 1


@pytest.mark.parametrize("override,message", [
    ("0:0;1:", "node 1 has no cpus"),
    ("0:0;1:5", "cpu 5 of node 1 is not online"),
    ("0:0-1;1:1", "cpu 1 is in nodes 0 and 1"),
    ("0:0;0:1", "node 0 is given twice"),
    ("zero:0", "node:cpulist"),
    ("0:0-", "cpu list"),
    (";", "names no node"),
])
def test_bad_overrides_are_refused(tmp_path, override, message):
    sysfs = fake_sysfs(tmp_path, {0: "0-1"}, online="0-1")
    with pytest.raises(T.PlacementError, match=message):
        T.numa_nodes({"DASHINFER_NUMA_NODES": override}, sysfs)


def test_impossible_placements_are_refused(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-1"}, online="0-1")
    with pytest.raises(T.PlacementError, match="2 ranks but only 1 NUMA node"):
        T.plan_placement(1, 2, env={}, sysfs=sysfs)
    with pytest.raises(T.PlacementError, match="node 3 does not exist"):
        T.plan_placement(0, 1, env={"DASHINFER_NODE": "3"}, sysfs=sysfs)
    with pytest.raises(T.PlacementError, match="3 threads do not fit the 2 cpu"):
        T.plan_placement(0, 1, threads=3, env={}, sysfs=sysfs)
    with pytest.raises(T.PlacementError, match="DASHINFER_MEMBIND"):
        T.plan_placement(0, 1, env={"DASHINFER_MEMBIND": "strict"}, sysfs=sysfs)


def test_a_rank_binds_itself():
    """In a child process: cpu affinity, the memory policy (visible in numa_maps), the OpenMP
    environment, and the one-line log."""
    code = """
import logging, os, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
from dashinfer_server import topology as T
p = T.place_rank(1, 2)
print(sorted(os.sched_getaffinity(0)), os.environ["OMP_NUM_THREADS"])
data = bytearray(1 << 20)  # a fresh heap mapping: it carries the policy
print("bind:0" in open("/proc/self/numa_maps").read())
"""
    env = dict(os.environ, DASHINFER_NUMA_NODES="0:0;1:1")
    sim = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert sim.returncode == 0, sim.stderr
    assert sim.stdout.splitlines()[0] == "[1] 1"
    assert sim.stdout.splitlines()[1] == "False"  # node 1 is simulated: memory stays unbound
    assert "rank 1/2 on node 1: cpus 1, memory not bound" in sim.stderr
    real = subprocess.run([sys.executable, "-c", code.replace("place_rank(1, 2)", "place_rank(0, 2)")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert real.returncode == 0, real.stderr
    assert real.stdout.splitlines() == ["[0] 1", "True"]


def test_simulated_nodes_split_this_process_cpus_evenly():
    cpus = sorted(os.sched_getaffinity(0))
    for count in range(1, len(cpus) + 1):
        nodes = T.parse_override(T.simulated_nodes(count))
        assert sorted(nodes) == list(range(count))
        assert {len(c) for c in nodes.values()} == {len(cpus) // count}
        flat = [c for n in sorted(nodes) for c in nodes[n]]
        assert flat == cpus[:len(flat)] and len(set(flat)) == len(flat)
    with pytest.raises(T.PlacementError, match="need"):
        T.simulated_nodes(len(cpus) + 1)
