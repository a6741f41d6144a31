"""Issue 22's table on a server without internet access, into one results file (JSON + markdown).

    python3 bench/server_table.py --wheels DIR [--threads 1,2,4,8,16] [--out server_table.json]
    python3 bench/server_table.py --python .venv/bin/python --threads 1,2   # an environment with it installed

From this source tree and a folder of wheels (bench/gather_wheels.py fills one where there is
internet): a virtual environment that sees the system's packages (torch and transformers, where
the server has them) gets this package installed from the folder alone (pip --no-index
--find-links), its extension compiled one native/ file per core (setup.py); bench/make_model.py
writes the Qwen2-1.5B-shaped random model (--model-dir, once); then, each in its own processes:
    machine      bench/machine.py's limits on every core: bandwidth, fp32 / bf16 / AMX peaks
    ours         bench/engine.py prefill512, decode1, batch8, serve32 at each --threads (capped at
                 the cores present), on 2 ranks of half the cores each (--ranks 2), uint4 decode1
                 and batch8 and int8 prefill512 on every core
    transformers greedy generate on the same token counts, bf16, every core, and torch's bf16
                 matmul at 2048^3 (when torch and transformers are there)
Every figure lands in --out (JSON) and its table in the same path with .md. Runs take the cores:
run nothing beside it (on a shared host, under `flock /tmp/bench.lock`).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.gather_wheels import BENCH_PACKAGES  # noqa: E402

TABLE = ["prefill512", "decode1", "batch8", "serve32"]
FIGURE = {"prefill512": "prefill_tok_s", "decode1": "decode_tok_s", "batch8": "decode_tok_s",
          "serve32": "total_tok_s"}


def run(cmd, env=None, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, check=True, **kw)


def install(args) -> str:
    """The venv's python, this package installed into it from the wheels folder alone."""
    python = os.path.join(args.venv, "bin", "python")
    if not os.path.exists(python):
        run([sys.executable, "-m", "venv", "--system-site-packages", args.venv])
        see_parent_packages(python)
    env = dict(os.environ, DASHINFER_BUILD_JOBS=str(len(os.sched_getaffinity(0))))
    t = time.perf_counter()
    run([python, "-m", "pip", "install", "-q", "--no-index", "--find-links", args.wheels, "-e", ROOT,
         *BENCH_PACKAGES], env=env)
    print(f"installed in {time.perf_counter() - t:.0f} s", flush=True)
    return python


def see_parent_packages(python) -> None:
    """--system-site-packages shows the base interpreter's packages only: where this script runs
    in a virtual environment itself (a server's python with torch in /opt/.../.venv), a .pth file
    in the new one adds that environment's site-packages after its own."""
    if sys.prefix == sys.base_prefix:
        return
    import site
    target = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(target, "parent_environment.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")


