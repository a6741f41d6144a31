"""ASGenerationConfigBuilder: every option, every refusal, and the built config as a dict."""
import json
import math

import pytest

from dashinfer_client import ASGenerationConfig, ASGenerationConfigBuilder


# ---- generation config ---------------------------------------------------------------------------

DASHINFER_DEFAULTS = dict(do_sample=True, temperature=1.0, top_k=50, top_p=1.0, max_length=20,
                          min_length=0, early_stopping=True, stop_words_ids=[], bad_words_ids=[], eos_token_id=0,
                          no_repeat_ngram_size=0, repetition_penalty=1.0, length_penalty=1.0,
                          presence_penalty=0.0, suppress_repetition_in_generation=False,
                          logprobs=False, top_logprobs=0, lora_name="", mm_info=None,
                          response_format=None, uuid="", vocab=None, vocab_type=None,
                          enable_tensors_from_model_inference=False, frequency_penalty=0.0,
                          logit_bias={}, min_p=0.0,  # OpenAI's, at their neutral value
                          prompt_logprobs=None)  # vLLM's, off


def test_generation_defaults_are_dashinfers():
    d = ASGenerationConfigBuilder().build().to_dict()
    seed = d.pop("seed")
    assert d == DASHINFER_DEFAULTS
    assert 1 <= seed <= 2**31 - 1


def test_generation_seed_default_random_or_given():
    seeds = {ASGenerationConfigBuilder().build().seed for _ in range(4)}
    assert len(seeds) > 1
    assert ASGenerationConfigBuilder(seed=1234).build().seed == 1234
    assert ASGenerationConfigBuilder(eos_token_id=7).build().eos_token_id == 7


mm = object()
SETTERS = [
    ("do_sample", False), ("temperature", 0.0), ("temperature", 0.7), ("top_k", 0), ("top_k", 40),
    ("top_p", 0.8), ("top_p", 1), ("max_length", 256), ("min_length", 5), ("early_stopping", False),
    ("stop_words_ids", [[5, 6], [7]]), ("eos_token_id", 2), ("eos_token_id", [2, 3]),
    ("no_repeat_ngram_size", 3), ("repetition_penalty", 1.1), ("length_penalty", -0.5),
    ("presence_penalty", -1.5), ("suppress_repetition_in_generation", True), ("seed", 2**64 - 1),
    # the one rule: repetition_penalty > 0 (transformers'), presence_penalty finite (DashInfer's)
    ("repetition_penalty", 2.5), ("presence_penalty", 3.0), ("presence_penalty", -2.5),
    ("seed", 0), ("logprobs", True), ("lora_name", "adapter"), ("mm_info", mm),
    ("response_format", {"type": "json_object"}),
]


@pytest.mark.parametrize("key,value", SETTERS)
def test_generation_every_setter(key, value):
    via_setter = getattr(ASGenerationConfigBuilder(), key)(value).build()
    via_update = ASGenerationConfigBuilder().update({key: value}).build()
    assert via_setter[key] == value and getattr(via_update, key) == value


def test_generation_stores_floats_as_float():
    cfg = ASGenerationConfigBuilder().top_p(1).temperature(0).repetition_penalty(2).build()
    assert all(type(v) is float for v in (cfg.top_p, cfg.temperature, cfg.repetition_penalty))


def test_generation_flag_helpers_and_log_probs():
    b = ASGenerationConfigBuilder().do_sample(False).early_stopping(False)
    assert (b.build().do_sample, b.build().early_stopping) == (False, False)
    b.do_sample().early_stopping()
    assert (b.build().do_sample, b.build().early_stopping) == (True, True)
    cfg = b.log_probs(True, 10).build()
    assert (cfg.logprobs, cfg.top_logprobs) == (True, 10)
    cfg = b.log_probs(False, 0).build()
    assert (cfg.logprobs, cfg.top_logprobs) == (False, 0)
    cfg = ASGenerationConfigBuilder().logprobs().top_logprobs(3).build()
    assert (cfg.logprobs, cfg.top_logprobs) == (True, 3)
    assert ASGenerationConfigBuilder().with_mm_info(mm).build().mm_info is mm


