"""The one timing rule of the benchmarks: the fastest call wins.

The machine is shared: a call during which another process ran is slower, never faster, so the
minimum over many calls is the figure least disturbed by the neighbours.
"""
import time


def best_seconds(call, operands=1, calls=200, budget=3.0, batch=None, pause=0.0, sync=None) -> float:
    """Fastest seconds per call of call(i), i cycling over range(operands).

    One untimed cycle over the operands first, so every timed call's operand was last touched a
    whole cycle ago (cycle copies bigger than the cache to time calls that stream from DRAM).
    `batch` calls are timed together (None: as many as fill ~0.5 ms, for calls too short to
    time one by one); at most `calls` timed batches, and no more once `budget` seconds have
    passed and every operand was timed. `pause` sleeps first (another library's OpenMP threads
    may still spin on the cores); `sync()`, untimed, runs before every batch (an MPI barrier)."""
    time.sleep(pause)
    for i in range(operands):
        call(i)
    if batch is None:
        batch, t0 = 1, time.perf_counter()
        call(0)
        while time.perf_counter() - t0 < 5e-4 and batch < 1 << 20:
            batch *= 2
            t0 = time.perf_counter()
            for i in range(batch):
                call(i % operands)
    best, start, c = float("inf"), time.perf_counter(), 0
    for b in range(max(calls, 2 * operands)):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(batch):
            call(c % operands)
            c += 1
        t1 = time.perf_counter()
        best = min(best, (t1 - t0) / batch)
        if t1 - start > budget and c >= operands:
            break
    return best
