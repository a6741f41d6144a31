"""Attention microbenchmark: decode against the memory bandwidth, prefill chunks in GFLOP/s,
both against torch SDPA doing the same math with 2 threads.

    PYTHONPATH=. python bench/attention.py [--quick] [--block 32,64,128]
        [--shape smollm2,llama] [--batch 1,16] [--ctx 1024,4096] [--fmt fp32,bf16,int8,uint4]
        [--only decode|prefill] [--no-torch] [--small-pages] [--contiguous] [--isa avx2]
        [--window 512] [--json FILE]

Decode figures are against the streaming read bandwidth (bench/machine.py) measured just before
each (shape, batch, context) group of rows: this host's bandwidth drifts from minute to minute.
Decode streams from DRAM, not cache: every timed call reads KV blocks that the previous calls
did not touch. The cache holds several disjoint sets of blocks (each a random block table over a
shuffled pool, together >= 4x the 32 MiB L3) and the calls rotate through them; torch gets as many
separate contiguous copies, rotated the same way. The caches are allocated as the engine does:
anonymous mmap with MADV_HUGEPAGE (--small-pages: 4 KiB pages, to see what huge pages buy).
--contiguous gives each sequence consecutive blocks (what a fresh pool hands out) instead of
shuffled ones: the gap between the two is what the scattered reads cost, not the arithmetic.
--window W times every decode row twice, with a sliding window of W and without, and prints
the ratio of the times beside the ratio of the bytes each reads (the blocks from the one that
holds the window's start; the blocks before it are shared by all rotations, as they are never
read) and the windowed bytes' time at the measured bandwidth.
"""
import argparse
import mmap
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on our cores

import numpy as np  # noqa: E402

from bench.timing import best_seconds  # noqa: E402
from dashinfer_server import kernels as K  # noqa: E402
from dashinfer_server.kv_cache import bytes_per_block  # noqa: E402

K.load()  # a bench runs where it was started: nothing to place first

# n_heads, n_kv_heads, head_dim
SHAPES = {"smollm2": (9, 3, 64), "qwen2-1.5b": (12, 2, 128), "llama": (32, 8, 128)}
FORMATS = ("fp32", "bf16", "int8", "uint4")
BLOCK = 32  # the engine's default kv_cache_span_size
L3_BYTES = 32 << 20
THREADS = 2


def _bytes_per_token_head(fmt, d):
    """KV cache bytes read per token and kv head, K and V together (scales included)."""
    return bytes_per_block(fmt, 1, 1, 1, d)


