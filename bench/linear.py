"""Linear kernels against the machine's limits and against torch.

    PYTHONPATH=. python bench/linear.py [--bw 43] [--bf16 915] [--fp32 457] [--quick]
    PYTHONPATH=. python bench/linear.py --glu [--runs 5] [--wtypes bf16]

rows(limits) returns one dict per (shape, wtype): time, GB/s over the packed weight bytes
(scales and zeros included; i8 groups of 64, u4 of 32: quant.DEFAULT_GROUPS), GFLOP/s, `roofline` = the time the limits allow (weight bytes at
bw_gbs, flops at the bf16 peak, or the fp32 peak for f32 weights) over the measured time, and
`vs_torch` = torch time / our time (torch bf16 matmul for bf16/i8/u4, fp32 for f32, 2 threads).
Decode shapes (M = 1 and the batched decode steps M = 8, 32; SmolLM2's, Qwen2-1.5B's gate/up and
down, an 8B-like square) cycle through copies of the weight 8x bigger than the LLC, so each
call streams its weights from DRAM, as in a real decode step.
"""
import argparse

import numpy as np

from bench.timing import best_seconds
from dashinfer_client.dtypes import to_bf16
from dashinfer_client.model.quant import DEFAULT_GROUPS
from dashinfer_server import kernels as K

K.load()  # a bench runs where it was started: nothing to place first

LIMITS = {"bw_gbs": 43.0, "bf16_gflops": 915.0, "fp32_gflops": 457.0}
LLC_BYTES = 32 << 20
THREADS = 2

DECODE = [(576, 1536), (576, 49152), (1536, 17920), (8960, 1536), (4096, 4096)]  # (K, N)
PREFILL = [(576, 1536), (4096, 4096)]
WTYPES = ["bf16", "i8", "i8q", "u4", "u4q", "f32"]


def _group(wtype):
    """The quantization group this runtime converts with by default."""
    return DEFAULT_GROUPS["int8" if wtype[:2] == "i8" else "uint4"]


def _pack(wtype, n, k, rng):
    w = rng.standard_normal((n, k), dtype=np.float32)
    if wtype == "f32":
        return K.pack_linear(w, "f32")
    if wtype == "bf16":
        return K.pack_linear(to_bf16(w), "bf16")
    group = _group(wtype)
    g = k // group
    if wtype[:2] == "i8":
        codes = rng.integers(0, 256, (n, k), dtype=np.uint8)  # i8 and i8q: the same codes
        return K.pack_linear(codes, wtype, group, np.full((n, g), 0.01, np.float32), np.full((n, g), 128.0, np.float32))
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)  # u4: scale codes, zero codes, row scales
    return K.pack_linear(codes, wtype, group, np.full((n, g), 200, np.uint8), np.full((n, g), 128, np.uint8),
                         np.full(n, 5e-5, np.float32))


