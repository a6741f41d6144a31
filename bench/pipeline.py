"""serve32 through pipe(prompts) against the same requests through the DashInfer API.

    python bench/pipeline.py [--pairs 3] [--tp 1|2] [--threads N]

The default model serves bench/engine.py's serve32 workload (32 requests, prompt 16 + (37 i mod
241) tokens, 32 + (29 i mod 97) new, greedy, eos ignored, all submitted at once) twice per pair:
once as text prompts through pipe(prompts, [GenerationConfig per prompt], do_preprocess=False),
once as the same token ids through engine.start_request_ids on an engine of the same runtime
config (tp=1: the in-process Engine; tp=2: a ClientEngine over 2 ranks on simulated NUMA nodes).
Both stay open and the runs alternate in the same minute (ABBA: the order flips every pair), the
prefix cache off so no run reuses another's prompts. A third run sends the same ids straight to the
pipeline's own engine (pipe.engine, through the DashInfer API): pipe against it is the cost of the
pipeline layer alone, engine against it the difference between two engine instances. Printed per
pair: seconds from submission to the last token of each run and the ratios; then the medians.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.engine import WORKLOADS  # noqa: E402

REQUESTS = WORKLOADS["serve32"]


def text_prompts(tokenizer, vocab_size):
    """Texts whose encoding is about the workload's prompt lengths, and their exact ids."""
    import numpy as np
    rng = np.random.default_rng(0)
    texts = [tokenizer.decode(rng.integers(3, vocab_size, p).tolist(), skip_special_tokens=True)
             for p, _ in REQUESTS]
    return texts, [tokenizer.encode(t, add_special_tokens=True) for t in texts]


def run_engine(engine, loader, ids_list, name="bench"):
    from dashinfer_client import ASGenerationConfigBuilder, AsStatus
    t = time.perf_counter()
    handles = []
    for ids, (_, new) in zip(ids_list, REQUESTS):
        gen = ASGenerationConfigBuilder(seed=0).update(
            {"do_sample": False, "top_k": 0, "early_stopping": False, "max_length": len(ids) + new})
        status, handle, _ = engine.start_request_ids(name, loader, ids, gen)
        assert status == AsStatus.ALLSPARK_SUCCESS
        handles.append(handle)
    assert engine.sync_request(name, None) == AsStatus.ALLSPARK_SUCCESS
    elapsed = time.perf_counter() - t
    for handle in handles:
        engine.release_request(name, handle)
    return elapsed


def run_pipe(pipe, texts):
    from dashinfer_client import GenerationConfig
    gens = [GenerationConfig(max_new_tokens=new, ignore_eos=True) for _, new in REQUESTS]
    t = time.perf_counter()
    out = pipe(texts, gen_config=gens, do_preprocess=False)
    elapsed = time.perf_counter() - t
    assert [r.generate_token_len for r in out] == [new for _, new in REQUESTS]
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--tp", type=int, default=1, choices=(1, 2))
    parser.add_argument("--threads", type=int, default=None, help="threads per rank (default: all its cores)")
    args = parser.parse_args()
    if args.tp > 1:
        os.environ.setdefault("DASHINFER_NUMA_NODES", "0:0;1:1")
    import dashinfer_client as allspark
    from dashinfer_client import CpuEngineConfig, pipeline
    from dashinfer_client.pipeline_api.pipeline import MODEL_NAME

    session_len = max(p + n for p, n in REQUESTS) + 64
    config = CpuEngineConfig(tp=args.tp, session_len=session_len, max_batch_size=len(REQUESTS),
                             enable_prefix_caching=False, threads_per_rank=args.threads)
    pipe = pipeline(None, backend_config=config)
    loader = pipe.loader
    texts, ids_list = text_prompts(pipe.tokenizer, loader.config.vocab_size)
    engine = allspark.Engine() if args.tp == 1 else allspark.ClientEngine(nodes=args.tp,
                                                                          threads_per_rank=args.threads)
    runtime = (loader.create_reference_runtime_config_builder("bench", allspark.TargetDevice.CPU, [0],
                                                              max_batch=len(REQUESTS))
               .max_length(session_len).prefill_cache(False).thread_num(args.threads or 0).build())
    assert engine.install_model(runtime) == allspark.AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model("bench") == allspark.AsStatus.ALLSPARK_SUCCESS
    try:
        run_engine(engine, loader, ids_list[:4])  # warm both up
        run_pipe(pipe, texts)
        runs = {"engine": lambda: run_engine(engine, loader, ids_list),
                "pipe.engine": lambda: run_engine(pipe.engine, loader, ids_list, MODEL_NAME),
                "pipe": lambda: run_pipe(pipe, texts)}
        ratios = {"pipe/engine": [], "pipe/pipe.engine": []}
        for pair in range(args.pairs):
            order = list(runs) if pair % 2 == 0 else list(reversed(runs))
            t = {name: runs[name]() for name in order}
            ratios["pipe/engine"].append(t["pipe"] / t["engine"])
            ratios["pipe/pipe.engine"].append(t["pipe"] / t["pipe.engine"])
            print(f"pair {pair}: " + "  ".join(f"{n} {t[n]:.2f} s" for n in runs) + "  "
                  + "  ".join(f"{k} {v[-1]:.3f}" for k, v in ratios.items()), flush=True)
        print(f"serve32 tp={args.tp}, {args.pairs} pairs, {sum(n for _, n in REQUESTS)} new tokens per run: "
              + ", ".join(f"median {k} {statistics.median(v):.3f}" for k, v in ratios.items()))
    finally:
        engine.release_model("bench")
        if args.tp > 1:
            engine.close()
        pipe.close()


if __name__ == "__main__":
    main()
