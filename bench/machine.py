"""This machine's limits, measured: streaming read bandwidth, FMA / bf16-dot peak, AMX peak.

    python bench/machine.py [--threads N] the limits (best of many passes: the capacity), with N
                                          threads (default: every cpu of this process); the AMX
                                          bf16 tile peak and AMX GEMM rate where AMX tiles run
    python bench/machine.py --series 20   now() every 0.2 s for 20 s in one process
    python bench/machine.py --siblings    which cpus share cpu 0's core (hyperthreads a VM hides)
"""
import argparse
import json
import os
import statistics
import time

from bench.timing import best_seconds
from dashinfer_server import kernels as K

K.load()  # a bench runs where it was started: nothing to place first


def read_bandwidth(threads: int, mbytes: int = 512, passes: int = 20) -> float:
    """GB/s of `threads` threads streaming a buffer far larger than the last-level cache: the
    best of `passes` passes (native/probe.c)."""
    return (mbytes << 20) / K.probe_read(mbytes, threads, passes) / 1e9


def peak_gflops(bf16: bool, threads: int) -> float:
    """GFLOP/s of a register-resident FMA (fp32) or vdpbf16ps (bf16) loop; one vdpbf16ps on 16
    lanes counts 64 flops (two multiply-adds per lane). bf16 takes the better of 12 and 24
    independent accumulators (native/probe.c): what the core issues, whatever its latency. On a
    CPU without AVX-512 BF16 both are the AVX2 fp32 FMA loop: bf16 weights run as fp32 there."""
    kinds = (1, 2) if bf16 else (0,)
    return max(K.probe_peak(kind, 20_000_000, threads) for kind in kinds for _ in range(3)) / 1e9


def amx_peak_gflops(threads: int):
    """GFLOP/s of tdpbf16ps on AMX tiles (16 x 16 x 32 multiply-adds an instruction), or None
    where this process cannot use AMX (the CPU lacks it, or Linux refused the tile state)."""
    if not K.amx_available():
        return None
    return max(K.probe_amx_peak(2_000_000, threads) for _ in range(3)) / 1e9


def amx_matmul_gflops(threads: int, n: int = 2048):
    """GFLOP/s of this runtime's bf16 GEMM on AMX tiles at n x n x n (the best of 5), or None where
    the kernels do not use tiles. The tile peak above counts instructions that read nothing from
    memory (15.3-15.9 TFLOP/s on the 16-vCPU Xeon, where torch's own matmul reached 2.5-4.3): no
    GEMM streams its operands that fast, so a prefill's fraction is taken of this."""
    if K.amx() != "tiles":
        return None
    import numpy as np

    from dashinfer_client.dtypes import to_bf16
    rng = np.random.default_rng(0)
    weight = K.pack_linear(to_bf16(rng.standard_normal((n, n), dtype=np.float32)), "bf16")
    x = rng.standard_normal((n, n), dtype=np.float32)
    before = K.num_threads()
    K.set_num_threads(threads)
    try:
        best = best_seconds(lambda _: K.linear(x, weight), calls=5, batch=1)
    finally:
        K.set_num_threads(before)
    return 2.0 * n**3 / best / 1e9


def best_bf16_gflops(threads: int) -> float:
    """The bf16 peak of the path bf16 GEMMs take here: the AMX GEMM's own rate at 2048^3 when the
    kernels use tiles (K.amx() == "tiles"), else vdpbf16ps. Every fraction of peak the benches
    print uses it."""
    return amx_matmul_gflops(threads) or peak_gflops(True, threads)


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


