"""NUMA placement: which node each rank runs on, and binding the rank to it.

Nodes and their cpus come from sysfs (/sys/devices/system/node/node*/cpulist). The override
DASHINFER_NUMA_NODES="0:0-3;1:4-7" (node:cpulist;...) describes nodes to use instead, e.g. two
simulated nodes of one core each on a one-node machine; memory is bound only to nodes that
really exist. A rank binds its cpus (sched_setaffinity) and its memory (set_mempolicy), and sets
its OpenMP thread count (one per core of its node) before the kernels load (kernels.load).
Threads are not pinned to single cores inside the node: libgomp would pin the main thread
too, and every thread it starts after (the scheduler, gRPC) would then share one core with a
compute thread (1 rank x 2 threads: prefill512 1390 -> 780 tok/s, decode1 125 -> 88). Anything that cannot be placed as
asked is an error at start, never a silent fallback.
"""
import ctypes
import logging
import os
import re
from dataclasses import dataclass

from dashinfer_client import settings

from . import kernels

log = logging.getLogger("dashinfer_server")

SYSFS = "/sys/devices/system"
MEMBIND_MODES = {"bind": 2, "preferred": 1, "none": None}  # MPOL_BIND, MPOL_PREFERRED
SYS_SET_MEMPOLICY = 238  # x86_64


class PlacementError(RuntimeError):
    """A placement that this machine cannot give."""


@dataclass(frozen=True)
class Node:
    id: int
    cpus: tuple       # online cpus of the node, ascending
    real: bool        # the node exists in sysfs (memory can be bound to it)


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus = []
    for part in text.strip().split(","):
        if not part:
            continue
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise PlacementError(f"bad cpu list {text!r}: {part!r} is not N or N-M")
        lo = int(m.group(1))
        cpus.extend(range(lo, int(m.group(2) or lo) + 1))
    return sorted(set(cpus))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def online_cpus(sysfs: str = SYSFS) -> set:
    try:
        return set(parse_cpulist(_read(f"{sysfs}/cpu/online")))
    except OSError:
        return set(range(os.cpu_count() or 1))


def sysfs_nodes(sysfs: str = SYSFS) -> dict:
    """{node id: [cpus]} of the nodes in sysfs (memory-only nodes have no cpus); {} without
    NUMA support in the kernel."""
    try:
        entries = os.listdir(f"{sysfs}/node")
    except OSError:
        return {}
    nodes = {}
    for e in entries:
        m = re.fullmatch(r"node(\d+)", e)
        if m:
            nodes[int(m.group(1))] = parse_cpulist(_read(f"{sysfs}/node/{e}/cpulist"))
    return nodes


def _setting(name: str, env):
    """settings.get, a bad value refused as a PlacementError like the other placement mistakes."""
    try:
        return settings.get(name, env)
    except settings.SettingError as e:
        raise PlacementError(str(e)) from None


def parse_override(text: str) -> dict:
    """'0:0-3;1:4-7' -> {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}."""
    nodes = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        node, sep, cpus = item.partition(":")
        if not sep or not node.strip().isdigit():
            raise PlacementError(f"DASHINFER_NUMA_NODES: {item!r} is not node:cpulist "
                                 f"(e.g. \"0:0-3;1:4-7\")")
        if int(node) in nodes:
            raise PlacementError(f"DASHINFER_NUMA_NODES: node {int(node)} is given twice")
        nodes[int(node)] = parse_cpulist(cpus)
    if not nodes:
        raise PlacementError("DASHINFER_NUMA_NODES is set but names no node")
    return nodes


def numa_nodes(env=None, sysfs: str = SYSFS) -> list[Node]:
    """The nodes ranks run on, in id order: the override if set, else sysfs's nodes with cpus
    (one node of every online cpu when the kernel has no NUMA)."""
    env = os.environ if env is None else env
    real = sysfs_nodes(sysfs)
    online = online_cpus(sysfs)
    override = _setting("DASHINFER_NUMA_NODES", env)
    if override:
        wanted = parse_override(override)
        seen = {}
        for node, cpus in wanted.items():
            if not cpus:
                raise PlacementError(f"DASHINFER_NUMA_NODES: node {node} has no cpus")
            offline = sorted(set(cpus) - online)
            if offline:
                raise PlacementError(f"DASHINFER_NUMA_NODES: cpu {offline[0]} of node {node} is not "
                                     f"online (online: {_cpulist(sorted(online))})")
            for c in cpus:
                if c in seen:
                    raise PlacementError(f"DASHINFER_NUMA_NODES: cpu {c} is in nodes {seen[c]} and {node}")
                seen[c] = node
    else:
        wanted = {n: [c for c in cpus if c in online] for n, cpus in real.items()}
        wanted = {n: cpus for n, cpus in wanted.items() if cpus} or {0: sorted(online)}
        real = real or {0: sorted(online)}
    return [Node(n, tuple(cpus), n in real) for n, cpus in sorted(wanted.items())]


