"""The default model (SmolLM2-135M-Instruct) through the Engine, against transformers.

transformers' greedy tokens (and their top-2 logit margins) are computed once and cached beside
the transformers reference model (~/.cache/dashinfer-py/test-reference/...), as that model is.
"""
import hashlib
import json
import os

import pytest

import dashinfer_client as allspark
from dashinfer_client import AsStatus, GenerateRequestStatus, default_model
from tests.engine_helpers import DEFAULT_KV_FORMAT, collect, greedy
from tests.gguf_builders import gguf_reference_dir
from tests.helpers import build_tiny_tokenizer, chat_prompt_ids

QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.",
             "Explain gravity to a child.", "List three prime numbers.")
NEW_TOKENS = 64
# Where the greedy paths may part: a step whose top-2 logits transformers separates by less
# than this. With bf16 K/V (the default cache of fp32 models for now) two exact fp32
# implementations already differ by ~0.1 in SmolLM2's logits: its residual stream reaches 25,000,
# so a 1e-7 difference before the cache flips K elements by a bf16 ulp. With fp32 K/V: 1e-3.
NEAR_TIE = {"bf16": 0.25, "fp32": 1e-3}[DEFAULT_KV_FORMAT]


@pytest.fixture(scope="module")
def tokenizer_and_prompts():
    model = allspark.DashInferModel(*default_model.ensure_default_model("bfloat16", progress=False))
    tok = model.get_tokenizer()
    return tok, [chat_prompt_ids(tok, q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(tokenizer_and_prompts):
    """Per prompt: transformers' greedy ids (eos an ordinary token) and per step its top-2 ids and
    their logit margin."""
    _, prompts = tokenizer_and_prompts
    ref_dir = gguf_reference_dir(default_model.default_model_path(), default_model.cache_root())
    key = hashlib.sha256(json.dumps([prompts, NEW_TOKENS]).encode()).hexdigest()[:16]
    path = os.path.join(ref_dir, f"greedy-{key}.json")
    if not os.path.exists(path):
        result = _transformers_greedy(ref_dir, prompts)
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
    with open(path) as f:
        return json.load(f)


def _transformers_greedy(ref_dir, prompts):
    import torch
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # generate 64 tokens, eos included, like the engine
    out = []
    with torch.no_grad():
        for p in prompts:
            o = hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                            output_logits=True, return_dict_in_generate=True)
            logits = torch.stack(o.logits)[:, 0]
            top = logits.topk(2, -1)
            out.append({"ids": o.sequences[0, len(p):].tolist(), "top2": top.indices.tolist(),
                        "margin": (top.values[:, 0] - top.values[:, 1]).tolist()})
    return out


def start(dtype, name, max_batch=4, quant=None):
    model_dir, prefix = default_model.ensure_default_model(dtype, quant=quant, progress=False)
    loader = allspark.DashInferModel(model_dir, prefix)
    engine = allspark.Engine()
    cfg = loader.create_reference_runtime_config_builder(name, allspark.TargetDevice.CPU, [0],
                                                         max_batch=max_batch).max_length(256).max_prefill_length(64).build()
    assert engine.install_model(cfg) == AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model(name) == AsStatus.ALLSPARK_SUCCESS
    return engine, loader


def test_fp32_greedy_equals_transformers(tokenizer_and_prompts, reference):
    _, prompts = tokenizer_and_prompts
    engine, loader = start("float32", "smol-fp32")
    try:
        queues = [engine.start_request_ids("smol-fp32", loader, p, greedy(len(p) + NEW_TOKENS))[2]
                  for p in prompts]
        outs = [collect(q)[0] for q in queues]
    finally:
        engine.release_model("smol-fp32")
    identical = 0
    for question, out, ref in zip(QUESTIONS, outs, reference):
        assert len(out) == NEW_TOKENS
        diff = next((i for i, (a, b) in enumerate(zip(out, ref["ids"])) if a != b), None)
        if diff is None:
            identical += 1
            continue
        # the paths may part only at a near-tie, the engine taking transformers' runner-up
        assert ref["margin"][diff] < NEAR_TIE and out[diff] == ref["top2"][diff][1], \
            f"{question!r}: token {diff} is {out[diff]}, transformers' top-2 {ref['top2'][diff]} " \
            f"are {ref['margin'][diff]:.3f} apart"
    assert identical >= 3


def test_bf16_answers_paris(tokenizer_and_prompts):
    tok, prompts = tokenizer_and_prompts
    engine, loader = start("bfloat16", "smol-bf16", max_batch=1)
    try:
        gen = loader.create_reference_generation_config_builder().update(
            {"do_sample": False, "top_k": 0, "max_length": len(prompts[0]) + 40})
        status, handle, queue = engine.start_request_ids("smol-bf16", loader, prompts[0], gen)
        assert status == AsStatus.ALLSPARK_SUCCESS
        ids, _ = collect(queue)
        assert queue.GenerateStatus() == GenerateRequestStatus.GenerateFinished
    finally:
        engine.release_model("smol-bf16")
    answer = tok.decode(ids, skip_special_tokens=True)
    assert "Paris" in answer, answer
    assert ids[-1] in loader.config.eos_token_id  # it stopped by itself, at eos


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_release_model_frees_its_memory():
    before = _rss_mb()
    engine, loader = start("bfloat16", "smol-rss", max_batch=1)
    running = _rss_mb()
    assert engine.release_model("smol-rss") == AsStatus.ALLSPARK_SUCCESS
    after = _rss_mb()
    weights_mb = 135e6 * 2 / 2**20
    assert running - before > 0.8 * weights_mb
    assert after - before < 0.25 * (running - before), (before, running, after)


def test_chat_streams_the_answer(capsys):
    from dashinfer_server.cli import main
    assert main(["chat", "--max-new-tokens", "12", "What is the capital of France?"]) == 0
    out, err = capsys.readouterr()
    assert "Paris" in out
    assert "time to first token" in err and "decode" in err


def test_incremental_decoding_keeps_multibyte_characters_whole(tmp_path):
    from transformers import AutoTokenizer
    from dashinfer_client.detokenize import IncrementalDecoder
    tok = AutoTokenizer.from_pretrained(build_tiny_tokenizer(str(tmp_path)))
    text = "café 日本 🚀!"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text.encode())  # one token per byte: characters span several tokens
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push([i]) for i in ids]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert pieces[text.encode().index("日".encode()) + 2] == "日"  # its third byte completes it