def test_generation_normalizes_sequences():
    cfg = ASGenerationConfigBuilder().stop_words_ids(((1, 2), [3])).eos_token_id((4, 5)).build()
    assert cfg.stop_words_ids == [[1, 2], [3]] and cfg.eos_token_id == [4, 5]


def test_generation_reads_like_a_dict():
    cfg = ASGenerationConfigBuilder().top_k(9).build()
    assert cfg["top_k"] == 9 and cfg.get("top_k") == 9 and cfg.get("nope", 1) == 1
    assert "top_p" in cfg and "nope" not in cfg
    assert dict(cfg)["top_k"] == 9 and set(dict(cfg)) == set(DASHINFER_DEFAULTS) | {"seed"}
    with pytest.raises(KeyError):
        cfg["nope"]


def test_generation_build_is_a_snapshot():
    b = ASGenerationConfigBuilder().stop_words_ids([[1]])
    first = b.build()
    b.top_k(3).stop_words_ids([[2]])
    assert first.top_k == 50 and first.stop_words_ids == [[1]] and b.build().top_k == 3


def test_generation_to_dict_from_dict_round_trip():
    cfg = (ASGenerationConfigBuilder(seed=5).temperature(0.3).top_k(7).top_p(0.5).max_length(99)
           .min_length(2).stop_words_ids([[1, 2]]).eos_token_id([3, 4]).log_probs(True, 4)
           .presence_penalty(0.5).suppress_repetition_in_generation().build())
    d = cfg.to_dict()
    assert json.loads(json.dumps(d)) == d
    again = ASGenerationConfig.from_dict(d)
    assert again == cfg and again.to_dict() == d


def test_generation_neutral_dashinfer_keys_accepted():
    cfg = ASGenerationConfigBuilder().update({"num_beams": 1, "num_return_sequences": 1,
                                              "frequency_penalty": 0.0, "bad_words_ids": []}).build()
    assert "num_beams" not in cfg.to_dict()


class FailsToIterate:
    """A caller's object that claims to be iterable and is not (hypothesis found one)."""
    def __iter__(self):
        raise RuntimeError("no")


GEN_ERRORS = [
    ("top_p", 1.5), ("top_p", -0.1), ("top_p", math.nan), ("top_p", "0.9"),
    ("temperature", -0.1), ("temperature", math.inf), ("temperature", None), ("temperature", "hot"),
    ("temperature", math.nan), ("max_length", True), ("seed", 0.5), ("eos_token_id", [1, "x"]),
    ("top_k", -1), ("top_k", 2.5), ("top_k", "5"), ("top_k", True),
    ("max_length", 0), ("max_length", 1.0), ("min_length", -1),
    ("top_logprobs", 11), ("top_logprobs", -1),
    ("repetition_penalty", 0), ("repetition_penalty", -1.2), ("repetition_penalty", math.inf),
    ("presence_penalty", math.inf), ("presence_penalty", math.nan), ("presence_penalty", "0.5"),
    ("length_penalty", "1"), ("no_repeat_ngram_size", -1),
    ("seed", -1), ("seed", 2**64), ("seed", "42"),
    ("eos_token_id", -1), ("eos_token_id", []), ("eos_token_id", "2"), ("eos_token_id", [1, -2]),
    ("stop_words_ids", [[]]), ("stop_words_ids", [1, 2]), ("stop_words_ids", "ab"),
    ("stop_words_ids", [[1, "x"]]), ("bad_words_ids", [[]]), ("bad_words_ids", [3]),
    ("do_sample", "yes"), ("do_sample", 1), ("early_stopping", None), ("logprobs", 1),
    ("suppress_repetition_in_generation", "true"), ("lora_name", 5), ("response_format", "json"),
    ("eos_token_id", FailsToIterate()), ("stop_words_ids", [FailsToIterate()]),
]


