"""Sampler benchmark: microseconds per decode step (one Sampler.sample call over a batch).

    PYTHONPATH=. python bench/sampler.py [--vocab 151936] [--steps 100] [--repeats 3] [--batches 1,8,32]

Each request has a 512-token prompt and grows by one token a step. The logits are refreshed from
a fixed random array (normal, sd 2.5: a flat distribution, whose top-p nucleus holds thousands of
tokens) before every call (sample penalizes them in place); that copy is timed apart and
subtracted. The fastest of --steps x --repeats steps (bench/timing.py). The draw runs on the
kernels' threads (OMP_NUM_THREADS, default every core), a row each.
"""
import argparse
import json

import numpy as np

from bench.timing import best_seconds
from dashinfer_client.generation_config import check_generation
from dashinfer_server import kernels as K
from dashinfer_server.sampler import Sampler
from dashinfer_server.sequence import Sequence

PENALTIES = dict(repetition_penalty=1.1, presence_penalty=0.5, no_repeat_ngram_size=3,
                 min_length=600, eos_token_id=[0, 1])
CONFIGS = {
    "greedy": dict(do_sample=False),
    "greedy+penalties": dict(do_sample=False, **PENALTIES),
    "top_k=50,top_p=0.8": dict(top_k=50, top_p=0.8, temperature=0.7),
    "top_k=50,top_p=0.8+penalties": dict(top_k=50, top_p=0.8, temperature=0.7, **PENALTIES),
    "top_k=50,top_p=0.8+logprobs(5)": dict(top_k=50, top_p=0.8, temperature=0.7,
                                           logprobs=True, top_logprobs=5),
    "top_k=0,top_p=0.8": dict(top_k=0, top_p=0.8, temperature=0.7),
    "top_k=0,top_p=0.95,T=1": dict(top_k=0, top_p=0.95, temperature=1.0),
    "top_k=0,T=1 (whole vocabulary)": dict(top_k=0, temperature=1.0),
    "top_k=0,min_p=0.05": dict(top_k=0, min_p=0.05, temperature=0.7),
    "greedy+frequency+logit_bias(20)": dict(do_sample=False, frequency_penalty=0.5,
                                            logit_bias={i * 997: -5.0 for i in range(20)}),
}


def step_us(config, batch, vocab, steps, repeats):
    rng = np.random.default_rng(0)
    source = (rng.standard_normal((batch, vocab)) * 2.5).astype(np.float32)
    logits = np.empty_like(source)
    if "logit_bias" in config:  # its ids within a --vocab smaller than theirs
        config = dict(config, logit_bias={i % vocab: bias for i, bias in config["logit_bias"].items()})
    params = check_generation({"max_length": 4096, "seed": 1, **config})
    sampler = Sampler()
    seqs = [Sequence.start(rng.integers(0, vocab, 512).tolist(), params) for _ in range(batch)]
    states = [seq.sampling for seq in seqs]

    def step(i):
        np.copyto(logits, source)
        for seq, token in zip(seqs, sampler.sample(logits, states).ids):
            seq.append(int(token))  # what the engine does after sampling: penalties see it

    copy = best_seconds(lambda i: np.copyto(logits, source), calls=steps * repeats, batch=1)
    return (best_seconds(step, calls=steps * repeats, batch=1) - copy) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,8,32")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    K.load()
    print(f"V={args.vocab}, prompt 512, us per step (per row)")
    print(f"{'config':32s}" + "".join(f"{'B=' + str(b):>18s}" for b in batches))
    for name, config in CONFIGS.items():
        cells = {b: step_us(config, b, args.vocab, args.steps, args.repeats) for b in batches}
        print(f"{name:32s}" + "".join(f"{us:10.0f} ({us / b:4.0f})" for b, us in cells.items()))
        print(json.dumps({"config": name, "vocab": args.vocab,
                          **{f"B{b}_us": round(us, 1) for b, us in cells.items()}}))


if __name__ == "__main__":
    main()
