"""request.py: what a new request is checked against (the model's vocabulary, the engine's
max_length, the KV cache, what this runtime implements) and the Sequence it becomes."""
import numpy as np
import pytest

from dashinfer_client import ASGenerationConfigBuilder, AsStatus
from dashinfer_server.request import ModelLimits, RequestError, check_options, check_prompt, new_request

LIMITS = ModelLimits(vocab_size=100, max_length=64, kv_capacity=1000)
E = AsStatus


def refused(call, status, words):
    with pytest.raises(RequestError, match=words) as e:
        call()
    assert e.value.status == status


def test_a_request_is_one_sequence_with_its_tokens_options_and_queue():
    gen = ASGenerationConfigBuilder(seed=3).update({"max_length": 40, "temperature": 0.0, "uuid": "r1"})
    seq = new_request(np.array([[5, 6, 7]]), gen.build(), LIMITS)
    assert seq.tokens == [5, 6, 7] and seq.prompt_len == 3 and seq.max_length == 40
    assert seq.sampling.tokens is seq.tokens and seq.sampling.greedy  # temperature 0 = greedy
    assert seq.queue.RequestStatInfo().context_token_length == 3
    assert seq.queue.RequestStatInfo().uuid == "r1"  # the caller's request id, kept


def test_options_are_a_snapshot_of_the_users_config():
    cfg = ASGenerationConfigBuilder().max_length(40).build()
    params = check_options(cfg, LIMITS, 3)
    cfg["top_k"] = 1
    assert params["top_k"] == 50 and type(params) is dict


@pytest.mark.parametrize("options,status,words", [
    (dict(eos_token_id=[3, 100]), E.ALLSPARK_PARAM_ERROR, "eos_token_id .* outside the vocabulary 0..99"),
    (dict(stop_words_ids=[[1, 100]]), E.ALLSPARK_PARAM_ERROR, "stop_words_ids .* outside the vocabulary"),
    (dict(bad_words_ids=[[3], [1, 100]]), E.ALLSPARK_PARAM_ERROR, "bad_words_ids .* outside the vocabulary"),
    (dict(length_penalty=1.2), E.ALLSPARK_PARAM_ERROR, "length_penalty is not supported"),
    (dict(lora_name="a"), E.ALLSPARK_LORA_NOT_LOADED, "LoRA"),
    (dict(mm_info={"images": []}), E.ALLSPARK_PARAM_ERROR, "mm_info"),
    (dict(response_format={"type": "xml"}), E.ALLSPARK_PARAM_ERROR, "response_format: type must be"),
    (dict(max_length=65), E.ALLSPARK_EXCEED_LIMIT_ERROR, "65 exceeds the engine's 64"),
    (dict(max_length=10), E.ALLSPARK_EXCEED_LIMIT_ERROR, "leaves no room after the 10-token prompt"),
    (dict(top_p=2.0), E.ALLSPARK_PARAM_ERROR, "generate_config: top_p"),
    (dict(enable_tensors_from_model_inference=True), E.ALLSPARK_PARAM_ERROR, "no hidden states"),
    (dict(vocab={"a": 1, "b": 100}), E.ALLSPARK_PARAM_ERROR, "vocab has an id outside the vocabulary"),
])
def test_options_refused_for_this_model(options, status, words):
    refused(lambda: check_options({"max_length": 40, **options}, LIMITS, 10), status, words)


def test_a_changed_built_config_is_checked_again():
    cfg = ASGenerationConfigBuilder().max_length(40).build()
    cfg["temperature"] = -1.0
    refused(lambda: check_options(cfg, LIMITS, 3), E.ALLSPARK_PARAM_ERROR, "temperature must be >= 0")


@pytest.mark.parametrize("ids,status,words", [
    ([], E.ALLSPARK_EMPTY_REQUEST, "empty"),
    ([1, 100], E.ALLSPARK_PARAM_ERROR, "100 is outside the vocabulary"),
    ([1.5], E.ALLSPARK_PARAM_ERROR, "integers"),
    ([[1, 2], [3, 4]], E.ALLSPARK_PARAM_ERROR, "one sequence"),
    (list(range(64)), E.ALLSPARK_EXCEED_LIMIT_ERROR, "no room under max_length 64"),
])
def test_prompts_refused_for_this_model(ids, status, words):
    refused(lambda: check_prompt(ids, LIMITS), status, words)


def test_a_prompt_the_kv_cache_can_never_hold():
    small = ModelLimits(vocab_size=100, max_length=64, kv_capacity=16)
    refused(lambda: check_prompt([1] * 16, small), E.ALLSPARK_CACHE_MEMORY_OUT, "KV cache of 16 tokens")
    assert check_prompt(np.array([1] * 15, np.int32), small) == [1] * 15
