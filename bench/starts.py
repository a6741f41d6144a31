"""The same workload in N fresh processes: how much one start differs from the next, and why.

    python bench/starts.py [--starts 10] [--workloads decode1,prefill512,probe] [--threads 2]
        [--model PATH] [--quant int8] [--env GOMP_SPINCOUNT=0 ...]

Each start is one fresh process (its own interpreter, kernels, weights and KV cache) that
serves the workload with bench/engine.py's code; just before and just after it, this process
asks the host what it gives now (bench/machine.py now(): the median of short bandwidth and
bf16-peak probes). `probe` is a start that serves nothing: the host's own spread over the same
minutes, and the huge-page share of a fresh process's probe buffer. The starts of the workloads are interleaved (decode1, prefill512, probe, decode1, ...)
so that a change of the host's load shows in all of them rather than in one.

One line per start: its figure (decode1: decode tok/s, else prefill tok/s), the probes, and what
the host did to it (bench/host.py: cpu share, migrations, cpus of the busiest threads, huge
pages). Then per workload: min, median, max and max/min of the figure; the same of the figure
over the limit that bounds it, measured beside it (decode1: tok/s per GB/s of read bandwidth,
prefill: per GFLOP/s of bf16 peak): the spread that is the engine's own rather than the host's;
and the correlation of the figure with each measured cause.
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BANDWIDTH_BOUND = ("decode1", "batch8")  # the workloads a decode step's weight reads bound
CAUSES = ("bw_gbs", "bf16_gflops", "cpu_share", "migrations", "huge_share")
sys.path.insert(0, ROOT)


def child(args) -> dict:
    """In the fresh process: serve the workload (a probe start only looks at its memory)."""
    from bench import host
    if args.child == "probe":
        from bench import machine
        machine.now(args.threads)
        return {"workload": "probe", "tok_s": None, "host": {"huge_share": host.huge_share()}}
    from bench.engine import run_workload
    result = run_workload(args.child, args.model, "bfloat16", args.quant, group_size=None, threads=args.threads,
                          max_prefill=0, ranks=0, kv_mode="AsCacheDefault")
    return {"workload": args.child, "host": result["host"],
            "tok_s": result["decode_tok_s" if args.child in BANDWIDTH_BOUND else "prefill_tok_s"]}


def start_once(workload: str, args, env) -> dict:
    """One fresh process, with the host probed from this one just before and just after it (a
    probe inside the start would leave a second OpenMP team there, and libgomp stops spinning
    when its threads outnumber the cpus: decode1 fell from ~150 to 59 tok/s)."""
    from bench import machine
    from bench.engine import run_child
    before = machine.now(args.threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, "--threads", str(args.threads),
           "--model", args.model]
    cmd += ["--quant", args.quant] if args.quant else []
    row = run_child(cmd, env, workload)
    after = machine.now(args.threads)
    row.update({k: round((before[k] + after[k]) / 2, 1) for k in before}, probe_before=before, probe_after=after)
    return row


def normalised(row: dict):
    """The figure over the limit that bounds its workload, both from the same start."""
    if row["tok_s"] is None:
        return None
    if row["workload"] in BANDWIDTH_BOUND:
        return row["tok_s"] / row["bw_gbs"]
    return row["tok_s"] / row["bf16_gflops"]


def spread(values) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {}
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3), "max_over_min": round(max(values) / min(values), 3)}


def correlation(xs, ys):
    """Pearson's r, or None when either side does not vary."""
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(pairs) < 3 or len({x for x, _ in pairs}) < 2 or len({y for _, y in pairs}) < 2:
        return None
    return round(statistics.correlation([x for x, _ in pairs], [y for _, y in pairs]), 2)


def summary(name: str, rows: list, args) -> dict:
    causes = {k: [r[k] if k in r else r["host"].get(k) for r in rows] for k in CAUSES}
    out = {"workload": name, "starts": len(rows), "model": args.model, "env": args.env,
           "probe_bw_gbs": spread(causes["bw_gbs"]), "probe_bf16_gflops": spread(causes["bf16_gflops"])}
    if name != "probe":
        figures = [r["tok_s"] for r in rows]
        out.update(tok_s=spread(figures),
                   per_limit=spread([normalised(r) for r in rows]),
                   limit="bw_gbs" if name in BANDWIDTH_BOUND else "bf16_gflops",
                   corr_with={k: correlation(figures, v) for k, v in causes.items()})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--workloads", default="decode1,prefill512,probe")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="default")
    parser.add_argument("--quant", default=None, choices=["int8", "uint4"])
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE set in every start")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(item.split("=", 1) for item in args.env)
    names = args.workloads.split(",")
    if args.model != "default" or args.quant:
        from bench import models
        models.load(args.model, "bfloat16", args.quant, None)  # converted once, before the starts
    rows = {n: [] for n in names}
    for i in range(args.starts):
        for name in names:
            row = start_once(name, args, env)
            rows[name].append(row)
            per_limit = normalised(row)
            print(json.dumps({"start": i, "workload": name, "tok_s": row["tok_s"], "bw_gbs": row["bw_gbs"],
                              "bf16_gflops": row["bf16_gflops"],
                              "per_limit": round(per_limit, 3) if per_limit else None, **row["host"],
                              "load_avg_1min": round(os.getloadavg()[0], 2)}), flush=True)
    for name in names:
        print(json.dumps(summary(name, rows[name], args)), flush=True)


if __name__ == "__main__":
    main()