def _pages_zeros(shape, dtype, huge):
    """Zeroed array in its own anonymous mapping, with transparent huge pages when asked."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    m = mmap.mmap(-1, max(n, 1))
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(m, dtype, int(np.prod(shape))).reshape(shape)


def _fill(a, pattern):
    """`a` filled with `pattern` repeated: random-looking GiB-sized caches in little time."""
    flat = a.reshape(-1)
    for i in range(0, flat.size, pattern.size):
        flat[i:i + pattern.size] = pattern[: flat.size - i]


def _cache(fmt, num_blocks, n_kv, bs, d, rng, huge):
    shape = (num_blocks, n_kv, bs, d)
    meta = shape[:3]
    extra = {}
    n = 1 << 20
    if fmt == "fp32":
        kc, vc = (_pages_zeros(shape, np.float32, huge) for _ in range(2))
        pattern = rng.standard_normal(n).astype(np.float32)
    elif fmt == "bf16":
        kc, vc = (_pages_zeros(shape, np.uint16, huge) for _ in range(2))
        bits = rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16
        pattern = bits.astype(np.uint16)
    elif fmt == "int8":
        kc, vc = (_pages_zeros(shape, np.int8, huge) for _ in range(2))
        pattern = rng.integers(-127, 128, n).astype(np.int8)
    else:
        kc, vc = (_pages_zeros(shape[:3] + (d // 2,), np.uint8, huge) for _ in range(2))
        pattern = rng.integers(0, 256, n).astype(np.uint8)
    _fill(kc, pattern)
    _fill(vc, pattern[::-1].copy())
    if fmt in ("int8", "uint4"):
        for name in ("k_scale", "v_scale"):
            extra[name] = _pages_zeros(meta, np.float32, huge)
            extra[name][...] = 0.015
    if fmt == "uint4":
        for name in ("k_zero", "v_zero"):
            extra[name] = _pages_zeros(meta, np.float32, huge)
            extra[name][...] = 7.5
    return kc, vc, extra


def _best(call, rotations):
    """Fastest call over 3 cycles of `rotations` calls, after a pause: the other library's
    OpenMP threads spin for a while after its last call, and would take the cores."""
    return best_seconds(call, rotations, calls=3 * rotations, batch=1, pause=0.3)


def _torch_time(q_len, ctx, batch, n_heads, n_kv, d, dtype, rotations, prefix_mask):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(THREADS)
    g = torch.Generator().manual_seed(0)
    qs = [torch.randn(batch, n_heads, q_len, d, generator=g).to(dtype) for _ in range(rotations)]
    ks = [torch.randn(batch, n_kv, ctx, d, generator=g).to(dtype) for _ in range(rotations)]
    vs = [torch.randn(batch, n_kv, ctx, d, generator=g).to(dtype) for _ in range(rotations)]
    mask = None
    if prefix_mask and q_len > 1:  # the chunk's queries sit at the end of the context
        pos = torch.arange(ctx)
        mask = pos[None, :] <= (ctx - q_len + torch.arange(q_len))[:, None]
    causal = q_len > 1 and mask is None

    def call(i):
        r = i % rotations
        F.scaled_dot_product_attention(qs[r], ks[r], vs[r], attn_mask=mask, is_causal=causal,
                                       enable_gqa=True)

    with torch.inference_mode():
        return _best(call, max(rotations, 4))


def _window_start(ctx, window, bs):
    """First position a decode row at the end of ctx reads with this window (attention.c)."""
    return 0 if not window or ctx <= window else (ctx - window) // bs * bs


def _step(fmt, batch, q_len, ctx, n_heads, n_kv, d, bs, rotations, rng, huge, contiguous=False,
          window=0):
    """Cache with `rotations` random block tables, disjoint where a decode row reads them (all
    of them without a window), and the attention call for each."""
    per_seq = (ctx + bs - 1) // bs
    shared = _window_start(ctx, window, bs) // bs  # blocks before the window: never read
    num_blocks = shared * batch + (per_seq - shared) * batch * rotations
    kc, vc, extra = _cache(fmt, num_blocks, n_kv, bs, d, rng, huge)
    ids = np.arange(num_blocks) if contiguous else rng.permutation(num_blocks)
    ids = ids.astype(np.int32)
    ids = np.concatenate([np.broadcast_to(ids[: shared * batch].reshape(1, batch, shared),
                                          (rotations, batch, shared)),
                          ids[shared * batch:].reshape(rotations, batch, per_seq - shared)], 2)
    q = rng.standard_normal((batch * q_len, n_heads, d)).astype(np.float32)
    out = np.empty_like(q)
    q_offsets = (np.arange(batch + 1) * q_len).astype(np.int32)
    ctx_lens = np.full(batch, ctx, np.int32)
    scale = 1.0 / np.sqrt(d)

    def call(i):
        K.attention(q, kc, vc, ids[i % rotations], q_offsets, ctx_lens, out, scale, **extra,
                    window=window)

    return call


def _windowed_row(whole: dict, n_heads, n_kv, d, window, rng, huge, contiguous):
    """The decode row `whole` again with a sliding window, printed against it."""
    batch, ctx, bs, fmt, bw = (whole[k] for k in ("batch", "ctx", "block", "fmt", "bw_gbs"))
    read = ctx - _window_start(ctx, window, bs)
    kv_bytes = batch * read * n_kv * _bytes_per_token_head(fmt, d)
    rot = max(2, -(-4 * L3_BYTES // kv_bytes))
    call = _step(fmt, batch, 1, ctx, n_heads, n_kv, d, bs, rot, rng, huge, contiguous, window)
    t = _best(call, 4 * rot)
    del call
    gbs, whole_s = kv_bytes / t / 1e9, whole["ms"] / 1e3
    label = f"  window {window}: {read} of {ctx} tokens read"
    print(f"{label:48s} {t * 1e3:8.3f} {gbs:7.1f} {gbs / bw:6.0%}   time {t / whole_s:.3f}x "
          f"whole, bytes {read / ctx:.3f}x; windowed bytes at {bw:.1f} GB/s: "
          f"{kv_bytes / bw / 1e6:.3f} ms", flush=True)
    return dict(whole, window=window, ms=t * 1e3, gbs=gbs, of_bw=gbs / bw, bytes=kv_bytes,
                vs_whole=t / whole_s, vs_torch_f32=None, vs_torch_bf16=None)


def _load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def rows(limits: dict, quick: bool = False, blocks=(BLOCK,), shapes=tuple(SHAPES),
         batches=(1, 16), ctxs=(1024, 4096), formats=FORMATS, only=None, torch=True,
         huge=True, measure_bw=None, contiguous=False, window=0):
    """measure_bw: a function giving GB/s now, called before each group of decode rows (None:
    limits["bw_gbs"] throughout). window: each decode row also with this sliding window."""
    bw = limits["bw_gbs"]
    K.set_num_threads(THREADS)
    rng = np.random.default_rng(0)
    result = []
    print(f"attention ({K.isa()}, {THREADS} threads, bandwidth {bw:.1f} GB/s, "
          f"{'huge' if huge else '4 KiB'} pages, {'contiguous' if contiguous else 'shuffled'} "
          f"blocks; torch columns = torch time / ours; {_load()})")
    print(f"{'case':48s} {'ms':>8s} {'GB/s':>7s} {'of bw':>6s} {'GFLOP/s':>8s} "
          f"{'torch f32':>9s} {'torch bf16':>10s}")
    t32 = t16 = float("nan")
    for name in shapes:
        n_heads, n_kv, d = SHAPES[name]
        for batch in batches if only != "prefill" else ():
            for ctx in ctxs:
                if quick and (batch, ctx) != (1, 4096):
                    continue
                if measure_bw:
                    bw = measure_bw()
                    print(f"bandwidth {bw:.1f} GB/s", flush=True)
                if torch:
                    torch_rot = max(2, -(-4 * L3_BYTES // (batch * ctx * n_kv * d * 8)))
                    t32 = _torch_time(1, ctx, batch, n_heads, n_kv, d, _dtype("f32"), torch_rot,
                                      False)
                    t16 = _torch_time(1, ctx, batch, n_heads, n_kv, d, _dtype("bf16"),
                                      torch_rot, False)
                for bs in blocks:
                    for fmt in formats:
                        kv_bytes = batch * ctx * n_kv * _bytes_per_token_head(fmt, d)
                        rot = max(2, -(-4 * L3_BYTES // kv_bytes))
                        call = _step(fmt, batch, 1, ctx, n_heads, n_kv, d, bs, rot, rng, huge,
                                     contiguous)
                        t = _best(call, 4 * rot)
                        del call
                        gbs = kv_bytes / t / 1e9
                        row = dict(kind="decode", shape=name, batch=batch, ctx=ctx, block=bs,
                                   fmt=fmt, ms=t * 1e3, gbs=gbs, bw_gbs=bw, of_bw=gbs / bw,
                                   vs_torch_f32=t32 / t, vs_torch_bf16=t16 / t)
                        result.append(row)
                        label = f"decode {name} b={batch} ctx={ctx} bs={bs} {fmt}"
                        print(f"{label:48s} {t * 1e3:8.3f} {gbs:7.1f} {gbs / bw:6.0%} "
                              f"{'':>8s} {t32 / t:9.2f} {t16 / t:10.2f}", flush=True)
                        if window:
                            result.append(_windowed_row(row, n_heads, n_kv, d, window, rng,
                                                        huge, contiguous))
        for prefix in (0, 1536) if only != "decode" else ():
            q_len = 512
            ctx = prefix + q_len
            # causal work: query at position p reads p + 1 keys; QK^T and PV are 2 flops each
            keys = sum(range(prefix + 1, ctx + 1))
            flops = 4.0 * n_heads * d * keys
            if torch:
                t32 = _torch_time(q_len, ctx, 1, n_heads, n_kv, d, _dtype("f32"), 1, True)
                t16 = _torch_time(q_len, ctx, 1, n_heads, n_kv, d, _dtype("bf16"), 1, True)
            for bs in blocks:
                for fmt in formats:
                    if quick and fmt != "bf16":
                        continue
                    t = _best(_step(fmt, 1, q_len, ctx, n_heads, n_kv, d, bs, 1, rng, huge,
                                    contiguous), 2)
                    row = dict(kind="prefill", shape=name, batch=1, ctx=ctx, prefix=prefix,
                               block=bs, fmt=fmt, ms=t * 1e3, gflops=flops / t / 1e9,
                               vs_torch_f32=t32 / t, vs_torch_bf16=t16 / t)
                    result.append(row)
                    label = f"prefill {name} 512 after {prefix} bs={bs} {fmt}"
                    print(f"{label:48s} {t * 1e3:8.3f} {'':>7s} {'':>6s} {flops / t / 1e9:8.1f} "
                          f"{t32 / t:9.2f} {t16 / t:10.2f}", flush=True)
    print(_load())
    return result


def _dtype(name):
    import torch

    return torch.float32 if name == "f32" else torch.bfloat16


def _main():
    from bench.machine import read_bandwidth

    def ints(s):
        return tuple(int(x) for x in s.split(","))

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="decode at batch 1 and context 4096 only (other --batch/--ctx rows are skipped), prefill in bf16")
    p.add_argument("--block", type=ints, default=(BLOCK,))
    p.add_argument("--shape", default=",".join(SHAPES))
    p.add_argument("--batch", type=ints, default=(1, 16))
    p.add_argument("--ctx", type=ints, default=(1024, 4096))
    p.add_argument("--fmt", default=",".join(FORMATS))
    p.add_argument("--only", choices=("decode", "prefill"))
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--small-pages", action="store_true")
    p.add_argument("--contiguous", action="store_true", help="consecutive blocks per sequence")
    p.add_argument("--bw", type=float, help="GB/s to compare with (default: measured now)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--isa", help="kernel path to time (default: the best this CPU runs)")
    p.add_argument("--window", type=int, default=0,
                   help="also time each decode row with this sliding window, against the whole")
    a = p.parse_args()
    if a.isa:
        K.set_isa(a.isa)
    bw = a.bw or read_bandwidth(THREADS)
    result = rows({"bw_gbs": bw}, quick=a.quick, blocks=a.block, shapes=a.shape.split(","),
                  batches=a.batch, ctxs=a.ctx, formats=a.fmt.split(","), only=a.only,
                  torch=not a.no_torch, huge=not a.small_pages, contiguous=a.contiguous,
                  window=a.window,
                  measure_bw=None if a.bw else lambda: read_bandwidth(THREADS))
    if a.json:
        import json

        with open(a.json, "w") as f:
            json.dump({"bw_gbs": bw, "load": os.getloadavg(), "rows": result}, f, indent=1)


if __name__ == "__main__":
    _main()
