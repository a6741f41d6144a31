"""Paged GQA attention and kv_write against float64 numpy references, on every ISA path."""
import numpy as np
import pytest

from dashinfer_client.dtypes import from_bf16
from dashinfer_server import kernels as K
from tests.helpers import kernel_threads

FORMATS = ("fp32", "bf16", "int8", "uint4")
# fp32 and bf16 caches are read with fp32 math: only rounding separates them from the reference;
# int8 and uint4 take q and the softmax weights as int16 (errors far below the cache's own), except
# in the tiles of low_precision_rows
TOLERANCE = {"fp32": (1e-5, 1e-6), "bf16": (1e-5, 1e-6), "int8": (1e-3, 1e-4), "uint4": (1e-3, 1e-4)}


def empty_cache(fmt, num_blocks, n_kv, bs, d, rng):
    """Cache arrays filled with garbage (NaN where it can be) so reads of unwritten slots show."""
    shape = (num_blocks, n_kv, bs, d)
    extra = {}
    if fmt == "fp32":
        kc = np.full(shape, np.nan, np.float32)
        vc = kc.copy()
    elif fmt == "bf16":
        kc = np.full(shape, 0x7FC0, np.uint16)  # bf16 NaN
        vc = kc.copy()
    elif fmt == "int8":
        kc = rng.integers(-128, 128, shape, dtype=np.int8)
        vc = kc.copy()
    else:
        kc = rng.integers(0, 256, shape[:3] + (d // 2,), dtype=np.uint8)
        vc = kc.copy()
    if fmt in ("int8", "uint4"):
        extra["k_scale"] = np.full(shape[:3], np.nan, np.float32)
        extra["v_scale"] = np.full(shape[:3], np.nan, np.float32)
    if fmt == "uint4":
        extra["k_zero"] = np.full(shape[:3], np.nan, np.float32)
        extra["v_zero"] = np.full(shape[:3], np.nan, np.float32)
    return kc, vc, extra


def to_rows(fmt, which, cache):
    """A cache array in token order [num_blocks, n_kv, bs, head_dim] (uint4: codes 0..15), undoing
    the slice layout of native/kv_cache_layout.h."""
    nb, h, bs = cache.shape[:3]
    if fmt == "uint4":
        d = cache.shape[3] * 2
        if which == "k":  # bytes [bs/16][D/8][16][4]: d = 8j + b low nibble, 8j + 4 + b high
            b = cache.reshape(nb, h, bs // 16, d // 8, 16, 4)
            codes = np.stack([b & 15, b >> 4], axis=4)  # [.., j, 16, lo/hi, 4]
            return codes.transpose(0, 1, 2, 5, 3, 4, 6).reshape(nb, h, bs, d)
        # bytes [bs/4][D/16][8][4]: token 4Q + r, d = 16c + k low nibble, 16c + 8 + k high
        b = cache.reshape(nb, h, bs // 4, d // 16, 8, 4)
        codes = np.stack([b & 15, b >> 4], axis=4)  # [.., c, lo/hi, 8, 4]
        return codes.transpose(0, 1, 2, 6, 3, 4, 5).reshape(nb, h, bs, d)
    d = cache.shape[3]
    if which == "k" and fmt == "fp32":  # [bs/16][D][16]
        return cache.reshape(nb, h, bs // 16, d, 16).swapaxes(3, 4).reshape(nb, h, bs, d)
    if which == "k":  # [bs/16][D/2][16][2]
        return cache.reshape(nb, h, bs // 16, d // 2, 16, 2).transpose(0, 1, 2, 4, 3, 5) \
            .reshape(nb, h, bs, d)
    if fmt == "int8":  # [bs/2][D][2]
        return cache.reshape(nb, h, bs // 2, d, 2).swapaxes(3, 4).reshape(nb, h, bs, d)
    return cache


def dequant(fmt, which, cache, scale=None, zero=None):
    """The cache as float64 [num_blocks, n_kv, bs, head_dim], decoded as the kernels do."""
    rows = to_rows(fmt, which, cache)
    if fmt == "fp32":
        return rows.astype(np.float64)
    if fmt == "bf16":
        return from_bf16(rows).astype(np.float64)
    if fmt == "int8":
        return rows.astype(np.float64) * scale[..., None]
    return (rows.astype(np.float64) - zero[..., None]) * scale[..., None]


def reference(q, kd, vd, tables, q_offsets, ctx, scale, group, window=0, softcap=0.0, sinks=None):
    """Causal attention per sequence, gathering K/V through the block table, in float64; window:
    the query at position p sees p - window < j <= p (transformers' sliding_window_overlay);
    softcap: scores become softcap * tanh(score / softcap) before the mask (Gemma 2's eager);
    sinks [n_heads]: gpt-oss's eager, each head's sink logit concatenated to its scores, the
    softmax taken, the sink's column dropped."""
    bs = kd.shape[2]
    out = np.zeros(q.shape, np.float64)
    for b in range(len(ctx)):
        rows = slice(q_offsets[b], q_offsets[b + 1])
        ql = q_offsets[b + 1] - q_offsets[b]
        if ql == 0:
            continue
        pos = np.arange(ctx[b])
        blk = tables[b, pos // bs]
        k = kd[blk, :, pos % bs].repeat(group, axis=1)  # [ctx, n_heads, d]
        v = vd[blk, :, pos % bs].repeat(group, axis=1)
        s = np.einsum("qhd,khd->hqk", q[rows].astype(np.float64), k) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        limit = ctx[b] - ql + np.arange(ql)
        hidden = pos[None, :] > limit[:, None]
        if window:
            hidden |= pos[None, :] <= limit[:, None] - window
        s[:, hidden] = -np.inf
        if sinks is not None:
            s = np.concatenate([s, np.broadcast_to(sinks[:, None, None], s.shape[:2] + (1,))], axis=-1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[rows] = np.einsum("hqk,khd->qhd", p[..., : ctx[b]], v)
    return out


def make_step(fmt, seqs, n_kv, group, d, bs, seed=0, window=0, softcap=0.0, sinks=None):
    """A batch step: seqs = [(q_len, context_len)]. Writes every sequence's K/V through kv_write
    into shuffled blocks, returns (args for attention, float64 reference output). sinks: float32
    [n_kv * group] or None."""
    rng = np.random.default_rng(seed)
    n_heads = n_kv * group
    need = [(c + bs - 1) // bs for _, c in seqs]
    num_blocks = sum(need) + 3
    ids = rng.permutation(num_blocks)
    max_blocks = max(need) + 1
    tables = np.full((len(seqs), max_blocks), -1, np.int32)
    slots, start = [], 0
    for b, (_, c) in enumerate(seqs):
        tables[b, : need[b]] = ids[start : start + need[b]]
        start += need[b]
        pos = np.arange(c)
        slots.append(tables[b, pos // bs] * bs + pos % bs)
    slots = np.concatenate(slots).astype(np.int32)
    kc, vc, extra = empty_cache(fmt, num_blocks, n_kv, bs, d, rng)
    k = rng.standard_normal((len(slots), n_kv, d)).astype(np.float32)
    v = rng.standard_normal((len(slots), n_kv, d)).astype(np.float32)
    K.kv_write(k, v, slots, kc, vc, **extra)
    q_offsets = np.concatenate([[0], np.cumsum([ql for ql, _ in seqs])]).astype(np.int32)
    ctx = np.array([c for _, c in seqs], np.int32)
    q = rng.standard_normal((q_offsets[-1], n_heads, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    kd = dequant(fmt, "k", kc, extra.get("k_scale"), extra.get("k_zero"))
    vd = dequant(fmt, "v", vc, extra.get("v_scale"), extra.get("v_zero"))
    ref = reference(q, kd, vd, tables, q_offsets, ctx, scale, group, window, softcap,
                    None if sinks is None else sinks.astype(np.float64))
    args = dict(q=q, k_cache=kc, v_cache=vc, block_tables=tables, q_offsets=q_offsets,
                context_lens=ctx, scale=scale, window=window, softcap=softcap, **extra)
    if sinks is not None:
        args["sinks"] = sinks
    return args, ref


def low_precision_rows(isa, fmt, seqs, n_kv, group, d, bs):
    """Rows the vector tiles compute with 8-bit-mantissa products, and the error bounds they get
    (max and rms error, relative to the rms of the reference): the AVX-512 prefill tile of bf16,
    int8 and uint4 caches rounds q and the softmax weights to bf16, as bf16 attention does (the
    int8 / uint4 codes themselves are exact in bf16); the uint4 decode tiles (AVX-512, AVX2)
    quantize q and the weights to 8 bits, an order of magnitude below the 4-bit cache's own
    error."""
    decode = np.array([ql * group <= 8 for ql, _ in seqs for _ in range(ql)], bool)
    low = np.zeros_like(decode)
    if d % 32:
        return low, None
    if isa == "avx512" and fmt != "fp32":
        low |= ~decode
    if fmt == "uint4" and isa in ("avx2", "avx512"):
        low |= decode
    bounds = (0.1, 0.02) if fmt == "uint4" else (0.05, 0.005)
    return low, bounds


def run(args, threads=None):
    """The kernel's output (NaN where it writes nothing), on `threads` threads if given."""
    out = np.full(args["q"].shape, np.nan, np.float32)
    with kernel_threads(threads or K.num_threads()):
        K.attention(out=out, **args)
    return out


def assert_matches(isa, fmt, out, ref, seqs, n_kv, group, d, bs):
    """out against the reference within the format's bounds, and those of the rows the tiles
    compute with 8-bit mantissas (low_precision_rows)."""
    rtol, atol = TOLERANCE[fmt]
    low, bounds = low_precision_rows(isa, fmt, seqs, n_kv, group, d, bs)
    np.testing.assert_allclose(out[~low], ref[~low], rtol=rtol, atol=atol)
    if low.any():
        got, want = out[low], ref[low]
        scale = np.sqrt(np.mean(want**2))
        np.testing.assert_allclose(got, want, rtol=0, atol=bounds[0] * scale)
        assert np.sqrt(np.mean((got - want) ** 2)) < bounds[1] * scale


CASES = {
    # decode rows, context 1, prefill chunks after a prefix, lengths crossing block boundaries
    "mixed_d64_g3_bs16": dict(seqs=[(1, 1), (1, 17), (5, 40), (16, 16), (1, 300), (33, 100)],
                              n_kv=3, group=3, d=64, bs=16),
    "prefill_d128_g4_bs64": dict(seqs=[(100, 230), (1, 129), (64, 64), (0, 5)],
                                 n_kv=2, group=4, d=128, bs=64),
    "batch37_d64_g1_bs16": dict(seqs=[(1 + (i % 3 == 0) * (i % 7), 1 + 23 * i % 150)
                                      for i in range(37)], n_kv=4, group=1, d=64, bs=16),
    # one long context: the kernel splits it across threads and merges the partials
    "split_decode_d128_g4_bs16": dict(seqs=[(1, 2100)], n_kv=1, group=4, d=128, bs=16),
    "split_prefill_d64_g3_bs64": dict(seqs=[(3, 3000)], n_kv=1, group=3, d=64, bs=64),
    # decode tiles over several kv heads, split, with two causal rows; more heads than one tile takes
    "split_heads_d64_g2_bs32": dict(seqs=[(1, 3000), (2, 700)], n_kv=4, group=2, d=64, bs=32),
    "many_heads_d32_g4_bs16": dict(seqs=[(1, 100), (1, 40), (2, 17)], n_kv=20, group=4, d=32,
                                   bs=16),
    "odd_d48_g2_bs32": dict(seqs=[(2, 70), (1, 33)], n_kv=2, group=2, d=48, bs=32),
    # SmolLM2's prefill: 21-row tiles of 63 vectors, 32-token blocks, a chunk after a prefix
    "prefill_d64_g3_bs32": dict(seqs=[(150, 150), (37, 101)], n_kv=3, group=3, d=64, bs=32),
    # 4096 tokens of context: decode of the Qwen2-1.5B and SmolLM2 head shapes, the last prefill
    # chunk of a 4096-token prompt
    "long_decode_d128_g6_bs32": dict(seqs=[(1, 4096)], n_kv=2, group=6, d=128, bs=32),
    "long_decode_d64_g3_bs32": dict(seqs=[(1, 4096), (1, 4001)], n_kv=3, group=3, d=64, bs=32),
    "long_prefill_d128_g6_bs32": dict(seqs=[(64, 4096)], n_kv=2, group=6, d=128, bs=32),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_reference(isa, fmt, case):
    args, ref = make_step(fmt, **CASES[case])
    assert_matches(isa, fmt, run(args, threads=2), ref, **CASES[case])


def test_attention_single_thread_equals_two(isa):
    args, _ = make_step("int8", **CASES["split_decode_d128_g4_bs16"])
    np.testing.assert_allclose(run(args, threads=1), run(args, threads=2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_kv_write_quantization_error(isa, fmt):
    rng = np.random.default_rng(1)
    n_kv, bs, d, t = 2, 16, 64, 40
    kc, vc, extra = empty_cache(fmt, 4, n_kv, bs, d, rng)
    k = (rng.standard_normal((t, n_kv, d)) * rng.uniform(0.1, 10, (t, n_kv, 1))).astype(np.float32)
    v = rng.standard_normal((t, n_kv, d)).astype(np.float32)
    k[3, 1] = 0.0  # all-zero and constant vectors have no range
    v[4, 0] = 2.5
    slots = rng.permutation(4 * bs)[:t].astype(np.int32)
    slots[7] = -1  # padding: skipped
    K.kv_write(k, v, slots, kc, vc, **extra)
    keep = slots >= 0
    blk, off = slots[keep] // bs, slots[keep] % bs
    for x, cache, name in ((k, kc, "k"), (v, vc, "v")):
        got = dequant(fmt, name, cache, extra.get(name + "_scale"), extra.get(name + "_zero"))
        got = got[blk, :, off]  # [t_kept, n_kv, d]
        want = x[keep].astype(np.float64)
        if fmt == "fp32":
            bound = 0.0  # stored as is
        elif fmt == "bf16":
            bound = np.abs(want) * 2.0**-8
        else:
            bound = extra[name + "_scale"][blk, :, off][..., None] / 2 * (1 + 1e-5) + 1e-7
        assert np.all(np.abs(got - want) <= bound)
    if fmt in ("int8", "uint4"):
        # the padded token's slot was never written
        untouched = np.isnan(extra["k_scale"]).sum()
        assert untouched == 4 * bs * n_kv - keep.sum() * n_kv


def test_two_python_threads_at_once():
    import threading

    args, ref = make_step("bf16", **CASES["split_decode_d128_g4_bs16"])
    results = [None] * 4

    def work(i):
        results[i] = run(args)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_allclose(r, ref, rtol=1e-3, atol=3e-5)


# ---- bad arguments: each raises a clear exception and the process survives


def _good(fmt="int8"):
    args, _ = make_step(fmt, seqs=[(2, 20), (1, 5)], n_kv=2, group=2, d=64, bs=16)
    args["out"] = np.zeros(args["q"].shape, np.float32)
    return args


def _with(fmt="int8", **change):
    args = _good(fmt)
    args.update(change)
    return args


BAD_ATTENTION = {
    "q float64": (TypeError, "q must be float32",
                  lambda a: dict(q=a["q"].astype(np.float64))),
    "cache float64": (TypeError, "k_cache must be",
                      lambda a: dict(k_cache=a["k_cache"].astype(np.float64))),
    "v_cache dtype differs": (TypeError, "v_cache must be int8",
                              lambda a: dict(v_cache=a["v_cache"].astype(np.float32))),
    "scale for fp32": (TypeError, "k_scale must be None",
                       lambda a: dict(k_cache=a["k_cache"].astype(np.float32),
                                      v_cache=a["v_cache"].astype(np.float32))),
    "missing k_scale": (TypeError, "k_scale is required",
                        lambda a: dict(k_scale=None)),
    "zero for int8": (TypeError, "k_zero must be None",
                      lambda a: dict(k_zero=a["k_scale"])),
    "block id out of range": (IndexError, "block_tables",
                              lambda a: dict(block_tables=np.where(a["block_tables"] >= 0, 999,
                                                                   -1).astype(np.int32))),
    "context too long": (ValueError, "does not fit",
                         lambda a: dict(context_lens=np.array([20, 500], np.int32))),
    "context shorter than chunk": (ValueError, "less than",
                                   lambda a: dict(context_lens=np.array([1, 5], np.int32))),
    "q_offsets not matching T": (ValueError, "q_offsets",
                                 lambda a: dict(q_offsets=np.array([0, 2, 2], np.int32))),
    "q_offsets decreasing": (ValueError, "q_offsets",
                             lambda a: dict(q_offsets=np.array([0, 4, 3], np.int32))),
    "heads not divisible": (ValueError, "multiple of the 2 kv heads",
                            lambda a: dict(q=np.zeros((3, 3, 64), np.float32),
                                           out=np.zeros((3, 3, 64), np.float32))),
    "head_dim mismatch": (ValueError, "k_cache",
                          lambda a: dict(q=np.zeros((3, 4, 32), np.float32),
                                         out=np.zeros((3, 4, 32), np.float32))),
    "out shape": (ValueError, "out", lambda a: dict(out=np.zeros((3, 4, 32), np.float32))),
    "non-contiguous q": (ValueError, "C-contiguous",
                         lambda a: dict(q=np.zeros((3, 4, 128), np.float32)[:, :, ::2])),
    "scale shape": (ValueError, "k_scale",
                    lambda a: dict(k_scale=a["k_scale"][:-1].copy())),
    "out aliases q": (ValueError, "overlap", lambda a: dict(out=a["q"])),
    "read-only out": (ValueError, "writable", lambda a: dict(out=_readonly(a["out"]))),
}


def _readonly(x):
    x = x.copy()
    x.flags.writeable = False
    return x


@pytest.mark.parametrize("case", list(BAD_ATTENTION))
def test_attention_bad_arguments(case):
    exc, msg, change = BAD_ATTENTION[case]
    args = _good()
    args.update(change(args))
    with pytest.raises(exc, match=msg):
        K.attention(**args)


def test_kv_write_bad_arguments():
    rng = np.random.default_rng(0)
    kc, vc, extra = empty_cache("uint4", 2, 2, 16, 64, rng)
    k = np.zeros((3, 2, 64), np.float32)
    slots = np.array([0, 5, 31], np.int32)
    K.kv_write(k, k, slots, kc, vc, **extra)  # the good call works
    with pytest.raises(IndexError, match="slots\\[2\\] = 32"):
        K.kv_write(k, k, np.array([0, 5, 32], np.int32), kc, vc, **extra)
    with pytest.raises(TypeError, match="k_zero is required"):
        K.kv_write(k, k, slots, kc, vc, k_scale=extra["k_scale"], v_scale=extra["v_scale"])
    with pytest.raises(TypeError, match="slots must be int32"):
        K.kv_write(k, k, slots.astype(np.int64), kc, vc, **extra)
    with pytest.raises(ValueError, match="kv heads"):
        K.kv_write(np.zeros((3, 1, 64), np.float32), np.zeros((3, 1, 64), np.float32), slots,
                   kc, vc, **extra)
    with pytest.raises(ValueError, match="writable"):
        K.kv_write(k, k, slots, _readonly(kc), vc, **extra)
    with pytest.raises(TypeError, match="k_scale must be None"):
        bc, bv, _ = empty_cache("bf16", 2, 2, 16, 64, rng)
        K.kv_write(k, k, slots, bc, bv, k_scale=extra["k_scale"])
    with pytest.raises(ValueError, match="v has size"):
        K.kv_write(k, k[:2], slots, kc, vc, **extra)
