"""A ClientEngine configured as DashInfer's: AS_NUMA_NUM (ranks, one per NUMA node), AS_NUMA_OFFSET
(the first node they take) and AS_DAEMON_PATH (the directory of the mpirun that starts them), as
upstream's AsClientContext::LaunchService reads them; DASHINFER_NUMA_NODES (the simulation) wins
over the AS_NUMA_* pair."""
import os
import stat
import sys

import pytest

from dashinfer_client import spawned
from dashinfer_client.client_engine import ClientEngine, Unavailable
from dashinfer_server import launch as L

SIM = {"DASHINFER_NUMA_NODES": "0:0;1:1"}


def launch_flags(env):
    cmd = spawned.launch_command("unix:///tmp/x.sock", env=env)
    return cmd[cmd.index("--address") + 2:]


def test_as_numa_variables_become_launch_flags(tmp_path):
    assert launch_flags({}) == ["--exit-on-stdin-eof"]
    assert launch_flags({"AS_NUMA_NUM": "2", "AS_NUMA_OFFSET": "1"}) == [
        "--nodes", "2", "--first-node", "1", "--exit-on-stdin-eof"]
    # an explicit nodes= argument wins over AS_NUMA_NUM
    cmd = spawned.launch_command("unix:///tmp/x.sock", nodes=1, env={"AS_NUMA_NUM": "2"})
    assert cmd[cmd.index("--nodes") + 1] == "1"
    # the simulation places the ranks: AS_NUMA_* are ignored
    assert launch_flags(dict(SIM, AS_NUMA_NUM="1", AS_NUMA_OFFSET="1")) == ["--exit-on-stdin-eof"]
    # AS_DAEMON_PATH: its mpirun, or nothing when it has none (a DashInfer install's bin directory)
    assert launch_flags({"AS_DAEMON_PATH": str(tmp_path)}) == ["--exit-on-stdin-eof"]
    mpirun = tmp_path / "mpirun"
    mpirun.write_text("#!/bin/sh\n")
    mpirun.chmod(0o755)
    assert launch_flags({"AS_DAEMON_PATH": str(tmp_path)}) == ["--mpiexec", str(mpirun), "--exit-on-stdin-eof"]
    for bad in ({"AS_NUMA_NUM": "two"}, {"AS_NUMA_NUM": "0"}, {"AS_NUMA_OFFSET": "-1"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            spawned.launch_command("unix:///tmp/x.sock", env=bad)


def test_first_node_places_the_ranks_from_that_node_on():
    args, rest = L.parse_args(["--nodes", "1", "--first-node", "1", "--address", "unix:///tmp/x.sock"], SIM)
    cmd, extra = L.build_command(args, rest, env=SIM, numactl="")
    assert extra["DASHINFER_NODE"] == "1" and cmd[0] == sys.executable  # one rank, on node 1
    args, rest = L.parse_args(["--nodes", "2", "--first-node", "1"], SIM)
    with pytest.raises(L.topology.PlacementError, match="from node 1 on"):
        L.build_command(args, rest, env=SIM, numactl="")


def test_client_engine_spawns_as_the_variables_say(tmp_path, monkeypatch):
    monkeypatch.delenv("DASHINFER_NUMA_NODES", raising=False)
    nodes = len(L.topology.numa_nodes())
    with pytest.raises(Unavailable, match=f"this machine has {nodes} NUMA node"):
        ClientEngine(env={"AS_NUMA_NUM": str(nodes + 1)}, startup_timeout=60)
    # the simulation wins over AS_NUMA_NUM; AS_DAEMON_PATH's mpiexec starts the two ranks
    trace = tmp_path / "ran"
    wrapper = tmp_path / "mpiexec"
    real = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" > {trace}\nexec {real} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    client = ClientEngine(env=dict(SIM, AS_NUMA_NUM="1", AS_DAEMON_PATH=str(tmp_path)), startup_timeout=120)
    try:
        assert client.world_size == 2
        assert trace.read_text().count("dashinfer_server") == 2  # one rank per simulated node
    finally:
        client.close()
