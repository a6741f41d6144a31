"""Sampling and stopping options on both engines (`api_engine`): seeds, temperature, logprobs,
stop words, eos, min/max length, penalties against a reference."""
import numpy as np
import pytest

from dashinfer_client import AsStatus
from tests.api_helpers import Finished, alone, logged, prompt_of, run
from tests.engine_helpers import collect, greedy, hf_greedy
from tests.helpers import load_hf_model


# ---- sampling options ------------------------------------------------------------------------

def sampled(max_length, seed, **options):
    settings = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, seed=seed)
    settings.update(options)
    return greedy(max_length, **settings)


def test_seed_gives_the_same_tokens_alone_and_in_a_batch(api_engine):
    engine, name, loader = api_engine
    prompt = prompt_of(15, 11)
    ids, *_ = run(api_engine, prompt, sampled(55, 1234))
    again, *_ = run(api_engine, prompt, sampled(55, 1234))
    assert ids == again and len(ids) == 40
    others = []
    for i in range(5):
        p = prompt_of(6 + 5 * i, 20 + i)
        status, handle, queue = engine.start_request_ids(name, loader, p, sampled(len(p) + 30 + i, 7 + i))
        others.append(queue)
    in_batch, *_ = run(api_engine, prompt, sampled(55, 1234))
    assert in_batch == ids
    for queue in others:
        collect(queue)
    other_seed, *_ = run(api_engine, prompt, sampled(55, 99))
    assert other_seed != ids


@pytest.mark.parametrize("options", [dict(top_k=1), dict(top_p=1e-6), dict(temperature=1e-4)],
                         ids=["top_k=1", "top_p=1e-6", "temperature=1e-4"])
def test_sampling_cut_to_one_token_is_greedy(api_engine, options):
    prompt = prompt_of(14, 12)
    ids, *_ = run(api_engine, prompt, sampled(len(prompt) + 24, 5, **options))
    assert ids == alone(api_engine, prompt, 24)


def test_temperature_zero_is_greedy(api_engine):
    prompt = prompt_of(14, 12)
    ids, *_ = run(api_engine, prompt, sampled(len(prompt) + 24, 5, temperature=0.0))
    assert ids == alone(api_engine, prompt, 24)


def test_a_built_config_changed_as_a_dict_is_read_and_checked(api_engine, caplog):
    """build() gives a dict (as DashInfer's); what the user changes in it is what runs, and a
    change to a bad value is refused like any bad value."""
    engine, name, loader = api_engine
    prompt = prompt_of(14, 12)
    cfg = sampled(len(prompt) + 24, 5).build()
    cfg["temperature"] = 0.0
    ids, *_ = run(api_engine, prompt, cfg)
    assert ids == alone(api_engine, prompt, 24)
    cfg["top_p"] = 3.0
    assert engine.start_request_ids(name, loader, prompt, cfg) == (AsStatus.ALLSPARK_PARAM_ERROR, None, None)
    assert logged(caplog, "top_p")


def test_sampling_follows_the_distribution(api_engine):
    """top_k=2 draws only the two most likely tokens, both of them over enough draws."""
    engine, name, loader = api_engine
    prompt = prompt_of(13, 13)
    ids, elements, *_ = run(api_engine, prompt, sampled(len(prompt) + 1, 3, logprobs=True, top_logprobs=2,
                                                        top_k=2))
    top2 = {i for i, _ in elements[0].log_probs_list[0]}
    firsts = set()
    for seed in range(40):
        out, *_ = run(api_engine, prompt, sampled(len(prompt) + 1, seed, top_k=2))
        firsts.add(out[0])
    assert firsts == top2


