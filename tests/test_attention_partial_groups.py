"""Attention over a tensor-parallel rank's heads when they start or end inside a GQA group
(shard.py: SmolLM2's 9 heads / 3 KV heads on 2 ranks are heads 0-4 over KV heads 0-1 and heads
5-8 over KV heads 1-2): the rank's heads of the float64 reference, on every ISA path and cache
format, with only the KV heads the rank holds in its cache."""
import numpy as np
import pytest

from dashinfer_server import kernels as K
from dashinfer_server.shard import Shard
from tests.test_attention import FORMATS, TOLERANCE, make_step, run

# (step, heads [h0, h1) of the n_kv * group): decode rows, prefill chunks after a prefix, a
# context long enough to be split over the threads, heads inside a single group
CASES = {
    "smollm2_rank0": (dict(seqs=[(1, 17), (5, 40), (33, 100), (1, 300)], n_kv=3, group=3, d=64, bs=16), (0, 5)),
    "smollm2_rank1": (dict(seqs=[(1, 17), (5, 40), (33, 100), (1, 300)], n_kv=3, group=3, d=64, bs=16), (5, 9)),
    "split_decode_g4": (dict(seqs=[(1, 2100), (2, 700)], n_kv=2, group=4, d=128, bs=16), (2, 7)),
    "inside_one_group": (dict(seqs=[(3, 3000), (1, 50)], n_kv=1, group=6, d=64, bs=32), (1, 4)),
    "prefill_g6": (dict(seqs=[(64, 200)], n_kv=2, group=6, d=128, bs=32), (4, 9)),
    # with a sliding window and the logit soft-cap (test_attention_window.py)
    "smollm2_rank1_window_softcap": (dict(seqs=[(1, 17), (5, 40), (33, 100), (1, 300)], n_kv=3,
                                          group=3, d=64, bs=16, window=40, softcap=1.2), (5, 9)),
    "split_decode_g4_window_softcap": (dict(seqs=[(1, 2100), (2, 700)], n_kv=2, group=4, d=128,
                                            bs=16, window=500, softcap=2.0), (2, 7)),
}


def run_rank_heads(args, group, h0, h1):
    """Attention over only the query heads [h0, h1) of a step (make_step's args), with only the
    KV heads they read in the cache, on 2 threads, as a tensor-parallel rank runs it."""
    k0, k1 = h0 // group, (h1 - 1) // group + 1
    per_kv_head = ("k_cache", "v_cache", "k_scale", "v_scale", "k_zero", "v_zero")  # [blocks, n_kv, ...]
    part = {n: np.ascontiguousarray(a[:, k0:k1]) if n in per_kv_head else a for n, a in args.items()}
    part["q"] = np.ascontiguousarray(args["q"][:, h0:h1])
    return run(dict(part, group=group, q_head0=h0 - k0 * group), threads=2)


def assert_rank_matches(fmt, out, want):
    if fmt == "fp32":
        np.testing.assert_allclose(out, want, rtol=TOLERANCE[fmt][0], atol=TOLERANCE[fmt][1])
        return
    # the tiles a partial group gets may round q and the softmax weights to 8-bit mantissas
    # (test_attention.low_precision_rows): the bounds of those rows
    scale = np.sqrt(np.mean(want**2))
    worst, rms = (0.1, 0.02) if fmt == "uint4" else (0.05, 0.005)
    np.testing.assert_allclose(out, want, rtol=0, atol=worst * scale)
    assert np.sqrt(np.mean((out - want) ** 2)) < rms * scale


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_partial_groups_match_reference(isa, fmt, case):
    step, (h0, h1) = CASES[case]
    args, ref = make_step(fmt, **step)
    assert_rank_matches(fmt, run_rank_heads(args, step["group"], h0, h1), ref[:, h0:h1])


def test_refuses_heads_that_do_not_read_the_cache_heads():
    step, _ = CASES["smollm2_rank0"]
    args, _ = make_step("fp32", **step)  # 3 kv heads in the cache
    out = np.zeros_like(args["q"])
    for heads, q_head0 in (((0, 5), 0), ((0, 9), 1), ((0, 9), 3), ((0, 2), 0)):
        q = np.ascontiguousarray(args["q"][:, heads[0]:heads[1]])
        with pytest.raises(ValueError, match="do not read exactly 3 kv heads"):
            K.attention(**dict(args, q=q, out=out[:, heads[0]:heads[1]].copy()), group=3, q_head0=q_head0)


def test_shard_splits_query_heads_evenly():
    """Each rank's query heads, the KV heads they read, and where the first sits in its group."""
    s0, s1 = (Shard(r, 2, 9, 3, 1536, 49152) for r in range(2))
    assert (s0.heads, s0.kv_heads, s0.q_head0) == ((0, 5), (0, 2), 0)
    assert (s1.heads, s1.kv_heads, s1.q_head0) == ((5, 9), (1, 3), 2)
    qwen = [Shard(r, 2, 12, 2, 8960, 10) for r in range(2)]  # whole groups stay whole
    assert [(s.heads, s.kv_heads, s.q_head0) for s in qwen] == [((0, 6), (0, 1), 0), ((6, 12), (1, 2), 0)]
    three = [Shard(r, 3, 32, 8, 64, 10) for r in range(3)]
    assert [s.heads for s in three] == [(0, 11), (11, 22), (22, 32)]
    assert [(s.kv_heads, s.q_head0) for s in three] == [((0, 3), 0), ((2, 6), 3), ((5, 8), 2)]
