"""The same workload in N fresh processes: how much one start differs from the next.

    python bench/starts.py [--starts 10] [--workloads decode1,prefill512] [--threads 2]
        [--quant int8] [--env GOMP_SPINCOUNT=0 ...]

Each start is one `bench/engine.py --child WORKLOAD` process on the default model (its own
interpreter, kernels, weights and KV cache), one after another. Prints each start's figure
(decode1: decode tok/s, else prefill tok/s), then per workload min, median, max and max/min.
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
    for i in range(args.starts):
        for name in names:
            value = figure(start_once(name, args, env))
            figures[name].append(value)
            print(json.dumps({"start": i, "workload": name, "tok_s": value,
                              "load_avg_1min": round(os.getloadavg()[0], 2)}), flush=True)
    for name, values in figures.items():
        print(json.dumps({"workload": name, "starts": len(values), "min": min(values),
                          "median": statistics.median(values), "max": max(values),
                          "max_over_min": round(max(values) / min(values), 3), "env": args.env}))


if __name__ == "__main__":
    main()
