"""Microseconds per allreduce of float32 vectors between the ranks: MPI vs shared memory.

    PYTHONPATH=. python bench/allreduce.py [--ranks 2]

Started outside MPI, it runs itself under the mpiexec beside this Python with --ranks ranks
(without DASHINFER_NUMA_NODES, the cpus split into that many simulated nodes). Each rank pins
itself to its node's cpus, as a server rank does. Prints, on rank 0, the best of RUNS runs of
`reps` calls per size (the machine may be busy).
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from bench.timing import best_seconds  # noqa: E402
from dashinfer_server.group import init_group  # noqa: E402

SIZES = (576, 1536, 4096, 65536, 576 * 512, 1536 * 512)
RUNS = 10
# (name, hidden, layers): a step makes 2 allreduces of hidden x rows floats per layer
SHAPES = (("SmolLM2-135M", 576, 30), ("Qwen2-1.5B", 1536, 28))


def per_call_us(g, reduce, x, reps):
    """Best of RUNS runs of `reps` calls, the ranks lined up by a barrier before each run
    (no time budget: every rank must make the same number of collective calls)."""
    return best_seconds(lambda i: reduce(x), calls=RUNS, batch=reps, budget=float("inf"),
                        sync=g.comm.Barrier) * 1e6


def relaunch_under_mpi(ranks: int) -> int:
    from dashinfer_server.launch import mpiexec_path
    from dashinfer_client import settings
    from dashinfer_server.topology import simulated_nodes
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path[:1] + [os.environ.get("PYTHONPATH", "")]))
    if not settings.get("DASHINFER_NUMA_NODES", env):
        env["DASHINFER_NUMA_NODES"] = simulated_nodes(ranks)
    cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, os.path.abspath(__file__)]
    return subprocess.run(cmd, env=env).returncode


def main():
    if "PMI_RANK" not in os.environ:  # not started by mpiexec (MPICH's Hydra sets it)
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--ranks", type=int, default=2)
        sys.exit(relaunch_under_mpi(parser.parse_args().ranks))
    g = init_group()
    from mpi4py import MPI
    mpi = lambda x: g.comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)  # noqa: E731
    rows = []
    for n in SIZES:
        x = np.ones(n, np.float32)
        reps = max(10, min(5000, 4_000_000 // (n * 8)))
        shm = per_call_us(g, g.allreduce_, x, reps) if g.allreduce_kind == "shm" else float("nan")
        rows.append((n, per_call_us(g, mpi, x, reps), shm))
    if g.rank == 0:
        print(f"{g.world} ranks, allreduce float32, us per call (best of {RUNS} runs)")
        print(f"{'floats':>8} {'MPI':>9} {'shm':>9} {'speed-up':>8}")
        for n, m, s in rows:
            print(f"{n:>8} {m:9.2f} {s:9.2f} {m / s:7.1f}x")
        fastest = {n: min(m, s) if s == s else m for n, m, s in rows}
        for name, hidden, layers in SHAPES:
            decode, prefill = (2 * layers * fastest[hidden * r] / 1e3 for r in (1, 512))
            print(f"{name}: allreduce per step {decode:.2f} ms (decode, 1 row), {prefill:.1f} ms "
                  f"(prefill512); compare with the step times of bench/engine.py --ranks {g.world}")
    g.close()


if __name__ == "__main__":
    main()
