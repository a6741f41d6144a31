"""This machine's limits, measured: streaming read bandwidth and FMA / bf16-dot peak."""
import statistics

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


if __name__ == "__main__":
    for key, value in limits().items():
        print(f"{key:>16}: {value:.1f}" if isinstance(value, float) else f"{key:>16}: {value}")