def physical_cores(cpus, sysfs: str = SYSFS) -> int:
    """Cores among cpus (SMT siblings count once); len(cpus) when sysfs does not say."""
    cores = set()
    for c in cpus:
        try:
            siblings = parse_cpulist(_read(f"{sysfs}/cpu/cpu{c}/topology/thread_siblings_list"))
        except (OSError, PlacementError):
            return len(cpus)
        cores.add(frozenset(siblings) & frozenset(cpus))
    return len(cores)


@dataclass(frozen=True)
class Placement:
    rank: int
    world: int
    node: Node
    threads: int
    membind: str      # bind | preferred | none

    def describe(self) -> str:
        memory = (f"memory {self.membind} to node {self.node.id}" if self.node.real and self.membind != "none"
                  else "memory not bound" + ("" if self.node.real else f" (node {self.node.id} is simulated)"))
        return (f"rank {self.rank}/{self.world} on node {self.node.id}: cpus {_cpulist(self.node.cpus)}, "
                f"{memory}, {self.threads} OpenMP thread(s)")


def plan_placement(rank: int, world: int, threads: int | None = None, env=None,
                   sysfs: str = SYSFS) -> Placement:
    """Where rank `rank` of `world` runs: node DASHINFER_NODE if set, else the rank-th node."""
    env = os.environ if env is None else env
    nodes = numa_nodes(env, sysfs)
    wanted = _setting("DASHINFER_NODE", env)
    if wanted is not None:
        by_id = {n.id: n for n in nodes}
        if wanted not in by_id:
            raise PlacementError(f"rank {rank}: node {wanted} does not exist (nodes: "
                                 f"{', '.join(str(n.id) for n in nodes)}; set DASHINFER_NUMA_NODES "
                                 f"to simulate nodes)")
        node = by_id[wanted]
    else:
        if world > len(nodes):
            raise PlacementError(f"{world} ranks but only {len(nodes)} NUMA node(s) "
                                 f"({', '.join(str(n.id) for n in nodes)}): one rank per node")
        node = nodes[rank]
    membind = _setting("DASHINFER_MEMBIND", env)
    threads = threads or _setting("DASHINFER_THREADS", env) or physical_cores(node.cpus, sysfs)
    if not 1 <= threads <= len(node.cpus):
        raise PlacementError(f"rank {rank}: {threads} threads do not fit the {len(node.cpus)} cpu(s) "
                             f"of node {node.id}")
    return Placement(rank, world, node, threads, membind)


def set_mempolicy(mode: int, node: int) -> None:
    """Bind this thread's future allocations (and its future threads') to `node`."""
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_SET_MEMPOLICY, mode, mask, ctypes.c_ulong(words * 64 + 1)) != 0:
        err = ctypes.get_errno()
        raise PlacementError(f"set_mempolicy(node {node}): {os.strerror(err)} (a container may "
                             f"forbid it: DASHINFER_MEMBIND=none skips memory binding)")


def apply(p: Placement, env=None) -> None:
    """Bind this process (call it from the main thread, before other threads start) and set
    its OpenMP placement in env (os.environ: read when the kernels load)."""
    env = os.environ if env is None else env
    try:
        os.sched_setaffinity(0, p.node.cpus)
    except OSError as e:
        raise PlacementError(f"rank {p.rank}: cannot run on cpus {_cpulist(p.node.cpus)}: {e}") from e
    if p.node.real and MEMBIND_MODES[p.membind] is not None:
        set_mempolicy(MEMBIND_MODES[p.membind], p.node.id)
    env["OMP_NUM_THREADS"] = str(p.threads)
    if kernels.loaded():
        log.warning("rank %d: the kernels were loaded before the placement: their OpenMP "
                    "threads keep the old settings", p.rank)


def place_rank(rank: int, world: int, threads: int | None = None) -> Placement:
    """Plan, apply and log this rank's placement."""
    p = plan_placement(rank, world, threads)
    apply(p)
    log.info("%s", p.describe())
    return p


def simulated_nodes(count: int) -> str:
    """A DASHINFER_NUMA_NODES value that splits this process's cpus evenly into `count` simulated
    nodes (for benchmarks and tests on a one-node machine)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < count:
        raise PlacementError(f"{count} simulated nodes need {count} cpus; this process has {len(cpus)}")
    per = len(cpus) // count
    return ";".join(f"{n}:{_cpulist(cpus[n * per:(n + 1) * per])}" for n in range(count))


def _cpulist(cpus) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)
