"""ClientEngine (gRPC, spawned server) against the in-process Engine on the same workloads.

    PYTHONPATH=. python bench/client.py [--workloads decode1,serve32] [--repeat 2] [--dtype bfloat16]
    PYTHONPATH=. python bench/client.py --idle 10 [--ranks 2]   # CPU% of an idle group

decode1: 1 request, 32-token prompt, 128 new tokens (streaming latency per token).
serve32: 32 requests at once, prompt 16 + (37 i mod 241), new 32 + (29 i mod 97) tokens.
Prints generated tokens per second of each engine (best of --repeat runs after a warm-up) and
the ratio client / in-process. Both engines hold the default model with the same runtime config
and the same OpenMP placement, and take turns (never run at the same time).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dashinfer_client as allspark  # noqa: E402
from dashinfer_client.default_model import ensure_default_model  # noqa: E402

WORKLOADS = {
    "decode1": [(32, 128)],
    "serve32": [(16 + (37 * i) % 241, 32 + (29 * i) % 97) for i in range(32)],
}


def prompts(workload, vocab):
    """Deterministic prompts: (ids, new tokens) per request."""
    return [([(7 + 131 * i + 17 * j) % (vocab - 10) + 5 for j in range(n_prompt)], n_new)
            for i, (n_prompt, n_new) in enumerate(WORKLOADS[workload])]


def run(engine, name, requests) -> tuple[float, int]:
    """Start every request at once, read every queue until it ends: (seconds, tokens generated)."""
    t0 = time.perf_counter()
    started = []
    for ids, n_new in requests:
        gen = allspark.ASGenerationConfigBuilder().update(
            {"top_k": 1, "max_length": len(ids) + n_new, "early_stopping": False, "seed": 1})
        status, handle, queue = engine.start_request_ids(name, None, ids, gen)
        if status != allspark.AsStatus.ALLSPARK_SUCCESS:
            raise RuntimeError(f"start_request_ids: {status.name}: {engine.last_error}")
        started.append((handle, queue))
    tokens = 0
    for handle, queue in started:
        while (ele := queue.Get()) is not None:
            tokens += len(ele.ids_from_generate)
    seconds = time.perf_counter() - t0
    for handle, queue in started:
        engine.release_request(name, handle)
    return seconds, tokens


def install(engine, runtime_cfg) -> None:
    for call, arg in (("install_model", runtime_cfg), ("start_model", runtime_cfg.model_name)):
        if getattr(engine, call)(arg) != allspark.AsStatus.ALLSPARK_SUCCESS:
            raise RuntimeError(f"{call}: {engine.last_error}")


def measure(engines, runtime_cfg, workloads, repeat) -> dict:
    """{(engine name, workload): best tokens/s}; the engines take turns, so a change of load on
    the machine hits both alike."""
    name = runtime_cfg.model_name
    vocab = allspark.DashInferModel(runtime_cfg.model_dir, runtime_cfg.model_prefix).config.vocab_size
    best = {}
    for w in workloads:
        requests = prompts(w, vocab)
        for engine in engines.values():
            run(engine, name, requests[:2])  # warm-up
        for _ in range(repeat):
            for label, engine in engines.items():
                seconds, tokens = run(engine, name, requests)
                best[label, w] = max(best.get((label, w), 0.0), tokens / seconds)
    return best


def idle_cpu(runtime_cfg, nodes, seconds) -> float:
    """CPU% (of one core) that a spawned group of `nodes` ranks burns while it serves nothing:
    the model installed and started, one request run, then `seconds` of quiet."""
    import psutil
    from dashinfer_client import settings
    from dashinfer_server.topology import simulated_nodes
    env = {}
    if nodes > 1 and not settings.get("DASHINFER_NUMA_NODES"):
        env["DASHINFER_NUMA_NODES"] = simulated_nodes(nodes)
    engine = allspark.ClientEngine(nodes=nodes, env=env)
    try:
        install(engine, runtime_cfg)
        vocab = allspark.DashInferModel(runtime_cfg.model_dir, runtime_cfg.model_prefix).config.vocab_size
        run(engine, runtime_cfg.model_name, prompts("decode1", vocab))
        time.sleep(1.0)  # past the spin of the last step's threads
        procs = psutil.Process().children(recursive=True)
        before = {p.pid: sum(p.cpu_times()[:2]) for p in procs}
        time.sleep(seconds)
        spent = sum(sum(p.cpu_times()[:2]) - before[p.pid] for p in procs if p.is_running())
        return spent / seconds * 100
    finally:
        engine.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="decode1,serve32")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--idle", type=float, default=0, metavar="SECONDS",
                   help="instead: CPU%% of an idle spawned group (--ranks ranks) over SECONDS")
    p.add_argument("--ranks", type=int, default=2, help="ranks of the group --idle measures")
    args = p.parse_args()
    workloads = args.workloads.split(",")
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    model_dir, prefix = ensure_default_model(dtype=args.dtype)
    cfg = (allspark.AsModelRuntimeConfigBuilder().model_name("bench").model_dir(model_dir, prefix)
           .max_batch(args.max_batch).max_length(512).build())

    if args.idle:
        cpu = idle_cpu(cfg, args.ranks, args.idle)
        print(f"idle group of {args.ranks} rank(s): {cpu:.2f}% of one core over {args.idle:g} s")
        return

    from dashinfer_server.engine import Engine
    engines = {"local": Engine(), "client": allspark.ClientEngine()}
    try:
        for engine in engines.values():
            install(engine, cfg)
        best = measure(engines, cfg, workloads, args.repeat)
    finally:
        engines["client"].close()
    print(f"{'workload':10} {'in-process tok/s':>17} {'ClientEngine tok/s':>19} {'ratio':>6}")
    for w in workloads:
        local, remote = best["local", w], best["client", w]
        print(f"{w:10} {local:17.1f} {remote:19.1f} {remote / local:6.3f}")


if __name__ == "__main__":
    main()
