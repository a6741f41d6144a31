"""Attention sinks (gpt-oss: one learned logit per query head joins each softmax's denominator)
against the float64 reference of tests/test_attention.py, which follows transformers' gpt-oss eager
attention (the sink concatenated to the scores, softmaxed, dropped): with and without a sliding
window, GQA groups, decode and prefill tiles, contexts split over threads and merged, a rank's
partial groups, on every ISA path this CPU has and every cache format."""
import numpy as np
import pytest

from dashinfer_server import kernels as K
from tests.test_attention import FORMATS, assert_matches, make_step, run
from tests.test_attention_partial_groups import assert_rank_matches, run_rank_heads


def sinks_for(n_heads, seed):
    """Sink logits around the scores' own size (scores ~N(0, 1) after the scale), one far above
    them (the sink takes nearly all the weight) and one far below (it takes none)."""
    s = np.random.default_rng(seed).normal(0.5, 1.5, n_heads).astype(np.float32)
    s[0], s[-1] = 30.0, -30.0
    return s


CASES = {
    # decode rows (decode tiles over several kv heads), prefill chunks after a prefix, GQA 4
    "mixed_d64_g4_bs16": dict(seqs=[(1, 1), (1, 17), (5, 40), (33, 100), (1, 300)], n_kv=2, group=4,
                              d=64, bs=16),
    # gpt-oss-20b's shape: 64 query heads over 8 kv heads, head_dim 64, a sliding window of 128
    "gpt_oss_window_d64_g8_bs32": dict(seqs=[(1, 40), (1, 129), (1, 700), (60, 300)], n_kv=8,
                                       group=8, d=64, bs=32, window=128),
    # long contexts split over the threads (partials merged), with and without a window
    "split_decode_d64_g8_bs32": dict(seqs=[(1, 4096), (2, 1500)], n_kv=2, group=8, d=64, bs=32),
    "split_window_d128_g4_bs32": dict(seqs=[(1, 3000), (3, 3000)], n_kv=1, group=4, d=128, bs=32,
                                      window=1000),
    # head_dim 48: the plain-C tile on every path
    "odd_d48_g2_bs32": dict(seqs=[(2, 70), (1, 33), (30, 90)], n_kv=2, group=2, d=48, bs=32, window=20),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_sinks_match_reference(isa, fmt, case):
    c = CASES[case]
    args, ref = make_step(fmt, **c, sinks=sinks_for(c["n_kv"] * c["group"], len(case)))
    shape = {k: v for k, v in c.items() if k != "window"}
    assert_matches(isa, fmt, run(args, threads=2), ref, **shape)
    # the sinks change the answer (else the test above proves nothing about them)
    plain = make_step(fmt, **c)[1]
    assert np.abs(plain - ref).max() > 0.1


@pytest.mark.parametrize("fmt", ["fp32", "int8"])
def test_sinks_of_a_ranks_partial_groups(isa, fmt):
    """A tensor-parallel rank's heads [2, 7) of 2 groups of 4: its slice of the sinks."""
    c = dict(seqs=[(1, 2100), (2, 700), (20, 60)], n_kv=2, group=4, d=64, bs=16, window=500)
    sinks = sinks_for(8, 3)
    args, ref = make_step(fmt, **c, sinks=sinks)
    out = run_rank_heads(dict(args, sinks=np.ascontiguousarray(sinks[2:7])), 4, 2, 7)
    assert_rank_matches(fmt, out, ref[:, 2:7])


def test_bad_sinks_are_refused_and_out_untouched():
    args, _ = make_step("fp32", seqs=[(2, 20), (1, 5)], n_kv=2, group=2, d=64, bs=16)
    out = np.full(args["q"].shape, 7.0, np.float32)
    with pytest.raises(ValueError, match="sinks has size 3 in dimension 0"):
        K.attention(out=out, **args, sinks=np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="sinks must be float32"):
        K.attention(out=out, **args, sinks=np.zeros(4, np.float64))
    assert np.all(out == 7.0)
