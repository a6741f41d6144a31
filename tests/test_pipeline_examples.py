"""Every example of LMDeploy's pipeline documentation, as written there but for the model (the tiny
random LLaMA; the examples with tp=2 run over two simulated NUMA nodes), then the default model
(SmolLM2) for what needs a model that answers: the chat template, eos, min_new_tokens, ignore_eos."""
import glob
import os

import pytest

from dashinfer_client import (GenerationConfig, PytorchEngineConfig, Response, TurbomindEngineConfig,
                              default_model, pipeline)
from tests.group_helpers import our_files

PROMPTS = ['Hi, pls intro yourself', 'Shanghai is']
CHATS = [[{'role': 'user', 'content': 'Hi, pls intro yourself'}], [{'role': 'user', 'content': 'Shanghai is'}]]


@pytest.fixture(scope="module")
def model(serialized_tiny):
    loader = serialized_tiny("llama", max_position_embeddings=8192)
    return os.path.join(loader.model_output_dir, loader.serialize_model_name)


@pytest.fixture
def two_nodes(monkeypatch):
    """Two simulated NUMA nodes (cpu 0, cpu 1); afterwards no rank runs and no socket or shared
    memory of ours is left (mpich's own /dev/shm files cannot be told apart from other jobs')."""
    monkeypatch.setenv("DASHINFER_NUMA_NODES", "0:0;1:1")
    pipes = []
    before = our_files()
    yield pipes
    for p in pipes:
        p.close()
    assert our_files() <= before, "the ranks left files behind"
    assert not _children(), "a rank group is still running"


def _children():
    """Live (not zombie) processes whose parent is this one."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            out.append(stat)
    return out


def _check_batch(response, capsys, n_max=None):
    printed = capsys.readouterr().out
    assert [type(r) for r in response] == [Response, Response]
    assert [r.session_id for r in response] == [0, 1]
    assert all(r.finish_reason in ("stop", "length") and r.generate_token_len > 0 for r in response)
    assert all(f"session_id={r.session_id}" in printed for r in response)
    if n_max:
        assert all(r.generate_token_len <= n_max for r in response)


def test_example_default_parameters(model, capsys):
    pipe = pipeline(model)
    response = pipe(['Hi, pls intro yourself', 'Shanghai is'])
    print(response)
    _check_batch(response, capsys, n_max=512)
    pipe.close()


def test_example_kv_cache_ratio(model, capsys):
    backend_config = TurbomindEngineConfig(cache_max_entry_count=0.2)
    pipe = pipeline(model, backend_config=backend_config)
    response = pipe(['Hi, pls intro yourself', 'Shanghai is'])
    print(response)
    _check_batch(response, capsys)
    pipe.close()


def test_example_tensor_parallel_equals_one_rank(model, two_nodes, capsys):
    backend_config = TurbomindEngineConfig(tp=2)
    pipe = pipeline(model, backend_config=backend_config)
    two_nodes.append(pipe)
    response = pipe(['Hi, pls intro yourself', 'Shanghai is'])
    print(response)
    _check_batch(response, capsys)
    greedy_cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    with pipeline(model) as one_rank:
        assert ([r.token_ids for r in pipe(PROMPTS, greedy_cfg)]
                == [r.token_ids for r in one_rank(PROMPTS, greedy_cfg)])


def test_example_sampling_parameters(model, two_nodes, capsys):
    backend_config = TurbomindEngineConfig(tp=2)
    gen_config = GenerationConfig(top_p=0.8,
                                  top_k=40,
                                  temperature=0.8,
                                  max_new_tokens=1024)
    pipe = pipeline(model, backend_config=backend_config)
    two_nodes.append(pipe)
    response = pipe(['Hi, pls intro yourself', 'Shanghai is'], gen_config=gen_config)
    print(response)
    _check_batch(response, capsys, n_max=1024)


def test_example_openai_format_and_streaming(model, two_nodes, capsys):
    backend_config = TurbomindEngineConfig(tp=2)
    gen_config = GenerationConfig(top_p=0.8, top_k=40, temperature=0.8, max_new_tokens=1024)
    pipe = pipeline(model, backend_config=backend_config)
    two_nodes.append(pipe)
    prompts = [[{'role': 'user', 'content': 'Hi, pls intro yourself'}],
               [{'role': 'user', 'content': 'Shanghai is'}]]
    response = pipe(prompts, gen_config=gen_config)
    print(response)
    _check_batch(response, capsys, n_max=1024)
    items = []
    for item in pipe.stream_infer(prompts, gen_config=gen_config):
        print(item)
        items.append(item)
    assert {i.session_id for i in items} == {0, 1}
    assert [i.session_id for i in items if i.finish_reason] in ([0, 1], [1, 0])
    assert len(capsys.readouterr().out.splitlines()) == len(items)


def test_example_pytorch_backend(model, capsys):
    backend_config = PytorchEngineConfig(session_len=2048)
    gen_config = GenerationConfig(top_p=0.8, top_k=40, temperature=0.8, max_new_tokens=1024)
    pipe = pipeline(model, backend_config=backend_config)
    response = pipe(CHATS, gen_config=gen_config)
    print(response)
    _check_batch(response, capsys, n_max=1024)
    assert pipe.session_len == 2048
    pipe.close()


# ---- the default model ------------------------------------------------------------------------

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm2():
    default_model.ensure_default_model("bfloat16", progress=False)
    with pipeline(None, backend_config=TurbomindEngineConfig(session_len=512, max_batch_size=4)) as pipe:
        yield pipe


def test_default_model_answers_and_stops_at_eos(smollm2):
    r = smollm2(QUESTION, GenerationConfig(max_new_tokens=48))
    assert "Paris" in r.text and r.finish_reason == "stop" and r.generate_token_len < 48
    tok = smollm2.tokenizer
    assert r.input_token_len == len(tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True), add_special_tokens=False))


def test_ignore_eos_runs_to_max_new_tokens(smollm2):
    short = smollm2(QUESTION, GenerationConfig(max_new_tokens=48))
    n = short.generate_token_len + 6
    r = smollm2(QUESTION, GenerationConfig(max_new_tokens=n, ignore_eos=True))
    assert r.generate_token_len == n and r.finish_reason == "length"
    assert r.token_ids[:short.generate_token_len] == short.token_ids  # the eos was the next token
    assert r.token_ids[short.generate_token_len] in smollm2.eos_ids


def test_min_new_tokens_holds_off_eos(smollm2):
    short = smollm2(QUESTION, GenerationConfig(max_new_tokens=48))
    at_least = short.generate_token_len + 5
    r = smollm2(QUESTION, GenerationConfig(max_new_tokens=at_least + 40, min_new_tokens=at_least))
    assert r.generate_token_len >= at_least and r.token_ids[:short.generate_token_len] == short.token_ids


def test_default_model_streams_whole_characters(smollm2):
    gen = GenerationConfig(max_new_tokens=40)
    prompt = "Write the word 'café' and a smiley emoji, nothing else."
    whole = smollm2(prompt, gen)
    pieces = [p.text for p in smollm2.stream_infer(prompt, gen)]
    assert "".join(pieces) == whole.text
    assert all(whole.text.startswith("".join(pieces[:j])) for j in range(len(pieces)))