def test_logprobs(api_engine):
    import torch
    _, _, loader = api_engine
    prompt = prompt_of(16, 14)
    ids, elements, queue, _ = run(api_engine, prompt, greedy(len(prompt) + 10, logprobs=True, top_logprobs=4))
    tops = [t for e in elements for t in e.log_probs_list]
    chosen = [p for e in elements for p in e.token_logprobs_list]
    assert len(tops) == len(chosen) == len(ids) == 10
    for token, top, lp in zip(ids, tops, chosen):
        assert len(top) == 4 and [p for _, p in top] == sorted((p for _, p in top), reverse=True)
        assert top[0] == (token, pytest.approx(lp)) and all(p <= 0 for _, p in top)
        assert sum(np.exp(p) for _, p in top) <= 1 + 1e-5
    hf = load_hf_model(loader.model_path)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].double(), -1).numpy()
    assert [i for i, _ in tops[0]] == list(np.argsort(-ref)[:4])
    assert np.allclose([p for _, p in tops[0]], ref[[i for i, _ in tops[0]]], atol=3e-2)
    plain, plain_elements, *_ = run(api_engine, prompt, greedy(len(prompt) + 10))
    assert plain == ids and all(e.log_probs_list == [] == e.token_logprobs_list for e in plain_elements)


def first_stop(tokens, prompt_len, is_stop):
    """Generated tokens up to and including the first position where is_stop(tokens so far)."""
    for end in range(prompt_len + 1, len(tokens) + 1):
        if is_stop(tokens[:end]):
            return tokens[prompt_len:end]
    return tokens[prompt_len:]


def test_stop_words(api_engine):
    prompt = prompt_of(12, 15)
    free = alone(api_engine, prompt, 40)
    word = free[6:8]
    ids, _, queue, _ = run(api_engine, prompt, greedy(len(prompt) + 40, stop_words_ids=[[1, 2, 3], word]))
    expected = first_stop(prompt + free, len(prompt), lambda t: t[-2:] == word)
    assert ids == expected and len(ids) <= 8 and queue.GenerateStatus() == Finished
    assert queue.RequestStatInfo()["finish_reason"] == "stop_words"


def test_eos_list_and_early_stopping(api_engine):
    prompt = prompt_of(12, 16)
    free = alone(api_engine, prompt, 40)
    eos = [free[9], free[5]]
    ids, _, queue, _ = run(api_engine, prompt, greedy(len(prompt) + 40, eos_token_id=eos, early_stopping=True))
    assert ids == first_stop(prompt + free, len(prompt), lambda t: t[-1] in eos) and len(ids) <= 6
    assert queue.RequestStatInfo()["finish_reason"] == "eos"
    ids, _, queue, _ = run(api_engine, prompt, greedy(len(prompt) + 40, eos_token_id=eos, early_stopping=False))
    assert ids == free  # without early stopping an eos is an ordinary token
    assert queue.RequestStatInfo()["finish_reason"] == "length"


def test_min_length(api_engine):
    prompt = prompt_of(12, 17)
    free = alone(api_engine, prompt, 40)
    eos = free[2]
    assert eos not in free[:2]
    ids, *_ = run(api_engine, prompt, greedy(len(prompt) + 40, eos_token_id=eos, early_stopping=True,
                                             min_length=len(prompt) + 5))
    assert ids[:2] == free[:2] and ids[2] != eos  # masked: greedy takes the runner-up
    assert eos not in ids[:5] and (len(ids) == 40 or ids[-1] == eos)


def test_max_length(api_engine):
    prompt = prompt_of(12, 18)
    for new in (1, 7):
        ids, _, queue, _ = run(api_engine, prompt, greedy(len(prompt) + new))
        assert len(ids) == new == queue.GeneratedLength() and queue.GenerateStatus() == Finished
        assert queue.RequestStatInfo()["finish_reason"] == "length"


def _repetition(p, generated_only):
    def process(logits, tokens, prompt_len):
        seen = set(tokens[prompt_len:] if generated_only else tokens)
        for t in seen:
            logits[t] = logits[t] / p if logits[t] > 0 else logits[t] * p
    return process


def _presence(p):
    def process(logits, tokens, prompt_len):
        for t in set(tokens[prompt_len:]):
            logits[t] -= p
    return process


def _no_repeat_ngram(n):
    def process(logits, tokens, prompt_len):
        tail = tuple(tokens[len(tokens) - n + 1:])
        for i in range(len(tokens) - n + 1):
            if tuple(tokens[i:i + n - 1]) == tail:
                logits[tokens[i + n - 1]] = -np.inf
    return process


