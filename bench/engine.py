"""End-to-end engine workloads on a model: one JSON line per workload, each against its bound.

    python bench/engine.py [--model PATH] [--quant int8 [--group-size -1]] [--workloads prefill512,decode1]
    python bench/engine.py --ranks 2 --threads 1    # through ClientEngine, 2 tensor-parallel ranks

Workloads (token-level random prompts, greedy unless --sampling "temperature=0.6,top_p=0.9" gives
options that sample, eos ignored, every request submitted at once):
    prefill512  1 request: 512 prompt tokens, 1 new
    decode1     1 request: 32 prompt tokens, 128 new
    batch8      8 requests: 64 prompt tokens, 128 new
    serve32     32 requests: prompt 16 + (37 i mod 241), new 32 + (29 i mod 97)
    long4096    1 request: 4096 prompt tokens, 64 new (--kv-cache-mode AsCacheQuantI8: int8 K/V)
Each runs in its own process (so peak_rss_mb is that workload's own peak: weights, KV cache,
workspaces, Python; with --ranks, the largest rank's), on --threads kernel threads. Figures:
    ttft_ms          median over requests of submission -> first token (ttft_p99_ms: the 99th
                     percentile, interpolated)
    prefill_tok_s    prompt tokens / (submission -> the last request's first token)
    decode_tok_s     tokens after each request's first / (earliest first token -> last token)
    total_tok_s      new tokens / (submission -> last token)
    peak_rss_mb      the workload process's peak resident memory (VmHWM)
    host             what the host did to this process meanwhile (bench/host.py: run-queue wait,
                     steal, migrations, the busiest threads' cpus, memory on huge pages)
and the bounds of bench/bounds.py, with bench/machine.py's limits (bf16 peak measured once,
bw_gbs just before and just after each run, the mean used):
    prefill_bound_tok_s, prefill_fraction    prefill512, long4096: the bf16 peak over the prompt's flops
                                             (every token through the layers, causal attention, the
                                             head once: bounds.prompt_flops)
    ttft_bound_ms, ttft_over_bound           several requests: the median TTFT of their prompts
                                             run shortest first at the bf16 peak (bounds.py)
    decode_bound_tok_s, decode_fraction      decode workloads: from the first first token to the last
                                             token, the decode steps and the prompts prefilled meanwhile
                                             at bw and bf16 peak (bounds.decode_window_bound); long4096
                                             reads the K/V bytes of its context besides the weights
    total_bound_tok_s, total_fraction        every prompt and new token at the bf16 peak, every step
                                             reading the weights at bw (bounds.total_bound)
    python bench/engine.py --neighbour [--workloads decode1,serve32]
runs each workload quiet, then beside a busy-loop process (one core of two taken), and prints
both figures and their ratio (total_tok_s; the target is >= 0.4 of quiet), with the share of
the cpu time each run wanted that it got (bench/host.py: below 1, the "quiet" run was not).
    python bench/engine.py --workloads serve32 --baseline-env DASHINFER_MAX_WAIT_STEPS=0 --pairs 3
alternates runs with the variables set (A) and without (B) and prints every pair's B/A ratios
(e.g. first come first served against the scheduler's default order).

--model: default (SmolLM2-135M-Instruct), a Hugging Face directory, a .gguf file or a serialized
DIR/PREFIX (bench/models.py); bench/make_model.py writes random-weight models of real shapes.

    python bench/engine.py --profile [--quant int8] [--threads N] [--by-op] [--rows 8] [--prompt 4096]
times every kernel call and model-loop stage of 100 decode steps (of --rows requests after prompts
of --prompt tokens) instead (ms per step); the layers are one native call (kernel decoder_run)
unless --by-op runs them op by op from Python (then "kernel attention" is attention's share).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = {
    "prefill512": [(512, 1)],
    "decode1": [(32, 128)],
    "batch8": [(64, 128)] * 8,
    "serve32": [(16 + 37 * i % 241, 32 + 29 * i % 97) for i in range(32)],
    "long4096": [(4096, 64)],
}
KV_FORMATS = {"AsCacheDefault": None, "AsCacheQuantI8": "int8", "AsCacheQuantU4": "uint4"}


def run_workload(name, model, dtype, quant, group_size, threads, max_prefill, ranks, kv_mode, sampling=None):
    """In the child process: serve the workload, return its figures."""
    import dashinfer_client as allspark
    from bench import host, models
    from dashinfer_client import AsStatus

    requests = WORKLOADS[name]
    loader = models.load(model, dtype, quant, group_size)
    engine = allspark.ClientEngine(nodes=ranks) if ranks else allspark.Engine()
    prompts, start_s = start_workload(engine, loader, name, threads, kv_mode, max_prefill)

    before = host.sample()
    t0 = time.time() * 1000.0
    queues = submit(engine, loader, prompts, requests, sampling)
    assert engine.sync_request("bench", None) == AsStatus.ALLSPARK_SUCCESS
    seen = host.since(before)  # in-process only: a rank's threads are not this process's
    stats = [q.RequestStatInfo() for q in queues]
    rss = server_peak_rss_mb() if ranks else peak_rss_mb()
    engine.release_model("bench")
    if ranks:
        engine.close()

    ttft = [s["time_to_first_token"] for s in stats]
    return {
        "workload": name, "weights": dtype + (f"-{quant}" if quant else ""), "threads": threads,
        "kv_cache_mode": kv_mode, "ranks": ranks or "in-process", "sampling": sampling or "greedy",
        "requests": len(stats), "prompt_tokens": sum(s["context_token_length"] for s in stats),
        "new_tokens": sum(s["generated_token_length"] for s in stats),
        "ttft_ms": round(statistics.median(ttft), 1),
        "ttft_min_ms": round(min(ttft), 1),
        "ttft_p99_ms": round(statistics.quantiles(ttft, n=100, method="inclusive")[98], 1)
        if len(ttft) > 1 else round(ttft[0], 1),
        **rates(stats, t0),
        "peak_rss_mb": rss,
        "start_model_s": round(start_s, 2),
        "host": seen,
    }


def rates(stats, t0: float) -> dict:
    """prefill, decode and total tok/s of a workload's requests (RequestStatInfo dicts) submitted
    at t0 (ms): the definitions in this module's docstring."""
    first = [s["first_token_time"] for s in stats]
    last = max(s["last_token_time"] for s in stats)
    new_tokens = sum(s["generated_token_length"] for s in stats)
    after_first = new_tokens - len(stats)
    return {
        "prefill_tok_s": round(sum(s["context_token_length"] for s in stats) / (max(first) - t0) * 1e3, 1),
        "decode_tok_s": round(after_first / (last - min(first)) * 1e3, 1) if after_first else None,
        "total_tok_s": round(new_tokens / (last - t0) * 1e3, 1),
    }


