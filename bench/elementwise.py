"""Elementwise kernels at decode (M=1) and prefill (M=512) shapes: time per call, GB/s moved,
and the share of the machine's memory bandwidth; plus what a call costs Python at M=1.

    PYTHONPATH=. python bench/elementwise.py [--threads 2] [--bw-gbs 43]

Decode-sized operands sit in L1/L2, so their GB/s can exceed the DRAM figure: for them the
time per call (mostly call overhead) is the number that matters.
"""
import argparse

import numpy as np

from bench.timing import best_seconds
from dashinfer_server import kernels as K

K.load()  # a bench runs where it was started: nothing to place first
from dashinfer_server.rope import rope_table

DEFAULT_LIMITS = {"bw_gbs": 43.0}
MODELS = {
    "smollm2": dict(hidden=576, heads=9, kv_heads=3, head_dim=64, inter=1536),
    "llama7b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=11008),
}
TOKENS = (("decode", 1), ("prefill", 512))


def seconds_per_call(fn) -> float:
    """Best of 30 batches of ~0.5 ms of calls: decode-sized calls are too short to time alone."""
    return best_seconds(lambda i: fn(), calls=30)


def _cases(cfg: dict, M: int):
    """(kernel, call, bytes moved) for one model shape at M tokens."""
    rng = np.random.default_rng(0)
    N, I, D = cfg["hidden"], cfg["inter"], cfg["head_dim"]
    H, Hk = cfg["heads"], cfg["kv_heads"]
    x = rng.standard_normal((M, N), dtype=np.float32)
    res = rng.standard_normal((M, N), dtype=np.float32)
    w = rng.standard_normal(N, dtype=np.float32)
    out = np.empty_like(x)
    q = rng.standard_normal((M, H, D), dtype=np.float32)
    k = rng.standard_normal((M, Hk, D), dtype=np.float32)
    pos = np.arange(M, dtype=np.int32)
    cs = rope_table(D, D, 10000.0, None, max(M, 8192))
    gate_up = rng.standard_normal((M, 2 * I), dtype=np.float32)
    act = np.empty((M, I), np.float32)
    return [
        # reads x and residual, writes residual and out
        ("rms_norm+residual", lambda: K.rms_norm(x, w, 1e-5, out, res), (4 * M * N + N) * 4),
        # reads and writes q and k, reads one cos/sin row per token
        ("rope", lambda: K.rope(q, k, pos, cs), (2 * M * (H + Hk) * D + M * D) * 4),
        ("glu_mul silu", lambda: K.glu_mul(gate_up, act), 3 * M * I * 4),
        ("glu_mul gelu_tanh", lambda: K.glu_mul(gate_up, act, act="gelu_tanh"), 3 * M * I * 4),
    ]


def _overhead_rows() -> list:
    """The smallest call of each kernel: what Python and argument checks cost per call."""
    one = np.ones((1, 16), np.float32)
    w, out, res = np.ones(16, np.float32), np.empty((1, 16), np.float32), np.zeros((1, 16), np.float32)
    q, pos, cs = np.ones((1, 1, 16), np.float32), np.zeros(1, np.int32), np.ones((1, 16), np.float32)
    gate_up, ids, table = np.ones((1, 32), np.float32), np.zeros(1, np.int32), np.ones((4, 16), np.float32)
    calls = [
        ("K.isa() (no arguments)", K.isa),
        ("rms_norm M=1 N=16", lambda: K.rms_norm(one, w, 1e-5, out)),
        ("rms_norm+residual M=1 N=16", lambda: K.rms_norm(one, w, 1e-5, out, res)),
        ("rope T=1 heads=1 D=16", lambda: K.rope(q, None, pos, cs)),
        ("glu_mul M=1 I=16", lambda: K.glu_mul(gate_up, out)),
        ("embedding T=1 D=16", lambda: K.embedding(ids, table, out)),
    ]
    return [{"kernel": "overhead", "case": name, "us": seconds_per_call(fn) * 1e6}
            for name, fn in calls]


def rows(limits: dict | None = None) -> list:
    limits = {**DEFAULT_LIMITS, **(limits or {})}
    bw = limits["bw_gbs"]
    result = []
    print(f"isa {K.isa()}, {K.num_threads()} threads, memory bandwidth {bw:.1f} GB/s")
    print(f"{'kernel':<18} {'model':<8} {'phase':<8} {'M':>4} {'us/call':>9} {'GB/s':>7} {'% bw':>6}")
    for model, cfg in MODELS.items():
        for phase, M in TOKENS:
            for kernel, fn, nbytes in _cases(cfg, M):
                sec = seconds_per_call(fn)
                row = {"kernel": kernel, "model": model, "phase": phase, "M": M,
                       "us": sec * 1e6, "gbs": nbytes / sec / 1e9}
                row["pct_bw"] = 100 * row["gbs"] / bw
                result.append(row)
                print(f"{kernel:<18} {model:<8} {phase:<8} {M:>4} {row['us']:>9.2f} "
                      f"{row['gbs']:>7.1f} {row['pct_bw']:>5.0f}%")
    print("call overhead (smallest call, us):")
    for row in _overhead_rows():
        result.append(row)
        print(f"  {row['case']:<28} {row['us']:6.2f}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bw-gbs", type=float, default=DEFAULT_LIMITS["bw_gbs"])
    args = parser.parse_args()
    K.set_num_threads(args.threads)
    rows({"bw_gbs": args.bw_gbs})


if __name__ == "__main__":
    main()
