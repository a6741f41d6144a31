"""pipeline() at tp=1 on a tiny random LLaMA: the same tokens and logprobs as the Engine API, the
generation options each doing what they say, streaming, and bad input refused at the call."""
import importlib
import os

import pytest

import dashinfer_client as allspark
from dashinfer_client import (ChatTemplateConfig, GenerationConfig, PytorchEngineConfig, Response,
                              TurbomindEngineConfig, pipeline)
from dashinfer_client import default_model
from dashinfer_client.errors import ModelSerializerException
from tests.engine_helpers import collect, greedy

CONTEXT = 8192
QUESTION = "Hi, pls intro yourself"


@pytest.fixture(scope="module")
def tiny(serialized_tiny):
    """(serialized model path {dir}/{prefix}, loader) of the tiny LLaMA."""
    loader = serialized_tiny("llama", max_position_embeddings=CONTEXT)
    model_dir, prefix = loader.model_output_dir, loader.serialize_model_name
    return os.path.join(model_dir, prefix), allspark.DashInferModel(model_dir, prefix)


@pytest.fixture(scope="module")
def pipe(tiny):
    with pipeline(tiny[0], backend_config=TurbomindEngineConfig(session_len=256, max_batch_size=8)) as p:
        yield p


@pytest.fixture(scope="module")
def engine(tiny):
    """The in-process Engine serving the same model as `pipe` (TurbomindEngineConfig's defaults:
    64-token KV blocks, no prefix cache): the reference."""
    _, loader = tiny
    e = allspark.Engine()
    cfg = (loader.create_reference_runtime_config_builder("ref", allspark.TargetDevice.CPU, [0], max_batch=8)
           .max_length(256).kv_cache_span_size(64).prefill_cache(False).build())
    assert e.install_model(cfg) == allspark.AsStatus.ALLSPARK_SUCCESS
    assert e.start_model("ref") == allspark.AsStatus.ALLSPARK_SUCCESS
    yield e, loader
    e.release_model("ref")


def chat_ids(tokenizer, text):
    """The prompt ids of one user turn under the tokenizer's own chat template (transformers)."""
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                          add_generation_prompt=True), add_special_tokens=False)


def engine_ids(engine, ids, new, **options):
    e, loader = engine
    status, handle, queue = e.start_request_ids("ref", loader, ids, greedy(len(ids) + new, **options))
    assert status == allspark.AsStatus.ALLSPARK_SUCCESS
    out, elements = collect(queue)
    e.release_request("ref", handle)
    return out, elements


def first_plain_token(tokenizer, ids):
    """(index, text) of the first generated token that is one printable ASCII character whose encoding
    is that token alone and which did not occur before it."""
    for k, t in enumerate(ids):
        text = tokenizer.decode([t])
        if len(text) == 1 and text.isprintable() and text.isascii() and t not in ids[:k] \
                and tokenizer.encode(text, add_special_tokens=False) == [t]:
            return k, text
    raise AssertionError(f"no plain single-character token in the greedy answer {ids}: the test needs one")


def test_greedy_equals_the_engine(pipe, engine, tiny):
    tok = tiny[1].get_tokenizer()
    ids = chat_ids(tok, QUESTION)
    expected, _ = engine_ids(engine, ids, 24)
    r = pipe(QUESTION, GenerationConfig(max_new_tokens=24, ignore_eos=True))
    assert isinstance(r, Response)
    assert r.token_ids == expected and r.input_token_len == len(ids) and r.generate_token_len == 24
    assert r.text == tok.decode(expected, skip_special_tokens=True) and r.finish_reason == "length"
    assert r.session_id == 0 and "finish_reason='length'" in repr(r)


def test_a_batch_keeps_input_order_and_equals_single_calls(pipe):
    prompts = [QUESTION, "Shanghai is", "abc", [{"role": "user", "content": "Shanghai is"}]]
    gen = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    batch = pipe(prompts, gen_config=gen)
    assert [r.session_id for r in batch] == [0, 1, 2, 3]
    assert [r.token_ids for r in batch] == [pipe(p, gen_config=gen).token_ids for p in prompts]
    assert batch[1].token_ids == batch[3].token_ids  # a str is one user turn


def test_logprobs_equal_the_engines(pipe, engine, tiny):
    ids = chat_ids(tiny[1].get_tokenizer(), QUESTION)
    _, elements = engine_ids(engine, ids, 8, logprobs=True, top_logprobs=3)
    expected = [{**dict(top), t: lp} for e in elements
                for t, lp, top in zip(e.ids_from_generate, e.token_logprobs_list, e.log_probs_list)]
    r = pipe(QUESTION, GenerationConfig(max_new_tokens=8, ignore_eos=True, logprobs=3))
    assert len(r.logprobs) == 8 and all(len(d) in (3, 4) for d in r.logprobs)
    assert r.logprobs == expected  # the same engine computation: equal, not close
    assert pipe(QUESTION, GenerationConfig(max_new_tokens=2)).logprobs is None