def timed_call(spent, label, fn):
    """fn, adding the seconds of every call to spent[label]."""
    def call(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - t
    return call


def start_workload(engine, loader, name, threads, kv_mode="AsCacheDefault", max_prefill=0) -> tuple:
    """Install and start model "bench" on `engine`, sized for workload `name`: (its random
    prompts, the seconds install + start took)."""
    import numpy as np

    import dashinfer_client as allspark
    from dashinfer_client import AsStatus

    requests = WORKLOADS[name]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, loader.config.vocab_size, p).tolist() for p, _ in requests]
    builder = loader.create_reference_runtime_config_builder(
        "bench", allspark.TargetDevice.CPU, [0], max_batch=len(requests))
    builder.max_length(max(p + n for p, n in requests)).thread_num(threads).kv_cache_mode(kv_mode)
    if max_prefill:
        builder.max_prefill_length(max_prefill)
    t = time.perf_counter()
    assert engine.install_model(builder.build()) == AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model("bench") == AsStatus.ALLSPARK_SUCCESS
    return prompts, time.perf_counter() - t


def greedy(max_length: int, sampling=None):
    """The generation config of every bench request: greedy (or sampling with the options of
    parse_sampling), eos ignored, up to max_length."""
    from dashinfer_client import ASGenerationConfigBuilder
    return ASGenerationConfigBuilder(seed=0).update(
        {"do_sample": bool(sampling), "top_k": 0, "early_stopping": False, "max_length": max_length,
         **(sampling or {})})


