"""Where a prefill step's time goes: the prefill equivalent of `bench/engine.py --profile`.

    python bench/prefill_profile.py [--model PATH] [--quant int8|uint4] [--tokens 512] [--steps 5] [--threads 2]

Steps a ModelLoop in this thread with one fresh random prompt of --tokens tokens per step (each
step is the whole prompt and its first token, as prefill512 runs it). It prints:
    fused_step_ms        the fastest step with the layers in one native call (decoder_run)
    by_op_step_ms        the fastest step with the layers op by op from Python, and detail_ms,
                         each kernel's share of that step (ms per step, summed over the layers)
    linear_gflops        flops the step's linear layers really do (the lm_head on one row) over
                         the fused step, against bf16_gflops, the peak measured in this process
    bound_fraction       tokens/s over bench/bounds.py's prefill bound (the layers, causal attention,
                         the head once: what bench/engine.py prints as prefill_fraction, without the
                         engine's queue and scheduling)
"""
import argparse
import collections
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def profile_prefill(model_spec, dtype, quant, tokens, steps, threads):
    import numpy as np

    import dashinfer_server.model_loop as loop_module
    from bench import bounds, models
    from bench.engine import TimedKernels, greedy, runtime_builder
    from bench.machine import best_bf16_gflops
    from dashinfer_server import kernels as K
    from dashinfer_server.request import ModelLimits, new_request

    model = models.load(model_spec, dtype, quant)
    cfg = (runtime_builder(model).model_name("profile")
           .max_batch(1).max_length(tokens + 8).max_prefill_length(tokens).thread_num(threads).build())
    K.load()
    K.set_num_threads(threads)
    loop = loop_module.ModelLoop(model, cfg)
    loop.load()
    loop.warm_up()
    rng = np.random.default_rng(0)
    limits = ModelLimits(model.config.vocab_size, cfg.max_length, loop.block_capacity)

    def one_step():
        prompt = rng.integers(3, model.config.vocab_size, tokens).tolist()  # no prefix-cache hits
        loop.scheduler.add(new_request(prompt, greedy(tokens + 1).build(), limits))
        t = time.perf_counter()
        loop.step()
        return time.perf_counter() - t

    spent = collections.defaultdict(float)
    one_step()  # untimed: the first prompt step after warm-up
    fused = min(one_step() for _ in range(steps))
    loop.model.fused = False
    loop.model.kernels = TimedKernels(K, spent)
    by_op = []
    for _ in range(steps):
        spent.clear()
        by_op.append((one_step(), dict(spent)))
    by_op_step, detail = min(by_op, key=lambda s: s[0])
    loop.model.kernels, loop.model.fused = K, True

    c = model.config
    real = tokens * bounds.layer_flops_per_token(c) + bounds.head_flops(c)  # the linears' work
    peak = best_bf16_gflops(threads)
    return {
        "profile": f"prefill{tokens}", "threads": threads, "bf16_gflops": round(peak),
        "fused_step_ms": round(fused * 1e3, 2), "by_op_step_ms": round(by_op_step * 1e3, 2),
        "linear_gflops": round(real / fused / 1e9, 1), "linear_fraction": round(real / fused / 1e9 / peak, 3),
        "bound_fraction": round(tokens / fused / bounds.prefill_bound(c, tokens, peak), 3),
        "detail_ms": {k: round(v * 1e3, 2) for k, v in sorted(detail.items(), key=lambda kv: -kv[1])},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--quant", default=None, choices=["int8", "uint4"])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    print(json.dumps(profile_prefill(args.model, args.dtype, args.quant, args.tokens, args.steps, args.threads)))


if __name__ == "__main__":
    main()