def _copies(nbytes, cold):
    """How many weight copies make a cycle of 8x the LLC (AMD's L3 keeps part of a cycle only
    a little bigger than itself), or 1 when cache reuse is fine."""
    return max(2, min(256, -(-8 * LLC_BYTES // nbytes))) if cold else 1


def _torch_time(wtype, m, k, n, cold):
    import torch

    torch.set_num_threads(THREADS)
    dt = torch.float32 if wtype == "f32" else torch.bfloat16
    nbytes = n * k * (4 if wtype == "f32" else 2)
    copies = _copies(nbytes, cold)
    ws = [torch.randn(n, k).to(dt) for _ in range(copies)]
    x = torch.randn(m, k).to(dt)
    lin = torch.nn.functional.linear
    with torch.no_grad():
        return best_seconds(lambda i: lin(x, ws[i]), copies, batch=1)


def _row(case, wtype, m, k, n, limits, rng, with_torch):
    packed0 = _pack(wtype, n, k, rng)
    nbytes = packed0.nbytes
    cold = m <= 32
    copies = _copies(nbytes, cold)
    packs = [packed0] + [_pack(wtype, n, k, rng) for _ in range(copies - 1)]
    x = rng.standard_normal((m, k), dtype=np.float32)
    out = np.empty((m, n), np.float32)
    t = best_seconds(lambda i: K.linear(x, packs[i], None, out), copies, batch=1)
    flops = 2.0 * m * n * k
    # bf16 weights take the best bf16 path (AMX tiles where they run); i8/u4 dequantize for vdpbf16ps
    peak = (limits["fp32_gflops"] if wtype == "f32" else
            limits.get("best_bf16_gflops", limits["bf16_gflops"]) if wtype == "bf16" else limits["bf16_gflops"])
    t_bw, t_flop = nbytes / (limits["bw_gbs"] * 1e9), flops / (peak * 1e9)
    row = {
        "case": case, "wtype": wtype, "group": _group(wtype) if wtype not in ("f32", "bf16") else 0, "M": m, "K": k, "N": n, "us": t * 1e6,
        "GB/s": nbytes / t / 1e9, "GFLOP/s": flops / t / 1e9,
        "bound": "bw" if t_bw >= t_flop else "flops", "roofline": max(t_bw, t_flop) / t,
    }
    if with_torch:
        tt = _torch_time(wtype, m, k, n, cold)
        row["torch_us"], row["vs_torch"] = tt * 1e6, tt / t
    return row


def rows(limits: dict, quick: bool = False, with_torch: bool = True, wtypes=WTYPES, ms=(1, 8, 32, 512)) -> list:
    """Every shape x wtype of the brief (or of `wtypes` and the M in `ms`); `limits` has bw_gbs,
    bf16_gflops, fp32_gflops."""
    limits = {**LIMITS, **limits}
    rng = np.random.default_rng(0)
    threads = K.num_threads()
    K.set_num_threads(THREADS)
    try:
        out = []
        for m, shapes in ((1, DECODE), (8, DECODE), (32, DECODE), (512, PREFILL)):
            for k, n in (shapes[:1] if quick else shapes) if m in ms else ():
                for wtype in wtypes:
                    case = f"M={m} [{m}x{k}]x[{k}x{n}]"
                    out.append(_row(case, wtype, m, k, n, limits, rng, with_torch))
                    print_row(out[-1])
        return out
    finally:
        K.set_num_threads(threads)


GLU = [(576, 1536), (1152, 6912)]  # (K, I) of a gated MLP: SmolLM2-135M's, Gemma-3-1B's


def glu_rows(runs: int = 5, m: int = 512, wtype: str = "bf16") -> list:
    """linear_glu at M rows with SiLU and with GELU-tanh on the same weight and input, the two
    alternating run by run (which goes first alternates too); per shape, gelu / silu time of each
    run and their median."""
    rng = np.random.default_rng(0)
    threads = K.num_threads()
    K.set_num_threads(THREADS)
    try:
        out = []
        for k, inter in GLU:
            packed = _pack(wtype, 2 * inter, k, rng)
            x = rng.standard_normal((m, k), dtype=np.float32)
            gate_up, act = np.empty((m, 2 * inter), np.float32), np.empty((m, inter), np.float32)
            ratios = []
            for r in range(runs):
                t = {}
                for name in (("silu", "gelu_tanh") if r % 2 == 0 else ("gelu_tanh", "silu")):
                    t[name] = best_seconds(lambda i: K.linear_glu(x, packed, gate_up, act, act=name),
                                           calls=20, budget=1.0, batch=1)
                ratios.append(t["gelu_tanh"] / t["silu"])
                print(f"M={m} K={k} I={inter} {wtype} run {r}: silu {t['silu'] * 1e3:7.2f} ms  "
                      f"gelu_tanh {t['gelu_tanh'] * 1e3:7.2f} ms  gelu/silu {ratios[-1]:.3f}", flush=True)
            out.append({"M": m, "K": k, "I": inter, "wtype": wtype, "gelu_over_silu": float(np.median(ratios))})
            print(f"M={m} K={k} I={inter} {wtype}: median gelu/silu {out[-1]['gelu_over_silu']:.3f} "
                  f"over {runs} runs", flush=True)
        return out
    finally:
        K.set_num_threads(threads)


def print_row(r):
    torch = f"  torch {r['torch_us']:9.1f} us  x{r['vs_torch']:5.2f}" if "torch_us" in r else ""
    print(f"{r['case']:32s} {r['wtype']:4s} {r['us']:9.1f} us  {r['GB/s']:6.1f} GB/s  "
          f"{r['GFLOP/s']:6.1f} GFLOP/s  {100 * r['roofline']:5.1f}% of {r['bound']:5s}{torch}",
          flush=True)


def best_of(runs: list) -> list:
    """Per row, the fastest of several runs (ours and torch each), ratios recomputed."""
    out = []
    for same in zip(*runs):
        best = dict(min(same, key=lambda r: r["us"]))  # its GB/s, GFLOP/s, roofline come along
        if "torch_us" in best:
            best["torch_us"] = min(r["torch_us"] for r in same)
            best["vs_torch"] = best["torch_us"] / best["us"]
        out.append(best)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bw", type=float, default=LIMITS["bw_gbs"], help="read bandwidth, GB/s")
    ap.add_argument("--bf16", type=float, default=LIMITS["bf16_gflops"], help="bf16 dot peak, GFLOP/s")
    ap.add_argument("--fp32", type=float, default=LIMITS["fp32_gflops"], help="fp32 FMA peak, GFLOP/s")
    ap.add_argument("--quick", action="store_true", help="first shape of each M only")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--runs", type=int, default=1, help="repeat and keep each row's best (busy machines)")
    ap.add_argument("--wtypes", default=",".join(WTYPES), help="comma-separated weight types")
    ap.add_argument("--m", default="1,8,32,512", help="comma-separated M of the cases to run")
    ap.add_argument("--glu", action="store_true",
                    help="only linear_glu at M=512: GELU-tanh against SiLU, interleaved (--runs, default 5)")
    a = ap.parse_args()
    print(f"isa {K.isa()}, {THREADS} threads")
    if a.glu:
        glu_rows(runs=max(a.runs, 5), wtype=a.wtypes.split(",")[0] if a.wtypes != ",".join(WTYPES) else "bf16")
    else:
        limits = {"bw_gbs": a.bw, "bf16_gflops": a.bf16, "fp32_gflops": a.fp32}
        picked = dict(wtypes=a.wtypes.split(","), ms=[int(m) for m in a.m.split(",")])
        runs = [rows(limits, a.quick, not a.no_torch, **picked) for _ in range(a.runs)]
        if a.runs > 1:
            print(f"best of {a.runs} runs:")
            for r in best_of(runs):
                print_row(r)
