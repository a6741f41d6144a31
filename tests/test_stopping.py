import numpy as np
import pytest

from dashinfer_client.generation_config import check_generation
from dashinfer_client.types import FinishReason
from dashinfer_server.sampler import Sampler
from dashinfer_server.sequence import Sequence
from dashinfer_server.stopping import check_stop

VOCAB = 12


def generate(prompt, favourites, **options):
    """Greedy decoding where step t's logits prefer favourites[t] (then 11, then the rest);
    returns (generated ids, stop reason). The eos id is 10 unless given (never a favourite)."""
    seq = Sequence.start(prompt, check_generation({"eos_token_id": 10, "do_sample": False, **options}))
    sampler = Sampler()
    for fav in favourites:
        logits = np.zeros((1, VOCAB), np.float32)
        logits[0, 11] = 1.0
        logits[0, fav] = 2.0
        seq.append(int(sampler.sample(logits, [seq.sampling]).ids[0]))
        reason = check_stop(seq)
        if reason is not None:
            return seq.tokens[seq.prompt_len:], reason
    return seq.tokens[seq.prompt_len:], None


@pytest.mark.parametrize("eos", [9, [7, 9]])
def test_eos_stops_and_is_delivered(eos):
    out, reason = generate([1, 2], [3, 4, 9, 5], eos_token_id=eos, max_length=50)
    assert (out, reason) == ([3, 4, 9], FinishReason.EOS)


def test_second_id_of_an_eos_list_stops_too():
    out, reason = generate([1], [7, 3], eos_token_id=[9, 7], max_length=50)
    assert (out, reason) == ([7], FinishReason.EOS)


def test_early_stopping_off_makes_eos_an_ordinary_token():
    out, reason = generate([1, 2], [3, 9, 9, 5, 6, 6, 6], eos_token_id=9, early_stopping=False,
                           max_length=7)
    assert (out, reason) == ([3, 9, 9, 5, 6], FinishReason.LENGTH)


def test_max_length_counts_prompt_and_generated_tokens():
    out, reason = generate([1, 2, 3], [4] * 10, max_length=6)
    assert (out, reason) == ([4, 4, 4], FinishReason.LENGTH)
    out, reason = generate([1], [4], max_length=2)
    assert (out, reason) == ([4], FinishReason.LENGTH)


@pytest.mark.parametrize("favourites,expected", [
    ([3, 4, 5, 6], ([3, 4, 5], FinishReason.STOP_WORDS)),
    ([4, 6, 4, 5], ([4, 6, 4, 5], FinishReason.STOP_WORDS)),
    ([4, 6, 5, 0], ([4, 6, 5, 0], None)),
    ([8, 8], ([8], FinishReason.STOP_WORDS)),
])
def test_stop_words_stop_on_a_suffix_and_are_delivered(favourites, expected):
    assert generate([1], favourites, stop_words_ids=[[4, 5], [8]], max_length=50) == expected


def test_stop_word_may_span_the_prompt_end_as_in_dashinfer():
    assert generate([1, 4], [5, 6], stop_words_ids=[[4, 5]], max_length=50) == (
        [5], FinishReason.STOP_WORDS)


def test_min_length_delays_eos_until_the_length_is_reached():
    # eos is everyone's favourite; below min_length it is masked and 11 comes instead
    out, reason = generate([1, 2, 3], [9] * 10, eos_token_id=9, min_length=6, max_length=50)
    assert (out, reason) == ([11, 11, 11, 9], FinishReason.EOS)


def test_min_length_does_not_hold_back_stop_words_or_max_length():
    out, reason = generate([1], [8, 8], stop_words_ids=[[8]], eos_token_id=9, min_length=10,
                           max_length=50)
    assert (out, reason) == ([8], FinishReason.STOP_WORDS)
    out, reason = generate([1], [9] * 5, eos_token_id=9, min_length=4, max_length=4)
    assert (out, reason) == ([11, 11, 11], FinishReason.LENGTH)


def test_no_stop_condition_means_no_stop():
    assert generate([1], [3, 4, 5], eos_token_id=9, max_length=50) == ([3, 4, 5], None)
