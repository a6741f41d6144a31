"""Sliding-window attention and the attention logit soft-cap (Mistral, Qwen2, Gemma 2/3, Phi-3)
against the float64 reference of tests/test_attention.py, on every ISA path and cache format (a
tensor-parallel rank's partial GQA groups: test_attention_partial_groups.py); and that a window's
tiles never touch the blocks wholly before it."""
import ctypes
import mmap
import subprocess
import sys

import numpy as np
import pytest

from dashinfer_server import kernels as K
from tests.test_attention import (FORMATS, assert_matches, dequant, empty_cache, make_step,
                                  reference, run)

CASES = {
    # decode rows with contexts shorter than, equal to and past a window that is not a multiple
    # of the block
    "decode_d64_g3_bs16_w37": dict(seqs=[(1, 5), (1, 37), (1, 38), (1, 300)], n_kv=3, group=3,
                                   d=64, bs=16, window=37),
    # prefill chunks after a prefix, one longer than the window, beside decode rows
    "mixed_d64_g3_bs32_w40": dict(seqs=[(50, 300), (33, 33), (1, 64), (5, 90), (100, 100)],
                                  n_kv=3, group=3, d=64, bs=32, window=40),
    # a window inside one block, and a window of the query's own token only
    "small_d128_g4_bs64_w5": dict(seqs=[(1, 200), (70, 200), (3, 3)], n_kv=2, group=4, d=128,
                                  bs=64, window=5),
    "own_token_d64_g2_bs16_w1": dict(seqs=[(1, 50), (20, 40)], n_kv=2, group=2, d=64, bs=16,
                                     window=1),
    "whole_blocks_d64_g2_bs32_w64": dict(seqs=[(1, 65), (1, 64), (40, 129)], n_kv=2, group=2,
                                         d=64, bs=32, window=64),
    # a window as long as the longest context (then no window at all), and one past it
    "window_is_context": dict(seqs=[(1, 20), (10, 30)], n_kv=2, group=2, d=64, bs=16, window=30),
    "window_past_context": dict(seqs=[(1, 20), (10, 30)], n_kv=2, group=2, d=64, bs=16,
                                window=1000),
    # long contexts split over the threads: Qwen2-1.5B's heads decoding at 4096, a prefill chunk
    "split_decode_d128_g6_bs32_w1000": dict(seqs=[(1, 4096), (1, 1500)], n_kv=2, group=6, d=128,
                                            bs=32, window=1000),
    "split_prefill_d64_g3_bs64_w700": dict(seqs=[(3, 3000)], n_kv=1, group=3, d=64, bs=64,
                                           window=700),
    # decode tiles over several kv heads, two causal rows
    "kv_heads_d64_g2_bs32_w100": dict(seqs=[(1, 3000), (2, 700), (1, 50)], n_kv=4, group=2, d=64,
                                      bs=32, window=100),
    # the soft-cap alone (scores ~N(0, 1): a cap of 0.8 bends most of them), and with a window
    # as Gemma 2's local layers have both
    "softcap_d64_g2_bs16": dict(seqs=[(1, 17), (5, 40), (33, 100), (1, 2100)], n_kv=2, group=2,
                                d=64, bs=16, softcap=0.8),
    "softcap_window_d128_g4_bs32": dict(seqs=[(1, 300), (40, 200), (1, 4096)], n_kv=2, group=4,
                                        d=128, bs=32, window=96, softcap=1.5),
    # head_dim 48: the plain-C tile on every path
    "odd_d48_g2_bs32": dict(seqs=[(2, 70), (1, 33), (30, 90)], n_kv=2, group=2, d=48, bs=32,
                            window=20, softcap=1.0),
}


def _shape(case):
    return {k: v for k, v in case.items() if k not in ("window", "softcap")}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_window_and_softcap_match_reference(isa, fmt, case):
    args, ref = make_step(fmt, **CASES[case])
    assert_matches(isa, fmt, run(args, threads=2), ref, **_shape(CASES[case]))


