"""transformers + torch on bench/engine.py's workloads: the reference row of bench/server_table.py.

    python bench/hf_generate.py MODEL_DIR [--threads N] [--workloads prefill512,decode1,batch8]

The model in bf16, greedy `generate` on random prompts of the workload's token counts (eos
ignored: min_new_tokens = max_new_tokens), torch on N threads. One JSON line per workload:
prefill512 counts prompt tokens over one generate of 1 new token; decode workloads count the
tokens after each request's first over the time past a 1-token generate of the same prompts.
Then torch's bf16 matmul at 2048^3 (best of 5), the peak the issue compares against.
"""
import argparse
import json
import time

from bench.engine import WORKLOADS


def timed_generate(model, ids, new: int) -> float:
    import torch
    t = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                       min_new_tokens=new, pad_token_id=0)
    return time.perf_counter() - t


def workload(model, name, vocab) -> dict:
    import torch
    requests = WORKLOADS[name]
    prompt, new = requests[0]
    assert all(r == requests[0] for r in requests), f"{name}: prompts of one length only"
    ids = torch.randint(3, vocab, (len(requests), prompt), generator=torch.Generator().manual_seed(0))
    first = timed_generate(model, ids, 1)
    if new == 1:
        return {"workload": name, "tok_s": round(len(requests) * prompt / first, 1), "seconds": round(first, 2)}
    total = timed_generate(model, ids, new)
    return {"workload": name, "tok_s": round(len(requests) * (new - 1) / (total - first), 1),
            "seconds": round(total, 2), "first_token_s": round(first, 2)}


def matmul_gflops(n: int = 2048) -> float:
    import torch
    a, b = torch.randn(n, n, dtype=torch.bfloat16), torch.randn(n, n, dtype=torch.bfloat16)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(5))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--workloads", default="prefill512,decode1,batch8")
    args = parser.parse_args()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    if args.threads:
        torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16).eval()
    versions = {"transformers": transformers.__version__, "torch": torch.__version__, "threads": torch.get_num_threads()}
    # one untimed generate first: torch's first calls create its kernels (oneDNN primitives)
    timed_generate(model, torch.randint(3, model.config.vocab_size, (1, 64)), 2)
    for name in args.workloads.split(","):
        print(json.dumps({**workload(model, name, model.config.vocab_size), **versions}), flush=True)
    print(json.dumps({"torch_matmul": "bf16 2048^3", "gflops": round(matmul_gflops(), 1), **versions}), flush=True)


if __name__ == "__main__":
    main()
