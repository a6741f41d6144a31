"""End-to-end engine workloads on the default model: one JSON line per workload.

    python bench/engine.py [--quant int8] [--workloads prefill512,decode1,batch8,serve32]

Workloads (token-level random prompts, greedy, eos ignored, every request submitted at once):
    prefill512  1 request: 512 prompt tokens, 1 new
    decode1     1 request: 32 prompt tokens, 128 new
    batch8      8 requests: 64 prompt tokens, 128 new
    serve32     32 requests: prompt 16 + (37 i mod 241), new 32 + (29 i mod 97)
Each runs in its own process (so peak_rss_mb is that workload's own peak: weights, KV cache,
workspaces, Python), on --threads kernel threads. Figures:
    ttft_ms          median over requests of submission -> first token
    prefill_tok_s    prompt tokens / (submission -> the last request's first token)
    decode_tok_s     tokens after each request's first / (earliest first token -> last token)
    total_tok_s      new tokens / (submission -> last token)
    peak_rss_mb      the workload process's peak resident memory (ru_maxrss)
    bw_fraction      decode1 only: decode_tok_s over the memory-bandwidth bound (bytes of packed
                     weights read per token / streaming read bandwidth of bench/machine.py)
"""
import argparse
import json
import os
import resource
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


def run_workload(name, dtype, quant, threads, max_prefill):
    """In the child process: serve the workload, return its figures."""
    import numpy as np

    import dashinfer_client as allspark
    from dashinfer_client import ASGenerationConfigBuilder, AsStatus, default_model

    requests = WORKLOADS[name]
    loader = allspark.DashInferModel(*default_model.ensure_default_model(dtype, quant=quant, progress=False))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, loader.config.vocab_size, p).tolist() for p, _ in requests]
    engine = allspark.Engine()
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
    engine.release_model("bench")

    first = [s["first_token_time"] for s in stats]
    last = max(s["last_token_time"] for s in stats)
    new_tokens = sum(s["generated_token_length"] for s in stats)
    after_first = new_tokens - len(stats)
    return {
        "workload": name, "weights": dtype + (f"-{quant}" if quant else ""), "threads": threads,
        "requests": len(stats), "prompt_tokens": sum(s["context_token_length"] for s in stats),
        "new_tokens": new_tokens,
        "ttft_ms": round(statistics.median(s["time_to_first_token"] for s in stats), 1),
        "prefill_tok_s": round(sum(s["context_token_length"] for s in stats) / (max(first) - t0) * 1e3, 1),
        "decode_tok_s": round(after_first / (last - min(first)) * 1e3, 1) if after_first else None,
        "total_tok_s": round(new_tokens / (last - t0) * 1e3, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "start_model_s": round(start_s, 2),
    }


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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_workload(args.child, args.dtype, args.quant, args.threads, args.max_prefill)))
        return
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {', '.join(WORKLOADS)}")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bound = None
    if "decode1" in names:
        sys.path.insert(0, ROOT)
        from bench.machine import read_bandwidth
        bw = read_bandwidth(args.threads)
        per_token = weight_bytes_per_token(args.dtype, args.quant)
        bound = bw * 1e9 / per_token
    for name in names:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--dtype", args.dtype,
               "--threads", str(args.threads), "--max-prefill", str(args.max_prefill)]
        if args.quant:
            cmd += ["--quant", args.quant]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if name == "decode1":
            result.update(bw_gbs=round(bw, 1), weight_mb_per_token=round(per_token / 2**20, 1),
                          bound_tok_s=round(bound, 1), bw_fraction=round(result["decode_tok_s"] / bound, 3))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