BAD = {
    "negative window": (dict(window=-1), "window must be >= 0"),
    "negative softcap": (dict(softcap=-1.0), "softcap must be finite and >= 0"),
    "infinite softcap": (dict(softcap=float("inf")), "softcap must be finite"),
    "NaN softcap": (dict(softcap=float("nan")), "softcap must be finite"),
    "softcap past float32": (dict(softcap=1e39), "softcap must be finite"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_window_or_softcap_is_refused_and_out_untouched(case):
    change, msg = BAD[case]
    args, _ = make_step("bf16", seqs=[(2, 20), (1, 5)], n_kv=2, group=2, d=64, bs=16)
    out = np.full(args["q"].shape, 7.0, np.float32)
    with pytest.raises(ValueError, match=msg):
        K.attention(out=out, **dict(args, **change))
    assert np.all(out == 7.0)
    with pytest.raises(TypeError):
        K.attention(out=out, **dict(args, window=2.5))


# ---- the blocks wholly before a window are never read: they lie in pages with no access, so a
# read is a segmentation fault (in a child process, which the test then sees die)

GUARD = dict(n_kv=2, group=4, d=128, bs=32, ctx=4096, window=512)


def _page_aligned_like(a):
    """A copy of `a` in its own anonymous mapping (page-aligned), and the mapping."""
    m = mmap.mmap(-1, max(a.nbytes, 1))
    b = np.frombuffer(m, a.dtype, a.size).reshape(a.shape)
    b[...] = a
    return b, m


def _protect(a, nbytes, prot):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if libc.mprotect(a.ctypes.data, nbytes, prot):
        raise OSError(ctypes.get_errno(), "mprotect")


def guarded_reads_child():
    """Run in a child: decode and a 40-row prefill chunk at context 4096 with a window of 512,
    every ISA path and format, 2 threads (the decode alone splits its window), with the cache
    pages of the blocks before the first row's window made inaccessible."""
    K.load()
    g = GUARD
    n_kv, bs, d, ctx, w = g["n_kv"], g["bs"], g["d"], g["ctx"], g["window"]
    rng = np.random.default_rng(3)
    blocks = ctx // bs
    table = np.arange(blocks, dtype=np.int32)[None]  # block j of the context is block id j
    page = mmap.PAGESIZE
    isas = ("portable", "avx2", "avx512")
    for isa in isas[: isas.index(K.supported_isa()) + 1]:
        K.set_isa(isa)
        for fmt in FORMATS:
            kc, vc, extra = empty_cache(fmt, blocks, n_kv, bs, d, rng)
            arrays = {"k_cache": kc, "v_cache": vc, **extra}
            maps = []
            for name, a in arrays.items():
                arrays[name], m = _page_aligned_like(a)
                maps.append(m)
            k = rng.standard_normal((ctx, n_kv, d)).astype(np.float32)
            v = rng.standard_normal((ctx, n_kv, d)).astype(np.float32)
            K.kv_write(k, v, np.arange(ctx, dtype=np.int32), **arrays)
            kd = dequant(fmt, "k", arrays["k_cache"], arrays.get("k_scale"), arrays.get("k_zero"))
            vd = dequant(fmt, "v", arrays["v_cache"], arrays.get("v_scale"), arrays.get("v_zero"))
            for seqs in ([(1, ctx)], [(1, ctx), (40, ctx)]):
                first = min(c - ql for ql, c in seqs)
                before = (first - w + 1) // bs  # blocks wholly before every row's window
                tables = np.repeat(table, len(seqs), axis=0)
                q_offsets = np.cumsum([0] + [ql for ql, _ in seqs]).astype(np.int32)
                lens = np.array([c for _, c in seqs], np.int32)
                q = rng.standard_normal((q_offsets[-1], n_kv * g["group"], d)).astype(np.float32)
                scale = 1 / np.sqrt(d)
                ref = reference(q, kd, vd, tables, q_offsets, lens, scale, g["group"], w)
                guarded = {n: before * a[0].nbytes // page * page for n, a in arrays.items()}
                assert guarded["k_cache"] > 0
                for n, a in arrays.items():
                    _protect(a, guarded[n], 0)  # PROT_NONE
                out = run(dict(q=q, block_tables=tables, q_offsets=q_offsets, context_lens=lens,
                               scale=scale, window=w, **arrays), threads=2)
                for n, a in arrays.items():
                    _protect(a, guarded[n], mmap.PROT_READ | mmap.PROT_WRITE)
                assert_matches(isa, fmt, out, ref, seqs, n_kv, g["group"], d, bs)
    print("guarded reads ok")


def test_blocks_before_the_window_are_never_read():
    child = subprocess.run([sys.executable, "-c", "import tests.test_attention_window as t; "
                            "t.guarded_reads_child()"], capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, (child.returncode, child.stderr[-3000:])
    assert "guarded reads ok" in child.stdout