def parse_sampling(text: str) -> dict:
    """--sampling "temperature=0.7,top_p=0.8,top_k=20" -> options (numbers); "" -> {} (greedy)."""
    options = {}
    for item in filter(None, text.split(",")):
        name, value = (part.strip() for part in item.split("="))
        options[name] = int(value) if name == "top_k" else float(value)
    return options


class TimedKernels:
    """The kernels module K with every call's seconds added to spent[prefix + its name] (the
    model's `kernels` hook); with `regions` (a callable -> OpenMP parallel regions so far, see
    bench/step_overhead.py), each call's regions added to counted[its name] too."""

    def __init__(self, K, spent, prefix="", regions=None, counted=None):
        self.K, self.spent, self.prefix, self.regions, self.counted = K, spent, prefix, regions, counted

    def __getattr__(self, name):
        call = timed_call(self.spent, self.prefix + name, getattr(self.K, name))
        if self.regions is None:
            return call

        def counted(*args, **kwargs):
            before = self.regions()
            try:
                return call(*args, **kwargs)
            finally:
                self.counted[name] += self.regions() - before
        return counted


def submit(engine, loader, prompts, requests, sampling=None) -> list:
    """Start every request of a workload (greedy unless sampling, eos ignored) on model "bench";
    their queues."""
    from dashinfer_client import AsStatus
    queues = []
    for prompt, (_, new) in zip(prompts, requests):
        status, _, queue = engine.start_request_ids("bench", loader, prompt, greedy(len(prompt) + new, sampling))
        assert status == AsStatus.ALLSPARK_SUCCESS
        queues.append(queue)
    return queues


def runtime_builder(model):
    from dashinfer_client import AsModelRuntimeConfigBuilder
    return AsModelRuntimeConfigBuilder().model_dir(model.model_dir, model.prefix)


def peak_rss_mb(pid="self") -> float:
    """A process's peak resident memory (this one's by default): VmHWM, which starts afresh at
    exec (ru_maxrss would carry over the parent's peak: Linux keeps it across fork and exec)."""
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return round(kb / 1024)


def server_peak_rss_mb() -> float:
    """The largest peak resident memory among the server ranks this process spawned."""
    import psutil
    peaks = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any("dashinfer_server" in part for part in proc.cmdline()):
                peaks.append(peak_rss_mb(proc.pid))
        except (psutil.Error, OSError):
            pass
    return max(peaks) if peaks else None