@pytest.mark.parametrize("key,value", GEN_ERRORS)
def test_generation_refusals_name_the_key(key, value):
    with pytest.raises(ValueError, match=key):
        getattr(ASGenerationConfigBuilder(), key)(value)
    with pytest.raises(ValueError, match=key):
        ASGenerationConfigBuilder().update({key: value})
    with pytest.raises(ValueError, match=key):
        ASGenerationConfig.from_dict({key: value})


def test_generation_range_messages_say_what_is_allowed():
    with pytest.raises(ValueError, match=r"top_p must be in \[0, 1\], got 1.5"):
        ASGenerationConfigBuilder().top_p(1.5)
    with pytest.raises(ValueError, match=r"top_logprobs must be in \[0, 10\], got 11"):
        ASGenerationConfigBuilder().log_probs(True, 11)


@pytest.mark.parametrize("fields,key", [
    ({"num_beams": 4}, "num_beams"), ({"num_return_sequences": 2}, "num_return_sequences"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"), ({"bad_words_ids": [[1, -1]]}, "bad_words_ids"),
    ({"top_kk": 3}, "top_kk"), ({"uuid": 5}, "uuid"),
])
def test_generation_update_refuses_unknown_or_unsupported(fields, key):
    with pytest.raises(ValueError, match=key):
        ASGenerationConfigBuilder().update(fields)


@pytest.mark.parametrize("fields,words", [
    ({"logit_bias": {5: 100.5}}, ["logit_bias[5]", "[-100, 100]"]), ({"logit_bias": {-1: 1}}, ["logit_bias", ">= 0"]),
    ({"logit_bias": {"x": 1}}, ["logit_bias token id", "int"]), ({"logit_bias": [[5, 1]]}, ["logit_bias", "dict"]),
    ({"logit_bias": {5: float("nan")}}, ["logit_bias[5]"]), ({"min_p": 1.5}, ["min_p", "[0, 1]"]),
    ({"min_p": -0.1}, ["min_p"]), ({"frequency_penalty": -2.5}, ["frequency_penalty", "[-2, 2]"]),
])
def test_openai_sampling_options_refused_outside_openai_ranges(fields, words):
    with pytest.raises(ValueError) as e:
        ASGenerationConfigBuilder().update(fields)
    assert all(w in str(e.value) for w in words), e.value


def test_logit_bias_takes_json_keys_and_survives_json():
    cfg = ASGenerationConfigBuilder().update({"logit_bias": {"7": -100, 9: 2}, "min_p": 0.1,
                                              "frequency_penalty": -2}).build()
    assert cfg.logit_bias == {7: -100.0, 9: 2.0} and cfg.min_p == 0.1 and cfg.frequency_penalty == -2.0
    assert ASGenerationConfig(json.loads(json.dumps(cfg.to_dict()))) == cfg  # what a ClientEngine sends


def test_generation_cross_field_checks_at_build():
    with pytest.raises(ValueError, match="min_length"):
        ASGenerationConfigBuilder().max_length(10).min_length(11).build()
    with pytest.raises(ValueError, match="top_logprobs=3 needs logprobs"):
        ASGenerationConfigBuilder().top_logprobs(3).build()
    assert ASGenerationConfigBuilder().max_length(10).min_length(10).build().min_length == 10


def test_generation_failed_update_changes_nothing():
    b = ASGenerationConfigBuilder().top_k(4)
    with pytest.raises(ValueError, match="top_p"):
        b.update({"top_k": 9, "top_p": 2})
    with pytest.raises(ValueError, match="nope"):
        b.update({"top_k": 9, "nope": 1})
    assert b.build().top_k == 4


def test_generation_from_transformers_generation_config():
    from transformers import GenerationConfig
    hf = GenerationConfig(do_sample=False, temperature=0.6, top_k=20, top_p=0.8, repetition_penalty=1.05,
                          length_penalty=0.9, min_length=3, no_repeat_ngram_size=2, eos_token_id=[2, 7],
                          max_length=4096)
    cfg = ASGenerationConfigBuilder(hf, seed=11).build()
    assert (cfg.temperature, cfg.top_k, cfg.top_p) == (0.6, 20, 0.8)
    assert (cfg.repetition_penalty, cfg.length_penalty) == (1.05, 0.9)
    # a list of eos ids, as DashInfer: the first is eos_token_id, each one a stop word
    assert (cfg.min_length, cfg.no_repeat_ngram_size, cfg.eos_token_id, cfg.seed) == (3, 2, 2, 11)
    assert cfg.stop_words_ids == [[2], [7]]
    # DashInfer turns sampling and early stopping on, and leaves max_length to the request
    assert (cfg.do_sample, cfg.early_stopping, cfg.max_length) == (True, True, 20)


def test_generation_from_sparse_transformers_config_keeps_defaults():
    from transformers import GenerationConfig
    cfg = ASGenerationConfigBuilder(GenerationConfig(eos_token_id=2), eos_token_id=9).build()
    expected = dict(DASHINFER_DEFAULTS, eos_token_id=2)
    assert {k: v for k, v in cfg.to_dict().items() if k != "seed"} == expected
    assert ASGenerationConfigBuilder(GenerationConfig(), eos_token_id=9).build().eos_token_id == 9


def test_generation_from_generation_config_json_dict():
    gen_json = {"bos_token_id": 1, "eos_token_id": [2], "pad_token_id": 2, "temperature": 0.2,
                "top_p": 0.9, "transformers_version": "4.42.0", "do_sample": True}
    cfg = ASGenerationConfigBuilder(gen_json).build()
    assert (cfg.eos_token_id, cfg.temperature, cfg.top_p, cfg.top_k) == (2, 0.2, 0.9, 50)
    assert cfg.stop_words_ids == [[2]]


def test_generation_from_hf_refusals():
    from transformers import GenerationConfig
    with pytest.raises(ValueError, match="num_return_sequences"):
        ASGenerationConfigBuilder(GenerationConfig(num_return_sequences=2, num_beams=2))
    with pytest.raises(ValueError, match="top_p"):
        ASGenerationConfigBuilder({"top_p": 1.5})
    with pytest.raises(ValueError, match="hf_gen_config"):
        ASGenerationConfigBuilder("greedy")


def test_generation_built_config_is_a_dict_as_upstreams():
    """DashInfer's build() returns a dict: users index, copy, iterate and serialize it."""
    cfg = ASGenerationConfigBuilder(seed=3).top_k(9).build()
    assert isinstance(cfg, dict) and cfg["top_k"] == cfg.top_k == 9
    cfg["response_format"] = {"type": "json_object"}
    cfg.top_p = 0.5  # attribute writes are dict writes
    assert dict(cfg.items())["response_format"] == {"type": "json_object"} and cfg["top_p"] == 0.5
    copied = cfg.copy()
    copied["top_k"] = 1
    assert cfg["top_k"] == 9
    assert json.loads(json.dumps(cfg)) == cfg and ASGenerationConfig(json.loads(json.dumps(cfg))) == cfg
    with pytest.raises(AttributeError, match="nope"):
        cfg.nope = 1


def test_generation_changed_config_is_checked_again():
    cfg = ASGenerationConfigBuilder().build()
    cfg["top_p"] = 7
    with pytest.raises(ValueError, match="top_p"):
        cfg.validate()
    cfg["top_p"], cfg["uuid"] = 0.5, 7
    with pytest.raises(ValueError, match="uuid"):
        cfg.validate()
    del cfg["uuid"], cfg["top_k"]
    assert cfg.validate()["top_k"] == 50  # a key taken out is back at its default


def test_generation_temperature_zero_is_accepted_as_greedy():
    assert ASGenerationConfigBuilder().temperature(0).build().validate()["temperature"] == 0.0
