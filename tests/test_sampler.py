import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from dashinfer_server import kernels as K
from dashinfer_client.generation_config import check_generation
from dashinfer_server.sampler import Sampler
from dashinfer_server.sequence import Sequence


def make_state(prompt, generated=(), **options):
    """The sampler state of a request of `prompt` that has generated `generated`."""
    seq = Sequence.start(prompt, check_generation({"max_length": 4096, **options}))
    for t in generated:
        seq.append(t)
    return seq.sampling


def rand_logits(rng, batch, vocab, scale=3.0):
    return (rng.standard_normal((batch, vocab)) * scale).astype(np.float32)


def dense_probs(row, temperature, top_k, top_p, min_p=0.0):
    """The distribution K.sample draws row's token from."""
    w = np.empty_like(row)
    K.sample_weights(row, temperature, top_k, top_p, min_p, w)
    return w.astype(np.float64) / w.astype(np.float64).sum()


def sample_one(row, u, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    ids = np.empty(1, np.int32)
    K.sample(row[None], np.array([[temperature, top_k, top_p, min_p, u]]), ids)
    return int(ids[0])


def chi_square(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_greedy_batch_is_argmax():
    rng = np.random.default_rng(0)
    logits = rand_logits(rng, 6, 777)
    states = [make_state([1], do_sample=False) for _ in range(6)]
    assert np.array_equal(Sampler().sample(logits.copy(), states).ids, logits.argmax(axis=1))


# ---------------------------------------------------------------------------- selection

@pytest.mark.parametrize("vocab", [100, 49152, 50001])
@pytest.mark.parametrize("k", [1, 50, 128, 129, 2000])
def test_top_k_keeps_exactly_the_k_largest(vocab, k):
    rng = np.random.default_rng(vocab + k)
    x = rand_logits(rng, 1, vocab)[0]
    x[rng.integers(0, vocab, vocab // 3)] = -np.inf
    finite = np.flatnonzero(np.isfinite(x))
    largest = finite[np.argsort(-x[finite])[:k]]
    assert set(np.flatnonzero(dense_probs(x, 1.0, k, 1.0))) == set(largest.tolist())


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (0.7, 50, 0.8), (1.3, 0, 0.9), (1.0, 20, 1.0), (0.5, 0, 1.0), (1.0, 0, 0.3),
    (2.0, 400, 0.95), (1.0, 1, 0.5), (1.0, 0, 0.0), (0.8, 50, 0.0)])  # top_p 0: the most likely token alone
@pytest.mark.parametrize("vocab,scale", [(500, 3.0), (49152, 6.0), (151936, 2.5)])
@pytest.mark.parametrize("min_p", [0.0, 0.02])
def test_sampling_distribution_matches_transformers_warpers(temperature, top_k, top_p, vocab,
                                                            scale, min_p):
    rng = np.random.default_rng(vocab)
    row = rand_logits(rng, 1, vocab, scale)[0]
    scores = torch.from_numpy(row.copy()[None].astype(np.float64))
    warpers = [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k or vocab),
               TopPLogitsWarper(top_p)] + ([MinPLogitsWarper(min_p)] if min_p else [])
    for warper in warpers:
        scores = warper(None, scores)
    ref = torch.softmax(scores, dim=-1)[0].numpy()
    ours = dense_probs(row, temperature, top_k, top_p, min_p)
    # same support, except probabilities below float32's range (< 1e-38) that underflow to 0
    assert not (ours > 0)[ref == 0].any() and (ours > 0)[ref > 1e-30].all()
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-9)