def test_stop_words_end_the_answer_before_the_word(pipe, tiny):
    tok = tiny[1].get_tokenizer()
    free = pipe(QUESTION, GenerationConfig(max_new_tokens=16, ignore_eos=True)).token_ids
    k, word = first_plain_token(tok, free)
    r = pipe(QUESTION, GenerationConfig(max_new_tokens=16, ignore_eos=True, stop_words=[word]))
    assert r.token_ids == free[:k] and r.finish_reason == "stop" and not r.text.endswith(word)


def test_bad_words_are_never_generated(pipe, tiny):
    tok = tiny[1].get_tokenizer()
    free = pipe(QUESTION, GenerationConfig(max_new_tokens=16, ignore_eos=True)).token_ids
    k, word = first_plain_token(tok, free)
    r = pipe(QUESTION, GenerationConfig(max_new_tokens=16, ignore_eos=True, bad_words=[word]))
    assert r.token_ids[:k] == free[:k] and free[k] not in r.token_ids and len(r.token_ids) == 16


def test_sampling_with_a_seed_repeats_and_differs_from_greedy(pipe):
    gen = GenerationConfig(max_new_tokens=16, ignore_eos=True, top_k=40, top_p=0.8, temperature=1.5,
                           random_seed=7)
    first, again = pipe(QUESTION, gen), pipe(QUESTION, gen)
    greedy_ids = pipe(QUESTION, GenerationConfig(max_new_tokens=16, ignore_eos=True)).token_ids
    assert first.token_ids == again.token_ids != greedy_ids


def test_scripts_for_either_lmdeploy_sample_as_they_did_there(pipe, engine, tiny):
    """LMDeploy >= 0.6 (do_sample, default False = greedy without repetition penalty; top_k 50) and
    < 0.6 (no do_sample; top_k 1, its default, is greedy, so the doc's top_k=40 samples): each script
    decodes as it did there."""
    seeds = range(5)
    greedy_ids = pipe(QUESTION, GenerationConfig(max_new_tokens=16, ignore_eos=True)).token_ids

    def answers(**fields):
        return [pipe(QUESTION, GenerationConfig(max_new_tokens=16, ignore_eos=True, random_seed=s, **fields)).token_ids
                for s in seeds]
    new_style = answers(do_sample=True, temperature=1.0)
    assert len({tuple(a) for a in new_style}) > 1 and greedy_ids not in new_style
    ids = chat_ids(tiny[1].get_tokenizer(), QUESTION)  # top_k left unset is LMDeploy's 50
    sampled, _ = engine_ids(engine, ids, 16, do_sample=True, top_k=50, top_p=1.0, temperature=1.0, seed=0)
    assert new_style[0] == sampled
    assert answers(do_sample=False, top_k=40, top_p=0.8, temperature=1.5) == [greedy_ids] * len(seeds)
    # >= 0.6 also drops the repetition penalty of a greedy config; < 0.6 applied it
    assert answers(do_sample=False, repetition_penalty=3.0)[0] == greedy_ids
    assert answers(top_k=1, repetition_penalty=3.0)[0] != greedy_ids
    old_style = answers(top_k=40, top_p=0.8, temperature=0.8)  # the seeds doc's GenerationConfig
    assert len({tuple(a) for a in old_style}) > 1
    assert answers(top_p=0.8, temperature=1.5) == [greedy_ids] * len(seeds)  # top_k unset: < 0.6's 1


def test_deprecated_keywords_still_work(pipe):
    r = pipe(QUESTION, request_output_len=5, top_k=1, ignore_eos=True)
    assert r.generate_token_len == 5


def test_stream_pieces_add_up_to_the_answer(pipe):
    prompts = [QUESTION, "Shanghai is"]
    gen = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    whole = pipe(prompts, gen_config=gen)
    pieces = {0: [], 1: []}
    for item in pipe.stream_infer(prompts, gen_config=gen):
        pieces[item.session_id].append(item)
    for i, r in enumerate(whole):
        assert [p.finish_reason for p in pieces[i]][-1] == "length"
        assert all(p.finish_reason is None for p in pieces[i][:-1])
        assert sum((p.token_ids for p in pieces[i]), []) == r.token_ids
        assert "".join(p.text for p in pieces[i]) == r.text
        texts = [p.text for p in pieces[i]]  # no piece ends inside a character the whole text has
        assert all(r.text.startswith("".join(texts[:j])) for j in range(len(texts)))
        assert [p.generate_token_len for p in pieces[i]] == sorted(p.generate_token_len for p in pieces[i])


