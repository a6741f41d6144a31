"""The scheduler's order replayed without the model: time to first token and throughput of a
workload when every step lasts what the machine's limits allow, first come first served
(today's steps: decodes in every one) against shortest first with aging, each with and without
prompt-only steps (DASHINFER_PROMPT_STEP_TOKENS); the default is shortest first with them.

    python bench/schedule.py [--model PATH] [--workloads serve32] [--max-prefill 0]
        [--bw 73 --peak 1050] [--token-ms 0 --decode-ms 0] [--arrivals-per-s 0]

Each step's chunks come from the real Scheduler; the step lasts max(weight bytes / bw, its rows'
flops / bf16 peak) (bench/bounds.py: a step reads every weight once and is otherwise
compute-bound; the output head runs for sampled rows only), or, calibrated, max(weight bytes /
bw, prompt tokens * --token-ms + decode rows * --decode-ms) with the costs an engine step
measured; its sampled rows get their tokens at its end. On a host shared with other
work the engine's own timings swing by 2x from one run to the next; this replay gives the
same figures every time, so the ratio between two orders is the scheduler's alone
(bench/engine.py --baseline-env DASHINFER_MAX_WAIT_STEPS=0 measures the same pair on the engine).
Without --bw/--peak the limits are measured (bench/machine.py). --arrivals-per-s > 0 spreads
the requests' arrivals (a fixed pseudo-random Poisson sequence) instead of all at once.
"""
import argparse
import json
import os
import random
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import bounds  # noqa: E402
from bench.engine import WORKLOADS  # noqa: E402
from dashinfer_server.block_pool import BlockPool  # noqa: E402
from dashinfer_server.model import DEFAULT_STEP_TOKENS  # noqa: E402
from dashinfer_server.scheduler import MAX_WAIT_STEPS, PROMPT_STEP_TOKENS, Scheduler  # noqa: E402
from dashinfer_server.sequence import Phase, Sequence  # noqa: E402