def limits(threads: int = 0) -> dict:
    """The limits with `threads` threads (0: every cpu this process may use)."""
    threads = threads or len(os.sched_getaffinity(0))
    amx, vector, matmul = amx_peak_gflops(threads), peak_gflops(True, threads), amx_matmul_gflops(threads)
    return {
        "threads": threads,
        "bw_gbs": read_bandwidth(threads),
        "bw_gbs_1thread": read_bandwidth(1),
        "fp32_gflops": peak_gflops(False, threads),
        "bf16_gflops": vector,
        "amx_bf16_gflops": amx if amx is not None else "no AMX",
        "amx_matmul_gflops": matmul if matmul is not None else "no AMX tiles",
        # what bf16 GEMMs run on, and its peak: the denominator of every bf16 fraction
        "bf16_gemm_path": "amx tiles" if K.amx() == "tiles" else
                          "vdpbf16ps" if K.supported_isa() == "avx512" else "fp32 FMA (no AVX-512 BF16)",
        "best_bf16_gflops": matmul or vector,
    }


def _fma_worker(cpu: int, commands, results) -> None:
    """A child process pinned to `cpu`: for each iteration count it is sent, one FMA thread's
    GFLOP/s; None ends it."""
    os.sched_setaffinity(0, {cpu})
    K.load()
    K.probe_peak(0, 1_000_000, 1)
    for iters in iter(commands.get, None):
        results.put((cpu, K.probe_peak(0, iters, 1) / 1e9))


def core_siblings(first: int = 0, rounds: int = 3, iters: int = 50_000_000) -> dict:
    """Which cpus share a core with cpu `first`, measured, not read from the topology a VM shows
    (16 "cores" of one thread each can be 8 cores of two hyperthreads): cpu `first`'s FMA thread
    with another cpu's running beside it, over alone (the best of `rounds` each, interleaved).
    About 1 on another core, about 0.5 on a sibling."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")  # fresh processes: no OpenMP pool inherited
    cpus = sorted(os.sched_getaffinity(0))
    results = ctx.Queue()
    commands = {c: ctx.Queue() for c in cpus}
    workers = [ctx.Process(target=_fma_worker, args=(c, commands[c], results)) for c in cpus]
    for w in workers:
        w.start()

    def together(group):
        for c in group:
            commands[c].put(iters)
        got = dict(results.get() for _ in group)
        return got[first]

    try:
        alone = max(together([first]) for _ in range(rounds))
        ratios = {}
        for c in cpus:
            if c != first:
                best = max(together([first, c]) for _ in range(rounds))
                ratios[c] = round(best / max(alone, together([first])), 2)
    finally:
        for c in cpus:
            commands[c].put(None)
        for w in workers:
            w.join()
    siblings = [c for c, r in ratios.items() if r < 0.75]
    return {"cpu": first, "alone_gflops": round(alone, 1), "beside_over_alone": ratios, "siblings": siblings,
            "cores_if_uniform": len(cpus) // (1 + len(siblings))}


def series(threads: int, seconds: float) -> list:
    """now() with one sample, every 0.2 s for `seconds`, in this one process: whether the host's
    limits move while nothing in the process changes (no new pages, threads or placement)."""
    out, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        out.append({"t_s": round(time.perf_counter() - t0, 1), **now(threads, samples=1)})
        time.sleep(0.2)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="threads of the limits (0: every cpu)")
    parser.add_argument("--series", type=float, nargs="?", const=20.0, metavar="SECONDS",
                        help="instead: now() every 0.2 s for SECONDS (20), one JSON line each")
    parser.add_argument("--siblings", action="store_true", help="instead: which cpus share cpu 0's core")
    args = parser.parse_args()
    if args.series is not None:
        samples = series(2, args.series)
        for sample in samples:
            print(json.dumps(sample))
        for key in ("bw_gbs", "bf16_gflops"):
            values = sorted(s[key] for s in samples)
            print(json.dumps({key: {"min": values[0], "median": statistics.median(values), "max": values[-1],
                                    "max_over_min": round(values[-1] / values[0], 2)}}))
    elif args.siblings:
        print(json.dumps(core_siblings()))
    else:
        for key, value in limits(args.threads).items():
            print(f"{key:>17}: {value:.1f}" if isinstance(value, float) else f"{key:>17}: {value}")


if __name__ == "__main__":
    main()