def test_closing_a_stream_early_leaves_the_pipeline_usable(pipe):
    stream = pipe.stream_infer([QUESTION, "abc"], GenerationConfig(max_new_tokens=200, ignore_eos=True))
    next(stream)
    stream.close()
    assert pipe("abc", GenerationConfig(max_new_tokens=3, ignore_eos=True)).generate_token_len == 3


def test_a_prompt_that_fills_the_session_gets_an_empty_length_answer(pipe):
    long_prompt = "x" * 300  # 300 byte tokens > session_len 256
    short, long_r = pipe(["abc", long_prompt], GenerationConfig(max_new_tokens=4, ignore_eos=True))
    assert long_r.text == "" and long_r.finish_reason == "length" and long_r.generate_token_len == 0
    assert long_r.input_token_len > 256 and long_r.session_id == 1
    assert short.generate_token_len == 4
    stream = list(pipe.stream_infer([long_prompt], GenerationConfig(max_new_tokens=4)))
    assert [(s.text, s.finish_reason) for s in stream] == [("", "length")]


def test_max_new_tokens_is_cut_at_the_session(pipe):
    r = pipe("y" * 200, GenerationConfig(max_new_tokens=100, ignore_eos=True))
    assert 200 < r.input_token_len < 240
    assert r.input_token_len + r.generate_token_len == 256 and r.finish_reason == "length"


def test_a_custom_system_prompt_and_builtin_templates(pipe, tiny):
    tok = tiny[1].get_tokenizer()
    gen = GenerationConfig(max_new_tokens=1)
    plain = pipe(QUESTION, gen).input_token_len
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}],
                                   tokenize=False, add_generation_prompt=True)
    with pipeline(tiny[0], chat_template_config=ChatTemplateConfig(meta_instruction="Be brief."),
                  session_len=256) as p:
        assert p(QUESTION, gen).input_token_len == len(tok.encode(text, add_special_tokens=False)) > plain
    chatml = ChatTemplateConfig(model_name="chatml")
    with pipeline(tiny[0], chat_template_config=chatml, session_len=256) as p:
        assert p(QUESTION, gen).input_token_len == plain  # the tiny model's own template is ChatML


@pytest.mark.parametrize("prompts,error,match", [
    (123, TypeError, "prompts must be"), ([], ValueError, "empty list"),
    (["a", 5], TypeError, r"prompts\[1\]"), ([[{"role": "robot", "content": "x"}]], ValueError, r"prompts\[0\]"),
    ([[{"role": "user"}]], ValueError, "content"),
])
def test_bad_prompts_are_named(pipe, prompts, error, match):
    with pytest.raises(error, match=match):
        pipe(prompts)
    assert pipe("abc", GenerationConfig(max_new_tokens=2, ignore_eos=True)).generate_token_len == 2


def test_bad_call_arguments_are_named(pipe):
    with pytest.raises(TypeError, match="gen_config"):
        pipe("abc", gen_config={"max_new_tokens": 3})
    with pytest.raises(TypeError, match="max_tokens"):
        pipe("abc", max_tokens=3)
    with pytest.raises(ValueError, match="do_preprocess"):
        pipe([{"role": "user", "content": "x"}], do_preprocess=False)
    with pytest.raises(TypeError, match="prompts must be"):
        pipe.stream_infer(3.5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(n=2), "only n=1"), (dict(top_p=1.5), "top_p"), (dict(temperature=-1.0), "temperature"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(stop_words="abc"), "stop_words"),
    (dict(bad_words=[""]), "bad_words"), (dict(logprobs=11), "logprobs"), (dict(min_p=1.5), "min_p"),
    (dict(do_sample="yes"), "do_sample"),
])
def test_bad_generation_configs_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GenerationConfig(**kwargs)


