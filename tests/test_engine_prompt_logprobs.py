"""The generation option prompt_logprobs on both engines (`api_engine`): each prompt token's
logprob after the first, its top alternatives and its rank, against log_softmax of transformers'
logits (fp32 tiny model), over a prompt in several prefill chunks, beside another request, after
its prefix was cached."""
import numpy as np
import pytest

from dashinfer_client import AsStatus
from tests.api_helpers import OK, install, prompt_of, run
from tests.engine_helpers import collect, greedy
from tests.helpers import load_hf_model

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def hf(api_engine):
    return load_hf_model(api_engine[2].model_path)


@pytest.fixture(scope="module")
def chunked(api_engine):
    """A model of the same files that prefills 16 tokens a step and holds 4 requests (the
    scored rows' head runs 4 rows at a time)."""
    name = install(api_engine, "chunked", max_prefill_length=16, max_batch=4)
    yield name
    api_engine[0].release_model(name)


def reference(hf, prompt, k):
    """(logprob of each prompt token after the first, top-k ids, top-k logprobs, ranks)."""
    import torch
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0, :-1].double()
    logprobs = torch.log_softmax(logits, -1).numpy()
    targets = np.array(prompt[1:])
    token = logprobs[np.arange(len(targets)), targets]
    top = np.argsort(-logprobs, axis=1, kind="stable")[:, :k]
    ranks = 1 + (logprobs > token[:, None]).sum(axis=1)
    return token, top, np.take_along_axis(logprobs, top, 1), ranks


def scored(api, prompt, k, model, **options):
    """Run `prompt` with prompt_logprobs k -> (ids, the first element, the queue)."""
    ids, elements, queue, handle = run(api, prompt, greedy(len(prompt) + 4, prompt_logprobs=k, **options), model)
    assert api[0].release_request(model, handle) == OK
    assert all(not e.prompt_token_logprobs_list for e in elements[1:]), "delivered once"
    return ids, elements[0], queue


def check(first, expected, k):
    token, top, top_lp, ranks = expected
    assert len(first.prompt_token_logprobs_list) == len(token)
    assert np.abs(np.array(first.prompt_token_logprobs_list) - token).max() < TOLERANCE
    assert [[i for i, _ in pairs] for pairs in first.prompt_log_probs_list] == top.tolist()
    if k:
        got = np.array([[p for _, p in pairs] for pairs in first.prompt_log_probs_list])
        assert np.abs(got - top_lp).max() < TOLERANCE
    assert first.prompt_token_ranks_list == ranks.tolist()


@pytest.mark.parametrize("k", [0, 3])
def test_prompt_logprobs_across_prefill_chunks_match_transformers(api_engine, hf, chunked, k):
    prompt = prompt_of(45, 3)  # 3 chunks of 16 tokens: every chunk's last row scored too
    ids, first, queue = scored(api_engine, prompt, k, chunked, logprobs=True, top_logprobs=2)
    check(first, reference(hf, prompt, k), k)
    # the generated tokens' own, as ever (the first Get may hold more than the first token: a slow reader)
    assert len(first.token_logprobs_list) == len(first.ids_from_generate) and len(ids) == 4
    plain, *_ = run(api_engine, prompt, greedy(len(prompt) + 4), chunked)
    assert ids == plain


def test_a_batch_neighbour_is_unchanged(api_engine, hf, chunked):
    """A request running beside a scored prompt (in the same steps) gets the tokens and logprobs
    it gets alone; the scored one gets transformers' values."""
    engine, _, loader = api_engine
    neighbour = prompt_of(30, 5)
    options = dict(logprobs=True, top_logprobs=3)
    alone_ids, alone_elements, *_ = run(api_engine, neighbour, greedy(len(neighbour) + 12, **options), chunked)
    prompt = prompt_of(40, 6)
    status, _, beside = engine.start_request_ids(chunked, loader, neighbour, greedy(len(neighbour) + 12, **options))
    assert status == OK
    _, first, _ = scored(api_engine, prompt, 2, chunked)
    ids, elements = collect(beside)
    assert ids == alone_ids
    assert [e.log_probs_list for e in elements] != [] and \
        sum((e.log_probs_list for e in elements), []) == sum((e.log_probs_list for e in alone_elements), [])
    assert all(not e.prompt_token_logprobs_list for e in elements)
    check(first, reference(hf, prompt, 2), 2)


def test_a_cached_prefix_is_computed_again(api_engine, hf, chunked):
    """The prefix cache holds K/V but no logits: a scored prompt takes none of it."""
    prompt = prompt_of(50, 8)
    run(api_engine, prompt, greedy(len(prompt) + 2), chunked)  # caches its 3 whole blocks
    _, again, queue = run(api_engine, prompt, greedy(len(prompt) + 2), chunked)[:3]
    assert queue.RequestStatInfo()["context_cached_length"] == 48
    _, first, queue = scored(api_engine, prompt, 1, chunked)
    assert queue.RequestStatInfo()["context_cached_length"] == 0
    check(first, reference(hf, prompt, 1), 1)


def test_a_one_token_prompt_has_none(api_engine, chunked):
    ids, first, _ = scored(api_engine, [7], 2, chunked)
    assert len(ids) == 4 and first.prompt_token_logprobs_list == first.prompt_log_probs_list == []


@pytest.mark.parametrize("bad", [-1, 11, True, 1.5])
def test_bad_values_are_refused(api_engine, bad):
    engine, name, loader = api_engine
    status, *_ = engine.start_request_ids(name, loader, [5, 6, 7], {"max_length": 8, "prompt_logprobs": bad})
    assert status == AsStatus.ALLSPARK_PARAM_ERROR
    assert "prompt_logprobs" in engine.last_error