def json_lines(cmd, env) -> list:
    """The JSON lines a bench command prints (its other output passes through)."""
    out = run(cmd, env, stdout=subprocess.PIPE, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    print("\n".join(out.splitlines()[-len(rows):]) if rows else out, flush=True)
    return rows


def machine(python, env, cores) -> dict:
    code = ("import json, os, platform; from bench.machine import limits; "
            f"d = limits({cores}); d.update(cpu=[l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') "
            "if l.startswith('model name')][0], cpus=os.cpu_count(), "
            "mem_gib=round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30, 1), "
            "numa_nodes=len([n for n in os.listdir('/sys/devices/system/node') if n.startswith('node')]), "
            "python=platform.python_version()); print(json.dumps(d))")
    return json_lines([python, "-c", code], env)[0]


def ours(python, env, model, threads, ranks=0, quant=None, workloads=TABLE) -> list:
    cmd = [python, os.path.join(ROOT, "bench", "engine.py"), "--model", model, "--threads", str(threads),
           "--workloads", ",".join(workloads)]
    cmd += ["--ranks", str(ranks)] if ranks else []
    cmd += ["--quant", quant] if quant else []
    return json_lines(cmd, env)


def transformers_rows(python, env, model, cores, workloads) -> list:
    """bench/hf_generate.py in a child, or the reason it cannot run (torch or transformers absent,
    a model that is not a Hugging Face directory)."""
    if not os.path.exists(os.path.join(model, "config.json")):
        return [{"absent": f"{model} is not a Hugging Face directory"}]
    probe = subprocess.run([python, "-c", "import torch, transformers"], env=env, capture_output=True, text=True)
    if probe.returncode:
        print("transformers + torch absent: no reference rows", flush=True)
        return [{"absent": probe.stderr.strip().splitlines()[-1]}]
    return json_lines([python, os.path.join(ROOT, "bench", "hf_generate.py"), model, "--threads", str(cores),
                       "--workloads", ",".join(workloads)], env)


def markdown(results) -> str:
    threads = results["threads"]
    ranks_label = f"2 ranks x {results['rank_threads']}"
    cols = [f"ours, {t} threads" for t in threads] + [ranks_label, "transformers", "ours / transformers"]
    lines = ["| workload | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    by = {(r["threads"], r.get("ranks"), r["workload"], r.get("weights")): r for r in results["ours"]}
    hf = {r["workload"]: r for r in results["transformers"] if "workload" in r}
    for name in results["workloads"]:
        cells = []
        for t in threads:
            r = by.get((t, "in-process", name, "bfloat16"))
            cells.append(cell(r, name))
        cells.append(cell(by.get((results["rank_threads"], 2, name, "bfloat16")), name))
        h = hf.get(name)
        cells.append(f"{h['tok_s']:.1f}" if h else "-")
        best = by.get((threads[-1], "in-process", name, "bfloat16"))
        cells.append(f"**{best[FIGURE[name]] / h['tok_s']:.2f}x**" if best and h and best[FIGURE[name]] else "-")
        lines.append(f"| {name} tok/s | " + " | ".join(cells) + " |")
    lines.append("\n(n): the figure over bench/engine.py's bound: prefill at the bf16 peak (quantized prefill "
                 "too), decode at the read bandwidth or that peak, whichever binds (decode_bound in the JSON)")
    for r in results["ours"]:
        if r.get("weights") != "bfloat16":
            lines.append(f"\n{r['weights']} {r['workload']} on {r['threads']} threads: "
                         f"{cell(r, r['workload'])} tok/s")
    m = results["machine"]
    amx, matmul = m["amx_bf16_gflops"], m["amx_matmul_gflops"]
    lines.append(f"\nmachine: {m['cpu']}, {m['cpus']} cpus, {m['numa_nodes']} NUMA node(s), {m['mem_gib']} GiB; "
                 f"read {m['bw_gbs']:.1f} GB/s; GFLOP/s fp32 {m['fp32_gflops']:.0f}, bf16 vector {m['bf16_gflops']:.0f}, "
                 f"AMX bf16 tiles {amx if isinstance(amx, str) else round(amx)}, AMX GEMM 2048^3 "
                 f"{matmul if isinstance(matmul, str) else round(matmul)}; bf16 GEMMs on {m['bf16_gemm_path']}")
    if results.get("torch_matmul_gflops"):
        lines.append(f"torch bf16 matmul 2048^3: {results['torch_matmul_gflops']:.0f} GFLOP/s")
    return "\n".join(lines) + "\n"


def cell(r, name) -> str:
    if not r or r.get(FIGURE[name]) is None:
        return "-"
    frac = r.get("prefill_fraction") if name == "prefill512" else r.get("decode_fraction") if name != "serve32" \
        else r.get("total_fraction")
    return f"{r[FIGURE[name]]:.1f}" + (f" ({frac:.2f})" if frac is not None else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--wheels", help="folder of wheels to install this package from (no index)")
    source.add_argument("--python", help="a python with this package installed already (no install step)")
    parser.add_argument("--venv", default=os.path.join(ROOT, ".venv-server"), help="with --wheels: where")
    parser.add_argument("--model-dir", default=os.path.join(ROOT, ".models", "qwen2-1.5b-random"),
                        help="where the 1.5B-shaped model is written (once)")
    parser.add_argument("--model", help="instead of that model, any bench/models.py spec (e.g. default: a "
                                        "quick run of the script itself)")
    parser.add_argument("--threads", default="1,2,4,8,16", help="thread counts, capped at the cores present")
    parser.add_argument("--workloads", default=",".join(TABLE))
    parser.add_argument("--out", default=os.path.join(ROOT, "server_table.json"))
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    threads = sorted({min(int(t), cores) for t in args.threads.split(",")})
    workloads = args.workloads.split(",")
    python = args.python or install(args)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    model = args.model or args.model_dir
    if not args.model and not os.path.exists(os.path.join(args.model_dir, "config.json")):
        run([python, "-m", "bench.make_model", "qwen2-1.5b", args.model_dir], env, cwd=ROOT)
    results = {"threads": threads, "workloads": workloads, "rank_threads": max(1, cores // 2),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    results["machine"] = machine(python, env, cores)
    results["ours"] = []
    for t in threads:
        results["ours"] += ours(python, env, model, t, workloads=workloads)
    if cores >= 2:
        results["ours"] += ours(python, env, model, results["rank_threads"], ranks=2, workloads=workloads)
    results["ours"] += ours(python, env, model, cores, quant="uint4",
                            workloads=[w for w in ("decode1", "batch8") if w in workloads])
    if "prefill512" in workloads:
        results["ours"] += ours(python, env, model, cores, quant="int8", workloads=["prefill512"])
    results["model"] = model
    results["transformers"] = transformers_rows(python, env, model, cores,
                                                [w for w in workloads if w != "serve32"])
    results["torch_matmul_gflops"] = next((r["gflops"] for r in results["transformers"] if "gflops" in r), None)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    table = markdown(results)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(table)
    print(table)
    print(f"results: {args.out} and {os.path.splitext(args.out)[0]}.md")


if __name__ == "__main__":
    main()