def run_child(cmd, env, name) -> dict:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ab_pairs(cmd, env, name, baseline_env, pairs) -> None:
    """Interleaved runs of A (`baseline_env` set) and B (as is), in the order ABBAAB...: the
    host's load drifts from one minute to the next, so only ratios of neighbouring runs say what
    a change did."""
    env_a = dict(env, **dict(item.split("=", 1) for item in baseline_env))
    keys = ("ttft_ms", "ttft_p99_ms", "total_tok_s", "decode_tok_s", "prefill_tok_s")
    ratios = {k: [] for k in keys}
    for i in range(pairs):
        if i % 2:  # ABBA: a drift in load weighs on both sides alike
            b, a = run_child(cmd, env, name), run_child(cmd, env_a, name)
        else:
            a, b = run_child(cmd, env_a, name), run_child(cmd, env, name)
        pair = {k: round(b[k] / a[k], 3) for k in keys if a.get(k) and b.get(k)}
        for k, v in pair.items():
            ratios[k].append(v)
        print(json.dumps({"workload": name, "pair": i, "A": {k: a.get(k) for k in keys},
                          "B": {k: b.get(k) for k in keys}, "B_over_A": pair,
                          "load_avg_1min": round(os.getloadavg()[0], 2)}), flush=True)
    print(json.dumps({"workload": name, "A_env": baseline_env, "pairs": pairs,
                      "median_B_over_A": {k: statistics.median(v) for k, v in ratios.items() if v},
                      "min_B_over_A": {k: min(v) for k, v in ratios.items() if v},
                      "max_B_over_A": {k: max(v) for k, v in ratios.items() if v}}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default",
                        help="default (SmolLM2-135M-Instruct), a Hugging Face dir, a .gguf or a serialized DIR/PREFIX")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--quant", default=None, choices=["int8", "uint4"])
    parser.add_argument("--group-size", type=int, default=None,
                        help="with --quant: InstantQuant group_size (-1: per channel; default int8 64, uint4 32)")
    parser.add_argument("--workloads", default=",".join(w for w in WORKLOADS if w != "long4096"),
                        help=f"comma-separated, of {', '.join(WORKLOADS)} (default: all but long4096)")
    parser.add_argument("--kv-cache-mode", default="AsCacheDefault", choices=list(KV_FORMATS))
    parser.add_argument("--prompt", type=int, default=32, help="with --profile: prompt tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-prefill", type=int, default=0, help="max_prefill_length (0: the engine's)")
    parser.add_argument("--ranks", type=int, default=0,
                        help="serve through a ClientEngine on this many tensor-parallel ranks (0: the "
                             "in-process Engine); without DASHINFER_NUMA_NODES the cpus are split "
                             "evenly into that many simulated nodes, --threads is then per rank")
    parser.add_argument("--profile", action="store_true",
                        help="instead: time every kernel and model-loop stage of decode1 steps")
    parser.add_argument("--rows", type=int, default=1, help="with --profile: requests decoded together")
    parser.add_argument("--by-op", action="store_true",
                        help="with --profile: run the layers op by op (each kernel timed on its own)")
    parser.add_argument("--neighbour", action="store_true",
                        help="run each workload quiet and beside a busy-loop process; print the ratio")
    parser.add_argument("--baseline-env", nargs="*", default=None, metavar="NAME=VALUE",
                        help="A/B: alternate runs with these variables set (A) and without (B), "
                             "--pairs times, and print the B/A ratios of every pair")
    parser.add_argument("--pairs", type=int, default=3, help="with --baseline-env: A/B pairs per workload")
    parser.add_argument("--sampling", default="",
                        help='requests that sample, e.g. "temperature=0.6,top_p=0.9" (default: greedy)')
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        sys.path.insert(0, ROOT)
        from bench.decode_profile import profile_decode
        print(json.dumps(profile_decode(args.model, args.dtype, args.quant, args.group_size, args.threads,
                                        args.by_op, args.kv_cache_mode, args.rows, args.prompt)))
        return
    if args.child:
        print(json.dumps(run_workload(args.child, args.model, args.dtype, args.quant, args.group_size,
                                      args.threads, args.max_prefill, args.ranks, args.kv_cache_mode,
                                      parse_sampling(args.sampling))))
        return
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {', '.join(WORKLOADS)}")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    sys.path.insert(0, ROOT)
    from dashinfer_client import settings
    if args.ranks and not settings.get("DASHINFER_NUMA_NODES", env):
        from dashinfer_server.topology import simulated_nodes
        env["DASHINFER_NUMA_NODES"] = simulated_nodes(args.ranks)
    from bench import bounds, models
    from bench.machine import best_bf16_gflops, read_bandwidth
    model = models.load(args.model, args.dtype, args.quant, args.group_size)  # converted once, here
    per_token = bounds.weight_bytes_per_token(model)
    threads = args.threads * max(1, args.ranks)
    peak = best_bf16_gflops(threads)
    for name in names:
        bw_before = read_bandwidth(threads)  # this host's bandwidth drifts: measure it around the run
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--model", args.model,
               "--dtype", args.dtype, "--threads", str(args.threads), "--max-prefill", str(args.max_prefill),
               "--ranks", str(args.ranks), "--kv-cache-mode", args.kv_cache_mode]
        cmd += ["--quant", args.quant] if args.quant else []
        cmd += ["--group-size", str(args.group_size)] if args.group_size else []
        cmd += ["--sampling", args.sampling] if args.sampling else []
        if args.baseline_env is not None:
            ab_pairs(cmd, env, name, args.baseline_env, args.pairs)
            continue
        result = run_child(cmd, env, name)
        if args.neighbour:
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                beside = run_child(cmd, env, name)
            finally:
                busy.kill()
                busy.wait()
            print(json.dumps({"workload": name, "quiet_total_tok_s": result["total_tok_s"],
                              "neighbour_total_tok_s": beside["total_tok_s"],
                              "ratio": round(beside["total_tok_s"] / result["total_tok_s"], 3), "target": 0.4,
                              "quiet_cpu_share": result["host"]["cpu_share"],
                              "neighbour_cpu_share": beside["host"]["cpu_share"],
                              "load_avg_1min": round(os.getloadavg()[0], 2)}), flush=True)
            continue
        bw = (bw_before + read_bandwidth(threads)) / 2
        result.update(model=os.path.basename(args.model.rstrip("/")), bw_gbs=round(bw, 1),
                      bf16_gflops=round(peak), weight_mb_per_token=round(per_token / 2**20, 1))
        if len(WORKLOADS[name]) > 1:
            bound = bounds.ttft_bound_ms([p for p, _ in WORKLOADS[name]], bounds.flops_per_token(model.config),
                                         peak, bounds.head_flops(model.config))
            result.update(ttft_bound_ms=round(bound, 1), ttft_over_bound=round(result["ttft_ms"] / bound, 2))
        kv_format = KV_FORMATS[args.kv_cache_mode] or ("fp32" if args.dtype == "float32" else "bf16")
        prompt, new = WORKLOADS[name][0]
        # long4096 reads its context's K/V every step besides the weights (at the mean context)
        # a mixture of experts reads the experts its rows chose: as many rows as requests (serve32's
        # steps hold fewer at times, so its bound there is low)
        weight_bytes = bounds.weight_bytes_per_token(model, rows=len(WORKLOADS[name]))
        step_bytes = weight_bytes + (bounds.kv_bytes_per_token(model.config, kv_format) * (prompt + new / 2)
                                     if name == "long4096" else 0)
        if name in ("prefill512", "long4096"):
            bound = bounds.prefill_bound(model.config, prompt, peak)
            result.update(prefill_bound_tok_s=round(bound, 1),
                          prefill_fraction=round(result["prefill_tok_s"] / bound, 3))
        steps = max(new for _, new in WORKLOADS[name]) - 1  # the longest request's decode steps
        if result["decode_tok_s"]:
            bound, kind = bounds.decode_window_bound(
                result["new_tokens"] - result["requests"], steps, result["prompt_tokens"],
                result["ttft_min_ms"] / 1e3, step_bytes, model.config, bw, peak)
            result.update(decode_bound_tok_s=round(bound, 1), decode_bound=kind,
                          decode_fraction=round(result["decode_tok_s"] / bound, 3))
        bound = bounds.total_bound(result["prompt_tokens"], result["new_tokens"], result["requests"],
                                   steps + 1, weight_bytes, model.config, bw, peak)
        result.update(total_bound_tok_s=round(bound, 1), total_fraction=round(result["total_tok_s"] / bound, 3))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
