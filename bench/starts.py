"""The same workload in N fresh processes: how much one start differs from the next.

    python bench/starts.py [--starts 10] [--workloads decode1,prefill512] [--threads 2]
        [--quant int8] [--env GOMP_SPINCOUNT=0 ...]

Each start is one `bench/engine.py --child WORKLOAD` process on the default model (its own
interpreter, kernels, weights and KV cache), one after another. Prints each start's figure
(decode1: decode tok/s, else prefill tok/s) beside what the host did to it (bench/host.py), then
per workload min, median, max and max/min, the correlation of the figure with the share of cpu
time the start got, and max/min over the undisturbed starts only (a share >= 0.95): the spread
that is the engine's own rather than the neighbours'.
The starts of the workloads are interleaved (decode1, prefill512, decode1, ...) so that a
change of the host's load shows in both rather than in one. The host is shared: read the
spread next to the load average printed beside it.
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.path.join(ROOT, "bench", "engine.py")
UNDISTURBED = 0.95  # a start whose threads got >= 95% of the cpu time they wanted
sys.path.insert(0, ROOT)

from bench.engine import run_child  # noqa: E402


def figure(result: dict) -> float:
    return result["decode_tok_s"] if result["workload"] == "decode1" else result["prefill_tok_s"]


def start_once(workload: str, args, env) -> dict:
    cmd = [sys.executable, ENGINE, "--child", workload, "--threads", str(args.threads)]
    if args.quant:
        cmd += ["--quant", args.quant]
    return run_child(cmd, env, workload)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--workloads", default="decode1,prefill512")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quant", default=None, choices=["int8", "uint4"])
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE set in every start")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(item.split("=", 1) for item in args.env)
    names = args.workloads.split(",")
    figures = {n: [] for n in names}
    shares = {n: [] for n in names}
    for i in range(args.starts):
        for name in names:
            result = start_once(name, args, env)
            value, seen = figure(result), result["host"]
            figures[name].append(value)
            shares[name].append(seen["cpu_share"])
            print(json.dumps({"start": i, "workload": name, "tok_s": value, **seen,
                              "load_avg_1min": round(os.getloadavg()[0], 2)}), flush=True)
    for name, values in figures.items():
        quiet = [v for v, share in zip(values, shares[name]) if share >= UNDISTURBED]
        print(json.dumps({"workload": name, "starts": len(values), "min": min(values),
                          "median": statistics.median(values), "max": max(values),
                          "max_over_min": round(max(values) / min(values), 3),
                          "corr_with_cpu_share": correlation(values, shares[name]),
                          "undisturbed_starts": len(quiet),
                          "undisturbed_max_over_min": round(max(quiet) / min(quiet), 3) if quiet else None,
                          "env": args.env}))


def correlation(xs, ys):
    """Pearson's r, or None when either side does not vary."""
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return round(statistics.correlation(xs, ys), 2)


if __name__ == "__main__":
    main()
