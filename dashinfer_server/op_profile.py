"""Per-kernel timings of a model's forward: what get_op_profiling_info reports.

As in DashInfer, profiling is switched on by AS_PROFILE=ON in the environment of the process that
serves the model (a ClientEngine passes its environment to the group it spawns), read when the
model starts. The model then runs its layers op by op (every rank alike, so the collectives of
the ranks stay paired) and rank 0 times each kernel call through the model's `kernels` hook;
without it the forward runs fused and nothing is timed, and the report is empty (DashInfer returns
"" and logs the variable to set). A kernel's time includes the wait for its OpenMP threads; the
allreduces between ranks are not kernels of the hook and are not in the table.
"""
import os
import threading
import time

from dashinfer_client import settings

ENV = "AS_PROFILE"


def enabled(env=None) -> bool:
    env = os.environ if env is None else env
    return settings.get(ENV, env) == "ON"


class OpProfiler:
    """Stands in for the kernels module (DecoderModel.kernels): every kernel it hands out is timed.
    Written by the loop thread, read by API threads (the lock guards the table)."""

    def __init__(self, kernels):
        self._kernels = kernels
        self._lock = threading.Lock()
        self._stats = {}  # kernel name -> [calls, total s, min s, max s]

    def __getattr__(self, name):
        kernel = getattr(self._kernels, name)
        if not callable(kernel):
            return kernel
        stats, lock, clock = self._stats, self._lock, time.perf_counter

        def timed(*args, **kwargs):
            start = clock()
            try:
                return kernel(*args, **kwargs)
            finally:
                spent = clock() - start
                with lock:
                    s = stats.get(name)
                    if s is None:
                        stats[name] = [1, spent, spent, spent]
                    else:
                        s[0] += 1
                        s[1] += spent
                        s[2] = min(s[2], spent)
                        s[3] = max(s[3], spent)
        setattr(self, name, timed)  # found directly from now on: __getattr__ runs once per kernel
        return timed

    def reset(self) -> None:
        with self._lock:
            self._stats.clear()

    def snapshot(self) -> dict:
        """{kernel: (calls, total s, min s, max s)}."""
        with self._lock:
            return {name: tuple(s) for name, s in self._stats.items()}

    def report(self, rank: int = 0) -> str:
        """The table: one row per kernel, most time first (milliseconds; share of all kernel time)."""
        stats = self.snapshot()
        total = sum(s[1] for s in stats.values()) or 1.0
        rule = "-" * 95 + "\n"
        head = f"{'rank':<10}{'opname':<20}{'count':<10}{'min_ms':<10}{'max_ms':<10}{'ave_ms':<10}" \
               f"{'total_ms':<15}{'percentage':<10}\n"
        rows = []
        for name, (calls, spent, low, high) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
            rows.append(f"{rank:<10}{name:<20}{calls:<10}{low * 1e3:<10.3f}{high * 1e3:<10.3f}"
                        f"{spent / calls * 1e3:<10.3f}{spent * 1e3:<15.3f}{spent / total * 100:<10.2f}\n")
        return f"*** forward: kernel calls of rank {rank} ***\n" + rule + head + rule + "".join(rows) + rule