def test_top_p_keeps_exactly_the_nucleus_when_sampling():
    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.01, 0.01])
    # cumulative 0.40, 0.65, 0.80 > 0.75: the nucleus is the first three tokens
    row = np.log(probs).astype(np.float32)
    batch, steps = 200, 100
    states = [make_state([0], seed=s, top_k=0, top_p=0.75) for s in range(batch)]
    counts = np.zeros(8)
    sampler = Sampler()
    for _ in range(steps):
        out = sampler.sample(np.repeat(row[None], batch, axis=0), states)
        counts += np.bincount(out.ids, minlength=8)
    assert counts[3:].sum() == 0
    assert chi_square(counts[:3], probs[:3] / probs[:3].sum()) < 20.0  # df 2: p ~ 5e-5


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_sets_the_predicted_entropy_and_frequencies(temperature):
    row = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], np.float32)
    expected = np.exp(row / temperature) / np.exp(row / temperature).sum()
    probs = dense_probs(row, temperature, 0, 1.0)
    entropy = -(probs * np.log(probs)).sum()
    assert math.isclose(entropy, -(expected * np.log(expected)).sum(), rel_tol=1e-6)
    base = dense_probs(row, 1.0, 0, 1.0)
    assert (entropy > -(base * np.log(base)).sum()) == (temperature > 1)
    states = [make_state([0], seed=s, temperature=temperature, top_k=0) for s in range(100)]
    counts = np.zeros(6)
    for _ in range(100):
        counts += np.bincount(Sampler().sample(np.repeat(row[None], 100, axis=0), states).ids,
                              minlength=6)
    assert chi_square(counts, expected) < 30.0  # df 5: p ~ 1.5e-5


def test_the_draw_inverts_the_cdf_in_token_order_and_never_picks_a_zero_weight():
    rng = np.random.default_rng(4)
    for size in (7, 1000, 49152, 151936):
        w = rng.random(size) + 0.01
        w[rng.random(size) < 0.5] = 0  # -inf logits: weight 0
        with np.errstate(divide="ignore"):
            row = np.log(w).astype(np.float32)
        w = np.exp(row.astype(np.float64) - row.max())  # the kernel's weights, in float64
        cdf = np.cumsum(w)
        for u in np.concatenate((rng.random(100), [0.0, np.nextafter(1.0, 0)])):
            i = sample_one(row, u)
            assert w[i] > 0
            assert cdf[i] - w[i] <= u * cdf[-1] * (1 + 1e-9) and u * cdf[-1] <= cdf[i] * (1 + 1e-9)


@pytest.mark.parametrize("top_k", [3, 50, 300])
def test_top_k_where_fewer_tokens_are_allowed_than_k(top_k):
    """A grammar's mask leaves a few finite logits among -inf: only those are ever drawn."""
    row = np.full(49152, -np.inf, np.float32)
    allowed = [17, 4000, 49151]
    row[allowed] = [0.5, 1.5, 1.0]
    probs = dense_probs(row, 1.0, top_k, 1.0)
    assert set(np.flatnonzero(probs)) == set(allowed[:top_k])
    np.testing.assert_allclose(probs[allowed], np.exp([0.5, 1.5, 1.0]) / np.exp([0.5, 1.5, 1.0]).sum(),
                               rtol=1e-6)


@pytest.mark.parametrize("vocab", [100, 49152])
def test_top_k_ties_keep_the_lower_ids(vocab):
    row = np.zeros(vocab, np.float32)
    row[[9, 60]] = 1.0
    assert set(np.flatnonzero(dense_probs(row, 1.0, 5, 1.0))) == {9, 60, 0, 1, 2}


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_logits_give_a_token_of_the_vocabulary(bad):
    rng = np.random.default_rng(12)
    for top_k, top_p in ((0, 1.0), (0, 0.9), (40, 0.9), (500, 1.0)):
        row = rand_logits(rng, 1, 20000)[0]
        row[rng.integers(0, 20000, 30)] = bad
        assert 0 <= sample_one(row, 0.7, top_k=top_k, top_p=top_p) < 20000


def test_full_vocabulary_sampling_frequencies():
    vocab = 3000
    row = np.full(vocab, -30.0, np.float32)
    hot = [5, 700, 1024, 2999]
    row[hot] = np.log([0.1, 0.2, 0.3, 0.4])
    states = [make_state([0], seed=s, top_k=0) for s in range(100)]
    counts = np.zeros(vocab)
    for _ in range(50):
        counts += np.bincount(Sampler().sample(np.repeat(row[None], 100, axis=0), states).ids,
                              minlength=vocab)
    assert counts.sum() == counts[hot].sum()
    assert chi_square(counts[hot], np.array([0.1, 0.2, 0.3, 0.4])) < 25.0


