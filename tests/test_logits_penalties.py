"""The logits processors before the draw (dashinfer_server/logits_processors.py), each against
transformers' own processor on the same logits and tokens: repetition and presence penalties,
no_repeat_ngram_size, min_length's EOS mask."""
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinLengthLogitsProcessor, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor)

from dashinfer_server.sampler import Sampler
from tests.test_sampler import make_state, rand_logits


def test_repetition_penalty_changes_greedy_choice_by_the_hf_formula():
    logits = np.array([[3.0, 2.5, -1.0, 0.5]], np.float32)
    plain = Sampler().sample(logits.copy(), [make_state([0, 2], do_sample=False)])
    assert plain.ids[0] == 0
    penalized = logits.copy()
    out = Sampler().sample(penalized, [make_state([0, 2], do_sample=False,
                                                  repetition_penalty=1.5)])
    assert out.ids[0] == 1  # 3.0 / 1.5 = 2.0 < 2.5
    np.testing.assert_allclose(penalized[0], [2.0, 2.5, -1.5, 0.5], rtol=1e-6)


@pytest.mark.parametrize("suppress", [False, True])
def test_repetition_penalty_matches_transformers(suppress):
    rng = np.random.default_rng(1)
    vocab = 300
    for trial in range(5):
        prompt = rng.integers(0, vocab, 40).tolist()
        generated = rng.integers(0, vocab, 25).tolist() + prompt[:5]
        logits = rand_logits(rng, 1, vocab)
        ours = logits.copy()
        Sampler().sample(ours, [make_state(prompt, generated, do_sample=False,
                                           repetition_penalty=1.7,
                                           suppress_repetition_in_generation=suppress)])
        hf = RepetitionPenaltyLogitsProcessor(1.7, prompt_ignore_length=len(prompt) if suppress
                                              else None)
        ref = hf(torch.tensor([prompt + generated]), torch.from_numpy(logits.copy())).numpy()
        np.testing.assert_allclose(ours, ref, rtol=1e-6)


def test_suppress_repetition_in_generation_spares_the_prompt():
    logits = np.full((1, 6), 1.0, np.float32)
    Sampler().sample(logits, [make_state([0, 1], [2], do_sample=False, repetition_penalty=2.0,
                                         suppress_repetition_in_generation=True)])
    np.testing.assert_allclose(logits[0], [1.0, 1.0, 0.5, 1.0, 1.0, 1.0])


def test_presence_penalty_subtracts_once_from_generated_tokens_only():
    logits = np.array([[2.0, 1.9, 1.0, -1.0, 0.0]], np.float32)
    state = make_state([0], [1, 1, 3, 1], do_sample=False, presence_penalty=0.5)
    out = Sampler().sample(logits, [state])
    np.testing.assert_allclose(logits[0], [2.0, 1.4, 1.0, -1.5, 0.0])
    assert out.ids[0] == 0
    logits = np.array([[1.9, 2.0, 1.0]], np.float32)
    assert Sampler().sample(logits, [make_state([2], [1], do_sample=False,
                                                presence_penalty=0.2)]).ids[0] == 0


@pytest.mark.parametrize("tokens,n,banned", [
    ([1, 2, 3, 1, 2], 3, {3}),
    ([1, 2, 3, 1, 2], 2, {3}),
    ([1, 2, 1, 3, 1], 2, {2, 3}),
    ([1, 2, 3, 4], 3, set()),
    ([4, 4, 4], 3, {4}),
    ([5, 1, 5], 1, {1, 5}),
])
def test_no_repeat_ngram_bans_exactly_the_completing_tokens(tokens, n, banned):
    logits = np.zeros((1, 8), np.float32)
    Sampler().sample(logits, [make_state(tokens[:2], tokens[2:], do_sample=False,
                                         no_repeat_ngram_size=n)])
    assert set(np.flatnonzero(np.isneginf(logits[0]))) == banned


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_repeat_ngram_matches_transformers(n):
    rng = np.random.default_rng(n)
    vocab = 6
    for trial in range(20):
        tokens = rng.integers(0, vocab, rng.integers(1, 30)).tolist()
        split = rng.integers(0, len(tokens)) + 1
        logits = rand_logits(rng, 1, vocab)
        ours = logits.copy()
        Sampler().sample(ours, [make_state(tokens[:split], tokens[split:], do_sample=False,
                                           no_repeat_ngram_size=n)])
        ref = NoRepeatNGramLogitsProcessor(n)(torch.tensor([tokens]),
                                              torch.from_numpy(logits.copy())).numpy()
        np.testing.assert_array_equal(ours, ref)


def test_min_length_masks_every_eos_until_reached_as_transformers():
    rng = np.random.default_rng(3)
    eos = [2, 5]
    hf = MinLengthLogitsProcessor(6, eos)
    for length in range(2, 9):
        logits = rand_logits(rng, 1, 10)
        ours = logits.copy()
        Sampler().sample(ours, [make_state(list(range(length)), do_sample=False, min_length=6,
                                           max_length=20, eos_token_id=eos)])
        ref = hf(torch.zeros((1, length), dtype=torch.long), torch.from_numpy(logits)).numpy()
        np.testing.assert_array_equal(ours, ref)
        assert np.isneginf(ours[0, eos]).all() == (length < 6)
