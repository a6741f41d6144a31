"""OpenAI's sampling options in the sampler: frequency_penalty, logit_bias and min_p, against a
float64 numpy reference of the transformed logits and transformers' MinPLogitsWarper."""
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from dashinfer_server.sampler import Sampler
from tests.test_sampler import dense_probs, make_state, rand_logits


def openai_penalized(row, prompt, generated, frequency, presence, bias):
    """OpenAI's documented formula in float64: logit - count * frequency - (count > 0) * presence,
    counting generated tokens only, then each bias added."""
    out = row.astype(np.float64)
    counts = np.bincount(np.array(generated, np.int64), minlength=row.size).astype(np.float64)
    out -= counts * frequency + (counts > 0) * presence
    for token, b in bias.items():
        out[int(token)] += b
    return out


@pytest.mark.parametrize("frequency,presence", [(0.7, 0.0), (-1.5, 0.0), (2.0, 0.4), (0.0, 0.0)])
def test_frequency_presence_and_logit_bias_follow_openai_formula(frequency, presence):
    rng = np.random.default_rng(3)
    vocab = 400
    prompt = rng.integers(0, vocab, 30).tolist()
    generated = rng.integers(0, 40, 60).tolist()  # a few tokens many times each
    bias = {5: -100.0, 17: 3.5, "33": -0.25}
    row = rand_logits(rng, 1, vocab)
    ours = row.copy()
    Sampler().sample(ours, [make_state(prompt, generated, do_sample=False, frequency_penalty=frequency,
                                       presence_penalty=presence, logit_bias=bias)])
    ref = openai_penalized(row[0], prompt, generated, frequency, presence, bias)
    np.testing.assert_allclose(ours[0], ref, rtol=1e-6, atol=1e-4)


def test_frequency_penalty_spares_the_prompt():
    row = np.zeros((1, 8), np.float32)
    Sampler().sample(row, [make_state([1, 1, 1, 2], [2, 3, 3], do_sample=False, frequency_penalty=0.5)])
    np.testing.assert_allclose(row[0], [0, 0, -0.5, -1.0, 0, 0, 0, 0])


def test_logit_bias_minus_100_bans_the_greedy_choice():
    row = np.array([[1.0, 9.0, 8.5, -2.0]], np.float32)
    out = Sampler().sample(row.copy(), [make_state([0], do_sample=False, logit_bias={1: -100})])
    assert out.ids[0] == 2
    forced = Sampler().sample(row.copy(), [make_state([0], do_sample=False, logit_bias={"3": 100})])
    assert forced.ids[0] == 3


def test_logit_bias_does_not_undo_a_ban():
    row = np.zeros((1, 6), np.float32)
    Sampler().sample(row, [make_state([0], do_sample=False, bad_words_ids=[[4]], logit_bias={4: 100})])
    assert row[0, 4] == -np.inf


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.05), (0.7, 0, 1.0, 0.3), (1.3, 50, 1.0, 0.1), (1.0, 0, 0.9, 0.02),
    (0.8, 200, 0.95, 0.2), (1.0, 0, 1.0, 1.0), (1.0, 0, 1.0, 0.0)])
@pytest.mark.parametrize("vocab,scale", [(500, 3.0), (49152, 4.0)])
def test_min_p_distribution_matches_transformers(temperature, top_k, top_p, min_p, vocab, scale):
    rng = np.random.default_rng(vocab + 1)
    row = rand_logits(rng, 1, vocab, scale)[0]
    scores = torch.from_numpy(row.copy()[None].astype(np.float64))
    warpers = [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k or vocab), TopPLogitsWarper(top_p)]
    if min_p > 0:
        warpers.append(MinPLogitsWarper(min_p))
    for warper in warpers:
        scores = warper(None, scores)
    ref = torch.softmax(scores, dim=-1)[0].numpy()
    ours = dense_probs(row, temperature, top_k, top_p, min_p)
    assert not (ours > 0)[ref == 0].any() and (ours > 0)[ref > 1e-30].all()
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-9)


def test_min_p_numpy_reference_and_sampling_stays_in_its_support():
    rng = np.random.default_rng(9)
    row = rand_logits(rng, 1, 3000, 2.0)[0]
    p = np.exp(row.astype(np.float64) - row.max())
    support = set(np.flatnonzero(p >= 0.2 * p.max()).tolist())  # min_p 0.2 at temperature 1
    states = [make_state([0], seed=s, top_k=0, min_p=0.2) for s in range(50)]
    seen = set()
    for _ in range(20):
        seen |= set(Sampler().sample(np.repeat(row[None], 50, axis=0), states).ids.tolist())
    assert seen <= support and len(seen) > 1
    expected = np.zeros(row.size)
    expected[list(support)] = p[list(support)]
    np.testing.assert_allclose(dense_probs(row, 1.0, 0, 1.0, 0.2), expected / expected.sum(), rtol=1e-5, atol=1e-12)


def test_min_p_leaves_greedy_alone():
    row = rand_logits(np.random.default_rng(2), 3, 700)
    states = [make_state([0], do_sample=False, min_p=0.9) for _ in range(3)]
    assert np.array_equal(Sampler().sample(row.copy(), states).ids, row.argmax(axis=1))