def replay(requests, arrivals, step_seconds, max_step_tokens, max_wait_steps, prompt_step_tokens) -> dict:
    """Serve `requests` [(prompt, new)] arriving at `arrivals` seconds -> TTFT and throughput."""
    sched = Scheduler(BlockPool(10**6, 16), len(requests), max_step_tokens, max_wait_steps, prompt_step_tokens)
    seqs = [Sequence(list(range(i << 20, (i << 20) + p)), p + n) for i, (p, n) in enumerate(requests)]
    order = sorted(range(len(seqs)), key=lambda i: arrivals[i])
    now, steps, first, last = 0.0, 0, {}, {}
    while order or sched.has_work():
        while order and arrivals[order[0]] <= now:
            sched.add(seqs[order.pop(0)])
        if not sched.has_work():
            now = arrivals[order[0]]
            continue
        chunks, interrupted = sched.schedule()
        assert not interrupted
        decodes = sum(c.seq.phase == Phase.DECODE for c in chunks)
        now += step_seconds(sum(c.count for c in chunks), sum(c.sample for c in chunks), decodes)
        steps += 1
        sched.advance(chunks)
        for c in chunks:
            if c.sample:
                c.seq.tokens.append(0)
                first.setdefault(c.seq, now)
                last[c.seq] = now
                if len(c.seq.tokens) >= c.seq.max_length:
                    sched.finish(c.seq)
    assert all(s.phase == Phase.DONE for s in seqs)
    ttft = [first[s] - arrivals[i] for i, s in enumerate(seqs)]
    new_tokens = sum(n for _, n in requests)
    return {"ttft_ms": round(statistics.median(ttft) * 1e3, 1),
            "ttft_p99_ms": round(statistics.quantiles(ttft, n=100, method="inclusive")[98] * 1e3, 1),
            "ttft_max_ms": round(max(ttft) * 1e3, 1),
            "total_tok_s": round(new_tokens / (max(last.values()) - min(arrivals)), 1), "steps": steps}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--workloads", default="serve32")
    parser.add_argument("--max-prefill", type=int, default=0, help="max_prefill_length (0: the engine's)")
    parser.add_argument("--bw", type=float, default=0, help="GB/s (0: measured)")
    parser.add_argument("--peak", type=float, default=0, help="bf16 GFLOP/s (0: measured)")
    parser.add_argument("--threads", type=int, default=2, help="threads the limits are measured with")
    parser.add_argument("--arrivals-per-s", type=float, default=0.0)
    parser.add_argument("--max-wait-steps", type=int, default=MAX_WAIT_STEPS,
                        help="the default order's aging bound (DASHINFER_MAX_WAIT_STEPS)")
    parser.add_argument("--prompt-step-tokens", type=int, default=PROMPT_STEP_TOKENS,
                        help="the default's prompt-only steps (DASHINFER_PROMPT_STEP_TOKENS)")
    parser.add_argument("--token-ms", type=float, default=0.0,
                        help="measured cost of a prompt token in a step (0: flops at the bf16 peak)")
    parser.add_argument("--decode-ms", type=float, default=0.0,
                        help="measured cost of a decode row in a step (0: flops at the bf16 peak)")
    args = parser.parse_args()
    from bench import models
    model = models.load(args.model, "bfloat16", None, None)
    nbytes, flops = bounds.weight_bytes_per_token(model), bounds.flops_per_token(model.config)
    head = bounds.head_flops(model.config)  # only sampled rows run it
    bw, peak = args.bw, args.peak
    if not bw or not peak:
        from bench.machine import best_bf16_gflops, read_bandwidth
        bw, peak = bw or read_bandwidth(args.threads), peak or best_bf16_gflops(args.threads)

    def step_seconds(rows, sampled, decodes):
        if args.token_ms and args.decode_ms:
            compute = ((rows - decodes) * args.token_ms + decodes * args.decode_ms) / 1e3
        else:
            compute = (rows * (flops - head) + sampled * head) / (peak * 1e9)
        return max(nbytes / (bw * 1e9), compute)

    for name in args.workloads.split(","):
        requests = WORKLOADS[name]
        step_tokens = max(args.max_prefill or DEFAULT_STEP_TOKENS, len(requests) + 1)
        rng = random.Random(0)
        arrivals, t = [], 0.0
        for _ in requests:
            arrivals.append(t)
            t += rng.expovariate(args.arrivals_per_s) if args.arrivals_per_s else 0.0
        runs = {label: replay(requests, arrivals, step_seconds, step_tokens, wait, prompt_steps)
                for label, wait, prompt_steps in (
                    ("fifo", 0, 0), ("fifo_prompt_steps", 0, args.prompt_step_tokens),
                    ("shortest_first", args.max_wait_steps, 0),
                    ("default", args.max_wait_steps, args.prompt_step_tokens))}
        # the bound holds for requests arriving together only
        prompts = [p for p, _ in requests]
        if args.token_ms:  # the measured cost of a prompt token, as flops at the peak
            per_token, once = args.token_ms / 1e3 * peak * 1e9, 0.0
        else:
            per_token, once = flops, head
        bound = None if args.arrivals_per_s else round(bounds.ttft_bound_ms(prompts, per_token, peak, once), 1)
        print(json.dumps({
            "workload": name, "model": os.path.basename(args.model.rstrip("/")), "bw_gbs": round(bw, 1),
            "bf16_gflops": round(peak), "token_ms": args.token_ms, "decode_ms": args.decode_ms,
            "max_step_tokens": step_tokens, "prompt_step_tokens": args.prompt_step_tokens,
            "max_wait_steps": args.max_wait_steps, "arrivals_per_s": args.arrivals_per_s,
            **runs, "ttft_bound_ms": bound,
            "over_fifo": {label: {k: round(r[k] / runs["fifo"][k], 3) for k in
                                  ("ttft_ms", "ttft_p99_ms", "total_tok_s")}
                          for label, r in runs.items() if label != "fifo"}}), flush=True)


if __name__ == "__main__":
    main()
