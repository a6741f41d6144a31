"""The serial part of a decode step: per step at batch 1 and 32, the milliseconds outside the
kernels and what takes them, and the OpenMP parallel regions per layer.

    PYTHONPATH=. python bench/step_overhead.py [--model PATH] [--threads N] [--rows 1,32] [--steps 50]
                                               [--sampling "temperature=0.7,top_p=0.8,top_k=20"]

The model loop is stepped in this thread (bench/decode_profile.py) with every kernel call and
loop stage timed: schedule (the scheduler's policy), plan (the step's int32 arrays), broadcast
(handing the plan to other ranks: nothing on one), forward glue (Python in the forward between
kernel calls), sample, postprocess (appending tokens, stop checks, the push into each request's
ResultQueue: the streaming), rest (the step's own Python). Detokenizing is not in the loop: the
pipeline and the HTTP server do it in their own threads, where it costs the loop only the GIL.

It runs itself again with bench/gomp_count.c preloaded (built here with gcc), which counts every
GOMP_parallel and GOMP_barrier: the regions of a step, of one decoder_run (divided by the layers:
per layer), and their mean fork-to-join time. `serial_share` is the outside part over the step;
`speedup_bound_at` says what Amdahl leaves of a step at 16 and 64 threads if the kernels scaled
perfectly from these threads and the outside part did not shrink.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIM_SOURCE = os.path.join(ROOT, "bench", "gomp_count.c")
SHIM_VERSIONS = "GOMP_1.0 { global: GOMP_barrier; }; GOMP_4.0 { global: GOMP_parallel; } GOMP_1.0;\n" \
                "DNCOUNT { global: gomp_count_read; };\n"


def build_shim(folder: str) -> str:
    """Compile bench/gomp_count.c into folder; its path."""
    script, out = os.path.join(folder, "gomp.map"), os.path.join(folder, "gomp_count.so")
    with open(script, "w") as f:
        f.write(SHIM_VERSIONS)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", SHIM_SOURCE, f"-Wl,--version-script={script}", "-o", out,
                    "-ldl"], check=True)
    return out


class RegionCounter:
    """The preloaded shim's counters: regions, barriers, ns inside regions, threads asked."""

    def __init__(self, path: str):
        self.read_fn = ctypes.CDLL(path).gomp_count_read
        self.buf = (ctypes.c_long * 4)()

    def read(self) -> tuple:
        self.read_fn(self.buf)
        return tuple(self.buf)

    def regions(self) -> int:
        return self.read()[0]


def summarize(p: dict, rows: int, threads: int) -> dict:
    """profile_decode's figures -> the outside-the-kernels account of one step."""
    detail = p["detail_ms"]
    loop = {name: detail.get("loop " + name, 0.0) for name in ("schedule", "plan", "broadcast", "sample", "postprocess",
                                                                  "advance")}
    # "advance" is the scheduler's bookkeeping inside postprocess: shown apart, not added twice
    loop["postprocess"] = round(loop["postprocess"] - loop["advance"], 3)
    outside = p["step_ms"] - p["kernels_ms"]
    parts = {**{k: round(v, 3) for k, v in loop.items()}, "forward_glue": p["forward_python_ms"],
             "rest": round(outside - sum(loop.values()) - p["forward_python_ms"], 3)}
    by_kernel = p["parallel_regions_by_kernel"] or {}
    layers = p["layers"]
    share = outside / p["step_ms"]
    return {
        "rows": rows, "threads": threads, "weights": p["weights"],
        "step_ms": p["step_ms"], "kernels_ms": p["kernels_ms"], "outside_kernels_ms": round(outside, 3),
        "outside_ms": parts, "serial_share": round(share, 3),
        "speedup_bound_at": {n: round(1 / (share + (1 - share) * threads / n), 1) for n in (16, 64)},
        "parallel_regions_per_step": p["parallel_regions_per_step"],
        "parallel_regions_per_layer": round(by_kernel.get("decoder_run", 0) / layers, 2) if by_kernel else None,
        "parallel_regions_by_kernel": by_kernel,
    }


def child(args):
    sys.path.insert(0, ROOT)
    from bench.decode_profile import profile_decode
    from bench.engine import parse_sampling
    counter = RegionCounter(os.environ["DN_GOMP_COUNT"]) if os.environ.get("DN_GOMP_COUNT") else None
    for rows in [int(r) for r in args.rows.split(",")]:
        before = counter.read() if counter else None
        p = profile_decode(args.model, args.dtype, args.quant, None, args.threads, False, "AsCacheDefault",
                           rows, args.prompt, args.steps, counter.regions if counter else None,
                           parse_sampling(args.sampling))
        out = summarize(p, rows, args.threads)
        if counter:  # fork to join, averaged over every region of the run (warm-up included)
            after = counter.read()
            out["mean_region_us"] = round((after[2] - before[2]) / max(1, after[0] - before[0]) / 1e3, 1)
        print(json.dumps(out), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--quant", default=None, choices=["int8", "uint4"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,32", help="requests decoded together, comma-separated")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens of each request")
    parser.add_argument("--steps", type=int, default=50, help="decode steps timed")
    parser.add_argument("--no-count", action="store_true", help="without the region-counting shim")
    parser.add_argument("--sampling", default="",
                        help='sampled requests, e.g. "temperature=0.7,top_p=0.8,top_k=20" (default: greedy)')
    args = parser.parse_args()
    if args.no_count or os.environ.get("DN_GOMP_COUNT"):
        return child(args)
    with tempfile.TemporaryDirectory() as folder:
        shim = build_shim(folder)
        env = dict(os.environ, DN_GOMP_COUNT=shim, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   LD_PRELOAD=" ".join(filter(None, [shim, os.environ.get("LD_PRELOAD")])))
        sys.exit(subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=env).returncode)


if __name__ == "__main__":
    main()
