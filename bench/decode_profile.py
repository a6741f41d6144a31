"""Where a decode step's time goes, kernel by kernel: what `bench/engine.py --profile` prints (see
its docstring for the flags)."""
import collections
import functools
import time

from bench.engine import TimedKernels, greedy, runtime_builder, timed_call


def profile_decode(model_spec, dtype, quant, group_size, threads, by_op, kv_mode, rows=1, prompt_len=32,
                   steps=100, regions=None, sampling=None):
    """Where a decode step of `rows` requests goes after prompts of `prompt_len` tokens: the
    ModelLoop stepped in this thread (no loop thread), every kernel call and every loop stage
    timed -> ms per step. regions: None, or a callable -> the process's OpenMP parallel regions
    so far (bench/step_overhead.py), to count them per step and per kernel. sampling: None
    (greedy), or generation options that sample (e.g. {"temperature": 0.7, "top_p": 0.8})."""
    import numpy as np

    import dashinfer_server.model_loop as loop_module
    from bench import models
    from dashinfer_server import kernels as K
    from dashinfer_server.request import ModelLimits, new_request

    model = models.load(model_spec, dtype, quant, group_size)
    cfg = (runtime_builder(model).model_name("profile").max_batch(rows)
           .max_length(prompt_len + steps + 8).thread_num(threads).kv_cache_mode(kv_mode).build())
    K.load()
    K.set_num_threads(threads)
    loop = loop_module.ModelLoop(model, cfg)
    loop.load()
    loop.model.fused = not by_op
    loop.warm_up()
    spent = collections.defaultdict(float)
    timed = functools.partial(timed_call, spent)
    rng = np.random.default_rng(0)
    gen = greedy(prompt_len + steps + 4, sampling)
    seqs = [new_request(rng.integers(3, model.config.vocab_size, prompt_len).tolist(), dict(gen.build()),
                        ModelLimits(model.config.vocab_size, cfg.max_length, loop.block_capacity))
            for _ in range(rows)]
    for seq in seqs:
        loop.scheduler.add(seq)
    while min(seq.num_generated for seq in seqs) < 2:  # the prompts (in chunks) and a first decode, untimed
        loop.step()
    counted = collections.Counter()
    loop.model.kernels = TimedKernels(K, spent, "kernel ", regions, counted)
    build_plan = loop_module.build_plan
    loop_module.build_plan = timed("loop plan", build_plan)
    loop.model.group.step = timed("loop broadcast", loop.model.group.step)
    loop.scheduler.schedule = timed("loop schedule", loop.scheduler.schedule)
    loop.scheduler.advance = timed("loop advance", loop.scheduler.advance)
    loop.sampler.sample = timed("loop sample", loop.sampler.sample)
    loop.postprocess = timed("loop postprocess", loop.postprocess)
    forward = loop.model.forward
    loop.model.forward = timed("forward", forward)
    regions_before = regions() if regions else 0
    t = time.perf_counter()
    for _ in range(steps):
        loop.step()
    step = (time.perf_counter() - t) / steps
    regions_per_step = (regions() - regions_before) / steps if regions else None
    loop.model.kernels = K
    loop_module.build_plan = build_plan
    per_step = {k: v / steps * 1e3 for k, v in spent.items()}
    kernels = sum(v for k, v in per_step.items() if k.startswith("kernel "))
    loop_parts = sum(v for k, v in per_step.items() if k.startswith("loop "))
    return {
        "profile": f"decode, {rows} rows", "weights": dtype + (f"-{quant}" if quant else ""), "threads": threads,
        "context": prompt_len + 2, "kv_cache_mode": kv_mode,
        "step_ms": round(step * 1e3, 3),
        "kernels_ms": round(kernels, 3),
        "forward_python_ms": round(per_step["forward"] - kernels, 3),
        "loop_python_ms": round(loop_parts, 3),
        "step_rest_ms": round(step * 1e3 - per_step["forward"] - loop_parts, 3),
        "detail_ms": {k: round(v, 3) for k, v in sorted(per_step.items(), key=lambda kv: -kv[1])
                      if k != "forward"},
        "layers": model.config.num_hidden_layers,
        "parallel_regions_per_step": regions_per_step,
        "parallel_regions_by_kernel": {k: round(v / steps, 2) for k, v in counted.items()} if regions else None,
    }
