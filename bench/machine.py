"""This machine's limits, measured: streaming read bandwidth and FMA / bf16-dot peak.

    python bench/machine.py               the limits (best of many passes: the capacity)
    python bench/machine.py --series 20   now() every 0.2 s for 20 s in one process
"""
import json
import statistics
import sys
import time

from dashinfer_server import kernels as K

K.load()  # a bench runs where it was started: nothing to place first


def read_bandwidth(threads: int, mbytes: int = 512, passes: int = 20) -> float:
    """GB/s of `threads` threads streaming a buffer far larger than the last-level cache: the
    best of `passes` passes (native/probe.c)."""
    return (mbytes << 20) / K.probe_read(mbytes, threads, passes) / 1e9


def peak_gflops(bf16: bool, threads: int) -> float:
    """GFLOP/s of a register-resident FMA (fp32) or vdpbf16ps (bf16) loop; one
    vdpbf16ps on 16 lanes counts 64 flops (two multiply-adds per lane)."""
    return max(K.probe_peak(bf16, 20_000_000, threads) for _ in range(3)) / 1e9


def now(threads: int, samples: int = 7) -> dict:
    """What the host gives this process at this moment: the medians of `samples` short probes
    (a 256 MiB read, best of 2 passes; ~10 ms of vdpbf16ps), taken in turn. Unlike the best of
    many passes above (the machine's capacity), a median says how much of it the run beside it
    could have had: on a shared VM both swing between samples 0.2 s apart (bw 22-42 GB/s, bf16
    200-460 GFLOP/s with 2 threads, neither seen as steal time by the guest)."""
    bw, peak = [], []
    for _ in range(samples):
        bw.append((256 << 20) / K.probe_read(256, threads, 2) / 1e9)
        peak.append(K.probe_peak(True, 1_000_000, threads) / 1e9)
    return {"bw_gbs": round(statistics.median(bw), 1), "bf16_gflops": round(statistics.median(peak))}


def limits(threads: int = 2) -> dict:
    return {
        "threads": threads,
        "bw_gbs": read_bandwidth(threads),
        "bw_gbs_1thread": read_bandwidth(1),
        "fp32_gflops": peak_gflops(False, threads),
        "bf16_gflops": peak_gflops(True, threads),
    }


def series(threads: int, seconds: float) -> list:
    """now() with one sample, every 0.2 s for `seconds`, in this one process: whether the host's
    limits move while nothing in the process changes (no new pages, threads or placement)."""
    out, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        out.append({"t_s": round(time.perf_counter() - t0, 1), **now(threads, samples=1)})
        time.sleep(0.2)
    return out


if __name__ == "__main__":
    if "--series" in sys.argv:  # python bench/machine.py --series [SECONDS]: one JSON line per sample
        args = sys.argv[sys.argv.index("--series") + 1:]
        samples = series(2, float(args[0]) if args else 20)
        for sample in samples:
            print(json.dumps(sample))
        for key in ("bw_gbs", "bf16_gflops"):
            values = sorted(s[key] for s in samples)
            print(json.dumps({key: {"min": values[0], "median": statistics.median(values), "max": values[-1],
                                    "max_over_min": round(values[-1] / values[0], 2)}}))
        sys.exit()
    for key, value in limits().items():
        print(f"{key:>16}: {value:.1f}" if isinstance(value, float) else f"{key:>16}: {value}")
