"""How many kernel threads this process runs now: as many as the cores other processes leave it.

A step is hundreds of parallel regions, each ending in a barrier. With more threads than free
cores, every time the OS preempts one of them the others wait at the next barrier for a whole
timeslice: beside one busy process on one of two cores, a 2-thread decode fell to a tenth of its
quiet speed, where one thread on the core left free keeps half (bench/engine.py --neighbour).
So every INTERVAL_S the busy time of this process's cpus (/proc/stat) minus this process's own
CPU time says what the others take, and the kernels run on the cores left: at least one, at most
the count configured (thread_num, or one per core of the rank's node).

The attention kernels cut their work by the thread count, so logits can differ in the last
bits from one count to another: DASHINFER_ADAPTIVE_THREADS=0 keeps the configured count (the
tests do, to compare runs bit for bit).
"""
import os
import time

from dashinfer_client import settings

from . import kernels as K

INTERVAL_S = 0.25   # long enough to average over the OS's timeslices (jiffies are 10 ms)
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (steal: another VM ran)


def busy_seconds(cpus, stat_path: str = "/proc/stat") -> float:
    """CPU seconds the cpus have spent busy since boot, whoever ran on them."""
    wanted = {f"cpu{c}" for c in cpus}
    ticks = 0
    with open(stat_path) as f:
        for line in f:
            name, _, rest = line.partition(" ")
            if name in wanted:
                fields = rest.split()
                ticks += sum(int(fields[i]) for i in BUSY_FIELDS if i < len(fields))
    return ticks / os.sysconf("SC_CLK_TCK")


def threads_for(others: float, cpus: int, configured: int) -> int:
    """Threads for `others` cores taken by other processes out of `cpus`: the free cores
    rounded to the nearest (a neighbour using a third of a core leaves room for all)."""
    return max(1, min(configured, int(cpus - others + 0.5)))


class CpuShare:
    """Call adapt() once per step: every INTERVAL_S it sets the kernels' thread count."""

    def __init__(self):
        self.enabled = settings.get("DASHINFER_ADAPTIVE_THREADS")
        self.cpus = sorted(os.sched_getaffinity(0))
        self.configured = K.num_threads()
        self.chosen = self.configured
        self.last = None  # (wall, busy, own) at the last look

    def adapt(self) -> None:
        now = time.perf_counter()
        if not self.enabled or self.last is not None and now - self.last[0] < INTERVAL_S:
            return
        current = K.num_threads()
        if current != self.chosen:  # someone else set the count (apply_thread_num): the new cap
            self.configured = self.chosen = current
        try:
            sample = (now, busy_seconds(self.cpus), time.process_time())
        except (OSError, ValueError):  # no /proc/stat as Linux writes it: keep the count
            self.enabled = False
            return
        if self.last is not None:
            wall, busy, own = (a - b for a, b in zip(sample, self.last))
            others = max(0.0, (busy - own) / wall)
            threads = threads_for(others, len(self.cpus), self.configured)
            if threads != self.chosen:
                K.set_num_threads(threads)
                self.chosen = threads
        self.last = sample
