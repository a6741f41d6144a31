"""What quantized weights cost in quality: next-token negative log-likelihood of the default model
(SmolLM2-135M-Instruct) on the text in bench/data/project_docs.txt (this project's README and
design notes, ~4,300 tokens), bf16 weights against int8 and uint4, per group and per channel. The
output head is quantized whenever the layers are, in the model's group, to
dashinfer_server/weights.py HEAD_BITS (int8); the "4-bit head" rows force a uint4 head under uint4
layers, so the head's share of the loss shows.

    PYTHONPATH=. python -m bench.quality [--window 512] [--threads 2]

The text is cut into windows of --window tokens, each a fresh context; every token after a
window's first is predicted. One JSON line per setting: mean NLL (nats/token), perplexity, and
the NLL's change against bf16 in % (targets: int8 within 0.5%, uint4 within 3%), and the packed
weight bytes a decode step streams (all linears and the head) against bf16's. Quantized
settings run twice: `int8-act`, the i8q/u4q kernels (activations quantized to int8 per 32 k,
native/linear.h: what a VNNI CPU runs, and u4 on AVX2; AMX off, whose tiles would take 32 rows
or more in bf16), and `exact` (weights dequantized
exactly, activations fp32), so the cost of the activation quantization shows apart from the
weights'. Each run is its own process.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = os.path.join(ROOT, "bench", "data", "project_docs.txt")
BLOCK = 64
TARGET_PCT = {"int8": 0.5, "uint4": 3.0}  # issue 14: NLL within this much of bf16
# (label, quant, group_size, head bits); group None: this runtime's default group
# (quant.DEFAULT_GROUPS: int8 64, uint4 32); the DashInfer settings: a group_size (64, 128, ...) or
# -1 (per channel, its default); head bits None: weights.HEAD_BITS
SETTINGS = [("bf16", None, None, None), ("int8 g64", "int8", None, None), ("int8 per-channel", "int8", -1, None),
            ("uint4 g32", "uint4", None, None), ("uint4 g32, 4-bit head", "uint4", None, 4),
            ("uint4 g64", "uint4", 64, None), ("uint4 g64, 4-bit head", "uint4", 64, 4),
            ("uint4 per-channel", "uint4", -1, None), ("uint4 per-channel, 4-bit head", "uint4", -1, 4)]


def nll(quant, group_size, head_bits, window, threads, exact) -> dict:
    """In the child: mean next-token NLL over the text, with the model's forward run directly."""
    import numpy as np

    from bench import models
    from dashinfer_server import kernels as K
    from dashinfer_server import weights
    from dashinfer_server.model import DecoderModel
    from dashinfer_server.plan import StepPlan

    if head_bits:
        weights.HEAD_BITS = head_bits
    if exact:  # every weight keeps its exact kernel, whatever this CPU makes faster
        weights.quantized_wtype = lambda wtype, group, activate_quant=False: wtype
    K.load()
    K.set_num_threads(threads)
    if not exact:  # the int8 kernels on every row, not AMX's bf16 tiles from 32 rows
        K.set_amx("off")
    model = models.load("default", "bfloat16", quant, group_size)
    with open(TEXT) as f:
        ids = model.get_tokenizer()(f.read())["input_ids"]
    decoder = DecoderModel(model, "fp32", window // BLOCK, BLOCK, window, window)
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = np.asarray(ids[start:start + window], np.int32)
        w = len(chunk)
        if w < 2:
            break
        rows = np.arange(w, dtype=np.int32)
        plan = StepPlan(chunk, rows, rows, np.array([0, w], np.int32), np.array([w], np.int32),
                        np.arange(window // BLOCK, dtype=np.int32)[None, :], rows)
        logits = decoder.forward(plan)[:w - 1].astype(np.float64)
        top = logits.max(axis=1, keepdims=True)
        logz = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        total += float((logz - logits[np.arange(w - 1), chunk[1:]]).sum())
        count += w - 1
    w = decoder.weights
    streamed = w.lm_head.nbytes + sum(getattr(layer, n).nbytes for layer in w.layers
                                      for n in ("q", "k", "v", "o", "gate_up", "down"))
    return {"tokens": count, "nll": total / count, "bytes_per_token": streamed}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=512, help="tokens per window (a multiple of 64)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        quant = None if args.child[0] == "-" else args.child[0]
        group, head = (None if v == "-" else int(v) for v in args.child[1:3])
        print(json.dumps(nll(quant, group, head, args.window, args.threads, args.child[3] == "exact")))
        return
    from bench.engine import run_child
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base = None
    for label, quant, group, head in SETTINGS:
        for path in (["int8-act", "exact"] if quant else ["bf16"]):
            cmd = [sys.executable, "-m", "bench.quality", "--window", str(args.window), "--threads",
                   str(args.threads), "--child", quant or "-", "-" if group is None else str(group),
                   "-" if head is None else str(head), path]
            result = run_child(cmd, env, f"{label} ({path})")
            base = base or result
            print(json.dumps({"weights": label, "path": path, "tokens": result["tokens"],
                              "nll": round(result["nll"], 4), "perplexity": round(2.718281828 ** result["nll"], 3),
                              "vs_bf16_pct": round(100 * (result["nll"] / base["nll"] - 1), 2),
                              "target_pct": TARGET_PCT.get(quant), "weight_mib_per_token":
                              round(result["bytes_per_token"] / 2**20, 1), "bytes_vs_bf16":
                              round(result["bytes_per_token"] / base["bytes_per_token"], 3)}), flush=True)


if __name__ == "__main__":
    main()
