"""bad_words_ids: the sampler masks what transformers' NoBadWordsLogitsProcessor masks, and an
engine never generates a banned token (the greedy choice it would otherwise make)."""
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import NoBadWordsLogitsProcessor

import dashinfer_client as allspark
from dashinfer_client.generation_config import check_generation
from dashinfer_server.sampler import Sampler
from dashinfer_server.sequence import Sequence
from tests.engine_helpers import collect, greedy
from tests.helpers import TINY


def sample_masked(tokens, bad, logits):
    seq = Sequence.start(tokens, check_generation({"max_length": 4096, "do_sample": False,
                                                   "bad_words_ids": bad}))
    out = logits.copy()
    Sampler().sample(out, [seq.sampling])
    return out


@pytest.mark.parametrize("bad", [[[3]], [[3], [5, 1]], [[1, 2, 4], [0, 5], [2]], [[4, 4, 4]]])
def test_bad_words_mask_matches_transformers(bad):
    rng = np.random.default_rng(len(bad))
    vocab = 6
    for _ in range(30):
        tokens = rng.integers(0, vocab, rng.integers(1, 12)).tolist()
        logits = (rng.standard_normal((1, vocab)) * 3).astype(np.float32)
        ref = NoBadWordsLogitsProcessor(bad, eos_token_id=99)(torch.tensor([tokens]),
                                                              torch.from_numpy(logits.copy())).numpy()
        np.testing.assert_array_equal(sample_masked(tokens, bad, logits), ref)


def test_no_bad_words_leaves_the_logits_alone():
    logits = np.arange(6, dtype=np.float32)[None]
    np.testing.assert_array_equal(sample_masked([1, 2], [], logits), logits)
    assert check_generation({"bad_words_ids": None})["bad_words_ids"] == []


def test_engines_never_generate_a_banned_token(api_engine):
    engine, name, loader = api_engine
    prompt = [5, 9, 17, 33, 2, 8]
    _, _, queue = engine.start_request_ids(name, loader, prompt, greedy(len(prompt) + 12))
    free, _ = collect(queue)
    banned = sorted(set(free[:4]))
    status, _, queue = engine.start_request_ids(
        name, loader, prompt, greedy(len(prompt) + 12, bad_words_ids=[[t] for t in banned]))
    assert status == allspark.AsStatus.ALLSPARK_SUCCESS
    masked, _ = collect(queue)
    assert len(masked) == 12 and not set(masked) & set(banned)


def test_a_banned_id_outside_the_vocabulary_is_refused_and_spares_the_others(api_engine):
    """Refused at start on both engines, as stop words outside it are: it used to fail the step
    that reached it, interrupting every request in the batch."""
    engine, name, loader = api_engine
    prompt = [5, 9, 17, 33, 2, 8]
    _, _, running = engine.start_request_ids(name, loader, prompt, greedy(len(prompt) + 40))
    status, _, _ = engine.start_request_ids(name, loader, prompt,
                                            greedy(len(prompt) + 12, bad_words_ids=[[TINY["vocab_size"]]]))
    assert status == allspark.AsStatus.ALLSPARK_PARAM_ERROR and "bad_words_ids" in engine.last_error
    generated, _ = collect(running)
    assert len(generated) == 40 and running.GenerateStatus() == allspark.GenerateRequestStatus.GenerateFinished