def _frequency(f):  # OpenAI's: the count of each generated token times f
    def process(logits, tokens, prompt_len):
        for t in set(tokens[prompt_len:]):
            logits[t] -= f * tokens[prompt_len:].count(t)
    return process


def _bias(bias):
    def process(logits, tokens, prompt_len):
        for t, b in bias.items():
            logits[t] += b
    return process


PENALTIES = {
    "repetition_penalty": (dict(repetition_penalty=1.8), _repetition(1.8, False)),
    "suppress_repetition_in_generation": (
        dict(repetition_penalty=1.8, suppress_repetition_in_generation=True), _repetition(1.8, True)),
    "presence_penalty": (dict(presence_penalty=1.5), _presence(1.5)),
    "no_repeat_ngram_size": (dict(no_repeat_ngram_size=2), _no_repeat_ngram(2)),
    "frequency_penalty": (dict(frequency_penalty=0.6), _frequency(0.6)),
    # string ids as OpenAI's JSON has them; over gRPC they travel as JSON too
    "logit_bias": (dict(logit_bias={"100": -100, "38": 4.0, "7": 2.5}), _bias({100: -100, 38: 4.0, 7: 2.5})),
}


@pytest.mark.parametrize("penalty", list(PENALTIES))
def test_penalties_match_a_reference(api_engine, penalty):
    """Greedy with a penalty equals transformers' logits penalized by DashInfer's rule."""
    _, _, loader = api_engine
    options, process = PENALTIES[penalty]
    prompt = prompt_of(10, 19) * 2  # a repeated prompt: the penalties have something to bite
    new = 24
    ids, *_ = run(api_engine, prompt, greedy(len(prompt) + new, **options))
    hf = load_hf_model(loader.model_path)
    ref = hf_greedy(hf, prompt, new, lambda logits, tokens: process(logits, tokens, len(prompt)))
    assert ids == ref
    assert ids != alone(api_engine, prompt, new), "the penalty should change this greedy output"


@pytest.mark.parametrize("key,value,word", [
    ("logit_bias", {5: 100.5}, "[-100, 100]"), ("logit_bias", {100000: 1.0}, "vocabulary"),
    ("min_p", 1.5, "[0, 1]"), ("frequency_penalty", 2.5, "[-2, 2]")])
def test_openai_options_out_of_range_are_param_errors(api_engine, key, value, word, caplog):
    """A built config changed to a bad value: the same AsStatus and reason on both engines."""
    engine, name, loader = api_engine
    cfg = greedy(30).build()
    cfg[key] = value
    assert engine.start_request_ids(name, loader, prompt_of(5, 3), cfg) == (AsStatus.ALLSPARK_PARAM_ERROR, None, None)
    assert logged(caplog, key, word)


def test_min_p_keeps_sampling_in_its_support(api_engine):
    """min_p 1: only the most probable token is left, so sampling is greedy (transformers' rule)."""
    prompt = prompt_of(13, 8)
    ids, *_ = run(api_engine, prompt, sampled(len(prompt) + 20, 77, min_p=1.0))
    assert ids == alone(api_engine, prompt, 20)


def test_identical_prompts_started_together_share_their_blocks(api_engine):
    """OpenAI's n on the engine: n requests of one prompt started at once; one computes the prompt's
    whole blocks, the others take them from the prefix cache (RequestStatInfo's
    context_cached_length), and each generates what it generates alone."""
    engine, name, loader = api_engine
    prompt = prompt_of(70, 31)
    started = [engine.start_request_ids(name, loader, prompt, greedy(len(prompt) + 8)) for _ in range(3)]
    cached = []
    for status, handle, queue in started:
        assert status == AsStatus.ALLSPARK_SUCCESS
        assert collect(queue)[0] == alone(api_engine, prompt, 8)
        cached.append(queue.RequestStatInfo()["context_cached_length"])
        engine.release_request(name, handle)
    assert sorted(cached)[0] == 0 and sorted(cached)[1] == sorted(cached)[2] >= len(prompt) // 2, cached