def test_top_k_sampling_stays_in_the_top_k():
    rng = np.random.default_rng(5)
    row = rand_logits(rng, 1, 49152, 1.0)[0]
    top = set(np.argsort(row)[-50:].tolist())
    states = [make_state([0], seed=s, top_k=50) for s in range(40)]
    seen = set()
    for _ in range(5):
        seen |= set(Sampler().sample(np.repeat(row[None], 40, axis=0), states).ids.tolist())
    assert seen <= top and len(seen) > 25


def test_top_k_1_equals_greedy():
    rng = np.random.default_rng(6)
    logits = rand_logits(rng, 8, 1000)
    states = [make_state([0], seed=s, top_k=1, temperature=0.3 + s) for s in range(8)]
    assert np.array_equal(Sampler().sample(logits.copy(), states).ids, logits.argmax(axis=1))


# ---------------------------------------------------------------------------- seeds

def test_same_seed_same_tokens_alone_and_inside_any_batch():
    rng = np.random.default_rng(7)
    steps, vocab = 16, 2000
    stream = rand_logits(rng, steps, vocab, 1.0)
    mine = dict(seed=1234, top_k=0, top_p=0.95, temperature=1.1, repetition_penalty=1.2)

    alone = make_state([1, 2, 3], **mine)
    solo = [Sampler().sample(stream[t][None].copy(), [alone]).ids[0] for t in range(steps)]

    others = [make_state([4], seed=9, top_k=5), make_state([5, 6], do_sample=False),
              make_state([7], seed=1234, top_k=40), make_state([8], seed=1, top_p=0.5)]
    batched_state = make_state([1, 2, 3], **mine)
    batched = []
    for t in range(steps):
        batch = others[:2] + [batched_state] + others[2:]
        logits = rand_logits(rng, 5, vocab, 1.0)
        logits[2] = stream[t]
        batched.append(Sampler().sample(logits, batch).ids[2])
    assert solo == batched

    other_seed = make_state([1, 2, 3], **{**mine, "seed": 4321})
    differs = [Sampler().sample(stream[t][None].copy(), [other_seed]).ids[0] for t in range(steps)]
    assert differs != solo


def test_each_sampled_token_draws_exactly_one_number():
    state = make_state([0], seed=99, top_k=3, top_p=0.9)
    greedy = make_state([0], seed=99, do_sample=False)
    logits = rand_logits(np.random.default_rng(8), 2, 600)
    for _ in range(5):
        Sampler().sample(logits.copy(), [state, greedy])
    reference = np.random.default_rng(99)
    reference.random(5)
    assert state.rng.random() == reference.random()
    assert greedy.rng.random() == np.random.default_rng(99).random()


# ---------------------------------------------------------------------------- logprobs

def log_softmax64(row):
    row = row.astype(np.float64)
    return row - row.max() - np.log(np.exp(row - row.max()).sum())


def test_logprobs_equal_a_log_softmax_reference_of_the_penalized_logits():
    rng = np.random.default_rng(9)
    vocab = 49152
    logits = rand_logits(rng, 3, vocab)
    prompt = rng.integers(0, vocab, 30).tolist()
    states = [make_state(prompt, do_sample=False, repetition_penalty=1.3, logprobs=True,
                         top_logprobs=5),
              make_state(prompt, seed=3, temperature=0.5, top_k=20, logprobs=True,
                         top_logprobs=10),
              make_state(prompt, seed=3)]
    penalized = logits.copy()
    penalized[0] = RepetitionPenaltyLogitsProcessor(1.3)(
        torch.tensor([prompt]), torch.from_numpy(logits[:1].copy())).numpy()[0]
    out = Sampler().sample(logits.copy(), states)
    for r, n in ((0, 5), (1, 10)):
        ref = log_softmax64(penalized[r])  # before temperature, as DashInfer reports them
        assert math.isclose(out.token_logprobs[r], ref[out.ids[r]], abs_tol=1e-5)
        top = out.top_logprobs[r]
        assert len(top) == n
        assert [i for i, _ in top] == np.argsort(-ref)[:n].tolist()
        np.testing.assert_allclose([lp for _, lp in top], np.sort(ref)[::-1][:n], atol=1e-5)
    assert np.isnan(out.token_logprobs[2]) and out.top_logprobs[2] is None


