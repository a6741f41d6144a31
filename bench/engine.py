"""End-to-end engine workloads on the default model: one JSON line per workload.

    python bench/engine.py [--quant int8] [--workloads prefill512,decode1,batch8,serve32]
    python bench/engine.py --ranks 2 --threads 1    # through ClientEngine, 2 tensor-parallel ranks

Workloads (token-level random prompts, greedy, eos ignored, every request submitted at once):
    prefill512  1 request: 512 prompt tokens, 1 new
    decode1     1 request: 32 prompt tokens, 128 new
    batch8      8 requests: 64 prompt tokens, 128 new
    serve32     32 requests: prompt 16 + (37 i mod 241), new 32 + (29 i mod 97)
Each runs in its own process (so peak_rss_mb is that workload's own peak: weights, KV cache,
workspaces, Python; with --ranks, the largest rank's), on --threads kernel threads. Figures:
    ttft_ms          median over requests of submission -> first token
    prefill_tok_s    prompt tokens / (submission -> the last request's first token)
    decode_tok_s     tokens after each request's first / (earliest first token -> last token)
    total_tok_s      new tokens / (submission -> last token)
    peak_rss_mb      the workload process's peak resident memory (VmHWM)
    bw_fraction      decode1 only: decode_tok_s over the memory-bandwidth bound (bytes of packed
                     weights read per token / streaming read bandwidth of bench/machine.py, the
                     mean of bw_gbs measured just before and just after the run)

    python bench/engine.py --profile [--quant int8] [--threads N] [--by-op]
times every kernel call and runner stage of 100 decode1 steps instead (ms per step); the layers
are one native call (kernel decoder_run) unless --by-op runs them op by op from Python.
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
}


def run_workload(name, dtype, quant, threads, max_prefill, ranks):
    """In the child process: serve the workload, return its figures."""
    import numpy as np

    import dashinfer_client as allspark
    from dashinfer_client import ASGenerationConfigBuilder, AsStatus, default_model

    requests = WORKLOADS[name]
    loader = allspark.DashInferModel(*default_model.ensure_default_model(dtype, quant=quant, progress=False))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, loader.config.vocab_size, p).tolist() for p, _ in requests]
    engine = allspark.ClientEngine(nodes=ranks) if ranks else allspark.Engine()
    builder = loader.create_reference_runtime_config_builder(
        "bench", allspark.TargetDevice.CPU, [0], max_batch=len(requests))
    builder.max_length(max(p + n for p, n in requests)).thread_num(threads)
    if max_prefill:
        builder.max_prefill_length(max_prefill)
    t = time.perf_counter()
    assert engine.install_model(builder.build()) == AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model("bench") == AsStatus.ALLSPARK_SUCCESS
    start_s = time.perf_counter() - t

    t0 = time.time() * 1000.0
    queues = []
    for prompt, (_, new) in zip(prompts, requests):
        gen = ASGenerationConfigBuilder(seed=0).update(
            {"do_sample": False, "top_k": 0, "early_stopping": False, "max_length": len(prompt) + new})
        status, _, queue = engine.start_request_ids("bench", loader, prompt, gen)
        assert status == AsStatus.ALLSPARK_SUCCESS
        queues.append(queue)
    assert engine.sync_request("bench", None) == AsStatus.ALLSPARK_SUCCESS
    stats = [q.RequestStatInfo() for q in queues]
    rss = server_peak_rss_mb() if ranks else peak_rss_mb()
    engine.release_model("bench")
    if ranks:
        engine.close()

    first = [s["first_token_time"] for s in stats]
    last = max(s["last_token_time"] for s in stats)
    new_tokens = sum(s["generated_token_length"] for s in stats)
    after_first = new_tokens - len(stats)
    return {
        "workload": name, "weights": dtype + (f"-{quant}" if quant else ""), "threads": threads,
        "ranks": ranks or "in-process", "requests": len(stats), "prompt_tokens": sum(s["context_token_length"] for s in stats),
        "new_tokens": new_tokens,
        "ttft_ms": round(statistics.median(s["time_to_first_token"] for s in stats), 1),
        "prefill_tok_s": round(sum(s["context_token_length"] for s in stats) / (max(first) - t0) * 1e3, 1),
        "decode_tok_s": round(after_first / (last - min(first)) * 1e3, 1) if after_first else None,
        "total_tok_s": round(new_tokens / (last - t0) * 1e3, 1),
        "peak_rss_mb": rss,
        "start_model_s": round(start_s, 2),
    }


def profile_decode(dtype, quant, threads, by_op, steps=100):
    """Where a decode1 step goes: the ModelRunner stepped in this thread (no scheduler thread),
    every kernel call and every runner stage timed -> ms per step."""
    import collections

    import numpy as np

    import dashinfer_server.runner as runner_module
    from dashinfer_client import ASGenerationConfigBuilder, ResultQueue, default_model
    from dashinfer_client.model import DashInferModel
    from dashinfer_server import kernels as K
    from dashinfer_server.sampler import RequestSamplingState, SamplingParams
    from dashinfer_server.sequence import Sequence

    model = DashInferModel(*default_model.ensure_default_model(dtype, quant=quant, progress=False))
    cfg = (runtime_builder(model).model_name("profile").max_batch(1).max_length(32 + steps + 8)
           .thread_num(threads).build())
    K.set_num_threads(threads)
    runner = runner_module.ModelRunner(model, cfg)
    runner.load()
    runner.model.fused = not by_op
    runner._warm_up()
    spent = collections.defaultdict(float)

    def timed(label, fn):
        def call(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - t
        return call

    class TimedKernels:
        def __getattr__(self, name):
            return timed("kernel " + name, getattr(K, name))

    prompt = np.random.default_rng(0).integers(3, model.config.vocab_size, 32).tolist()
    gen = ASGenerationConfigBuilder(seed=0).update(
        {"do_sample": False, "top_k": 0, "early_stopping": False, "max_length": 32 + steps + 4}).build()
    seq = Sequence(prompt, gen.max_length)
    seq.queue, seq.sampling = ResultQueue(), RequestSamplingState(SamplingParams.from_config(gen), prompt)
    runner.scheduler.add(seq)
    runner.step()  # the prompt
    runner.step()  # a first decode, untimed
    runner.model.kernels = TimedKernels()
    runner.scheduler.schedule = timed("runner schedule", runner.scheduler.schedule)
    runner.scheduler.advance = timed("runner advance", runner.scheduler.advance)
    runner.sampler.sample = timed("runner sample", runner.sampler.sample)
    runner._deliver = timed("runner deliver", runner._deliver)
    forward = runner.model.forward
    runner.model.forward = timed("forward", forward)
    t = time.perf_counter()
    for _ in range(steps):
        runner.step()
    step = (time.perf_counter() - t) / steps
    runner.model.kernels = K
    per_step = {k: v / steps * 1e3 for k, v in spent.items()}
    kernels = sum(v for k, v in per_step.items() if k.startswith("kernel "))
    runner_parts = sum(v for k, v in per_step.items() if k.startswith("runner "))
    return {
        "profile": "decode1", "weights": dtype + (f"-{quant}" if quant else ""), "threads": threads,
        "step_ms": round(step * 1e3, 3),
        "kernels_ms": round(kernels, 3),
        "forward_python_ms": round(per_step["forward"] - kernels, 3),
        "runner_python_ms": round(runner_parts, 3),
        "step_rest_ms": round(step * 1e3 - per_step["forward"] - runner_parts, 3),
        "detail_ms": {k: round(v, 3) for k, v in sorted(per_step.items(), key=lambda kv: -kv[1])
                      if k != "forward"},
    }


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


def weight_bytes_per_token(dtype, quant):
    """Bytes of packed weights one decode step streams: every linear layer and lm_head."""
    from dashinfer_client import default_model
    from dashinfer_client.model import DashInferModel
    from dashinfer_server.parallel import Shard
    from dashinfer_server.weights import WeightLoader
    model = DashInferModel(*default_model.ensure_default_model(dtype, quant=quant, progress=False))
    c = model.config
    weights = WeightLoader(model, Shard(0, 1, c.num_attention_heads, c.num_key_value_heads,
                                        c.intermediate_size, c.vocab_size)).load()
    linears = [w for layer in weights.layers for w in (layer.q, layer.k, layer.v, layer.o, layer.gate_up,
                                                        layer.down)]
    return sum(len(w) for w in linears + [weights.lm_head])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", choices=["default"],
                        help="the default model (SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--quant", default=None, choices=["int8", "uint4"])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-prefill", type=int, default=0, help="max_prefill_length (0: the engine's)")
    parser.add_argument("--ranks", type=int, default=0,
                        help="serve through a ClientEngine on this many tensor-parallel ranks (0: the "
                             "in-process Engine); without DASHINFER_NUMA_NODES the cpus are split "
                             "evenly into that many simulated nodes, --threads is then per rank")
    parser.add_argument("--profile", action="store_true",
                        help="instead: time every kernel and runner stage of decode1 steps")
    parser.add_argument("--by-op", action="store_true",
                        help="with --profile: run the layers op by op (each kernel timed on its own)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        sys.path.insert(0, ROOT)
        print(json.dumps(profile_decode(args.dtype, args.quant, args.threads, args.by_op)))
        return
    if args.child:
        print(json.dumps(run_workload(args.child, args.dtype, args.quant, args.threads, args.max_prefill,
                                      args.ranks)))
        return
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {', '.join(WORKLOADS)}")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.ranks and not env.get("DASHINFER_NUMA_NODES"):
        sys.path.insert(0, ROOT)
        from dashinfer_server.topology import simulated_nodes
        env["DASHINFER_NUMA_NODES"] = simulated_nodes(args.ranks)
    if "decode1" in names:
        sys.path.insert(0, ROOT)
        from bench.machine import read_bandwidth
        per_token = weight_bytes_per_token(args.dtype, args.quant)
    for name in names:
        if name == "decode1":  # this host's bandwidth drifts: measure it right around the run
            bw_before = read_bandwidth(args.threads * max(1, args.ranks))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--dtype", args.dtype,
               "--threads", str(args.threads), "--max-prefill", str(args.max_prefill),
               "--ranks", str(args.ranks)]
        if args.quant:
            cmd += ["--quant", args.quant]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if name == "decode1":
            bw_after = read_bandwidth(args.threads * max(1, args.ranks))
            bound = (bw_before + bw_after) / 2 * 1e9 / per_token
            result.update(bw_gbs=[round(bw_before, 1), round(bw_after, 1)],
                          weight_mb_per_token=round(per_token / 2**20, 1), bound_tok_s=round(bound, 1),
                          bw_fraction=round(result["decode_tok_s"] / bound, 3))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