@pytest.mark.parametrize("make,error,match", [
    (lambda: TurbomindEngineConfig(rope_scaling_factor=2.0), ValueError, "rope_scaling_factor"),
    (lambda: TurbomindEngineConfig(quant_policy=3), ValueError, "quant_policy"),
    (lambda: TurbomindEngineConfig(tp=0), ValueError, "tp"),
    (lambda: TurbomindEngineConfig(cache_max_entry_count=1.5), ValueError, "cache_max_entry_count"),
    (lambda: TurbomindEngineConfig(model_format="awq"), ValueError, "model_format"),
    (lambda: TurbomindEngineConfig(unknown_field=1), TypeError, "unknown_field"),
    (lambda: PytorchEngineConfig(device_type="ascend"), ValueError, "device_type"),
    (lambda: PytorchEngineConfig(adapters={"a": "b"}), ValueError, "adapters"),
    (lambda: ChatTemplateConfig(model_name="vicuna"), ValueError, "vicuna"),
])
def test_bad_backend_configs_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_pipeline_arguments_are_named(tiny, tmp_path):
    with pytest.raises(ModelSerializerException, match="does not exist"):
        pipeline(str(tmp_path / "nowhere"))
    with pytest.raises(ModelSerializerException, match="cannot download"):
        pipeline("internlm/internlm2-chat-7b")
    with pytest.raises(TypeError, match="not_a_field"):
        pipeline(tiny[0], not_a_field=3)
    with pytest.raises(TypeError, match="backend_config"):
        pipeline(tiny[0], backend_config={"tp": 1})
    with pytest.raises(ValueError, match="model_format='gguf'"):
        pipeline(tiny[0], backend_config=TurbomindEngineConfig(model_format="gguf"))
    with pytest.raises(ValueError, match="log_level"):
        pipeline(tiny[0], log_level="LOUD")


def test_get_ppl_is_transformers_loss(pipe, tiny_checkpoint):
    """LMDeploy's get_ppl: per sequence, the mean cross-entropy after the first token (transformers'
    loss with labels = the ids), the sequences run together."""
    import numpy as np
    import torch
    from tests.helpers import load_hf_model
    hf = load_hf_model(tiny_checkpoint("llama", max_position_embeddings=CONTEXT))
    rng = np.random.default_rng(4)
    batch = [[int(t) for t in rng.integers(3, 272, n)] for n in (2, 40, 250)]
    expected = []
    for ids in batch:
        with torch.no_grad():
            expected.append(float(hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss))
    assert pipe.get_ppl(batch) == pytest.approx(expected, abs=1e-5)
    assert pipe.get_ppl(batch[1]) == pytest.approx(expected[1:2], abs=1e-5)  # one sequence: a list of one
    with pytest.raises(ValueError, match="at least 2"):
        pipe.get_ppl([[5]])


def test_closed_pipeline_refuses_calls(tiny):
    p = pipeline(tiny[0], session_len=128)
    p.close()
    p.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        p("abc")


def test_one_gen_config_per_prompt(pipe):
    gens = [GenerationConfig(max_new_tokens=3, ignore_eos=True), GenerationConfig(max_new_tokens=5, ignore_eos=True)]
    assert [r.generate_token_len for r in pipe(["abc", "abd"], gen_config=gens)] == [3, 5]
    with pytest.raises(ValueError, match="gen_config is a list of 1"):
        pipe(["abc", "abd"], gen_config=gens[:1])


@pytest.mark.parametrize("call", [
    lambda p: p("caf\udce9"), lambda p: p([{"role": "user", "content": "caf\udce9"}]),
    lambda p: p("caf\udce9", do_preprocess=False), lambda p: p("abc", GenerationConfig(stop_words=["\udce9"])),
    lambda p: list(p.stream_infer("caf\udce9")),
])
def test_a_lone_surrogate_is_refused_by_name(pipe, call):
    """Bytes that were not UTF-8 (Python decodes them to lone surrogates) are named, not a TypeError."""
    with pytest.raises(ValueError, match="not valid Unicode: a lone surrogate"):
        call(pipe)
    assert pipe("abc", GenerationConfig(max_new_tokens=2, ignore_eos=True)).generate_token_len == 2


def test_model_format_is_checked_before_any_conversion(tiny, tiny_checkpoint, tmp_path, monkeypatch):
    def convert(*args, **kwargs):
        raise AssertionError("the model was resolved (converted) before model_format was checked")
    monkeypatch.setattr(importlib.import_module("dashinfer_client.pipeline_api.pipeline"), "resolve_model", convert)
    gguf = tmp_path / "header-only.gguf"
    gguf.write_bytes(b"GGUF" + bytes(28))  # the magic is what makes a file a GGUF model
    cases = [(None, "hf", "gguf"), (None, "dashinfer", "gguf"), (default_model.MODEL_NAME, "hf", "gguf"),
             (tiny_checkpoint("llama", max_position_embeddings=CONTEXT), "gguf", "hf"), (str(gguf), "hf", "gguf"),
             (tiny[0], "hf", "dashinfer")]
    for path, wrong, kind in cases:
        with pytest.raises(ValueError, match=f"model_format={wrong!r} but .* is a {kind} model"):
            pipeline(path, backend_config=TurbomindEngineConfig(model_format=wrong))