@pytest.mark.parametrize("vocab", [7, 3000])
def test_top_logprobs_beyond_the_vocabulary_and_among_masked_tokens(vocab):
    """More pairs asked than tokens exist: every token, in order; -inf tokens come last as -inf."""
    rng = np.random.default_rng(vocab)
    row = rand_logits(rng, 1, vocab)[0]
    row[[1, vocab - 1]] = -np.inf
    out = Sampler().sample(row[None].copy(), [make_state([0], do_sample=False, logprobs=True, top_logprobs=10)])
    ref = log_softmax64(row)
    n = min(10, vocab)
    top = out.top_logprobs[0]
    assert [i for i, _ in top] == np.argsort(-ref, kind="stable")[:n].tolist()
    np.testing.assert_allclose([lp for _, lp in top], np.sort(ref)[::-1][:n], atol=1e-5)
    assert out.ids[0] == top[0][0] and math.isclose(out.token_logprobs[0], top[0][1], rel_tol=1e-6)


def test_logprobs_without_top_logprobs_and_independent_of_temperature():
    row = np.array([[1.0, 2.0, 0.5, -1.0]], np.float32)
    hot = Sampler().sample(row.copy(), [make_state([0], seed=1, top_k=1, temperature=5.0,
                                                   logprobs=True)])
    cold = Sampler().sample(row.copy(), [make_state([0], seed=1, top_k=1, temperature=0.1,
                                                    logprobs=True)])
    assert hot.top_logprobs == [[]] and hot.ids[0] == cold.ids[0] == 1
    assert hot.token_logprobs[0] == cold.token_logprobs[0]
    assert math.isclose(hot.token_logprobs[0], log_softmax64(row[0])[1], abs_tol=1e-6)


# ---------------------------------------------------------------------------- contract

def test_the_request_owns_the_tokens_and_the_sampler_reads_them():
    """sample() leaves the history alone; Sequence.append adds a token once, and the sampler
    state (reading the same list) penalizes it from the next step on."""
    seq = Sequence.start([3, 4], check_generation(dict(do_sample=False, presence_penalty=5.0,
                                                       max_length=10)))
    logits = np.zeros((1, 8), np.float32)
    logits[0, 6] = 1.0
    out = Sampler().sample(logits, [seq.sampling])
    assert out.ids[0] == 6 and seq.tokens == [3, 4] and seq.sampling.tokens is seq.tokens
    seq.append(6)
    assert seq.tokens == [3, 4, 6] and seq.num_generated == 1
    logits = np.zeros((1, 8), np.float32)
    logits[0, 6] = 1.0
    assert Sampler().sample(logits, [seq.sampling]).ids[0] != 6 and logits[0, 6] == -4.0


def test_temperature_zero_is_greedy_and_draws_nothing():
    logits = rand_logits(np.random.default_rng(11), 4, 300)
    states = [make_state([0], seed=s, temperature=0.0, top_k=0) for s in range(4)]
    assert np.array_equal(Sampler().sample(logits.copy(), states).ids, logits.argmax(axis=1))
    assert all(st.rng.random() == np.random.default_rng(s).random() for s, st in enumerate(states))


@pytest.mark.parametrize("logits,words", [
    (np.zeros((1, 10), np.float64), "float32"),
    (np.zeros(10, np.float32), r"\[B, V\]"),
    (np.zeros((10, 2), np.float32).T, "C-contiguous"),
    (np.zeros((3, 10), np.float32), "3 logits rows for 1 requests"),
    ([[0.0] * 10], "float32"),
])
def test_sample_refuses_bad_logits(logits, words):
    with pytest.raises((TypeError, ValueError), match=words):
        Sampler().sample(logits, [make_state([0])])
