"""DashInfer's raw request API and what its own scripts rely on, on both engines (api_engine:
Engine in-process and ClientEngine over gRPC): start_request with DLPack / tensor / list inputs,
the get_* calls, the polling loops of upstream's EngineHelper, benchmark_throughput.py and its
rc2 x86 test (written anew here), the extra generation keys, upstream's keyword names, LoRA
refused. Reference: the ids the same greedy request gets through start_request_ids alone."""
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dashinfer_client import ASGenerationConfigBuilder, AsStatus, GeneratedElements, GenerateRequestStatus, VocabType
from tests.api_helpers import OK, alone, prompt_of, run
from tests.engine_helpers import collect, greedy

S = GenerateRequestStatus
PROMPT = prompt_of(9, 5)
NEW = 12


def _forms(ids):
    """The input_ids forms DashInfer scripts pass (the torch ones as its examples build them)."""
    import torch
    from torch.utils import dlpack
    return {
        "dlpack capsule of a [1, n] tensor": lambda: dlpack.to_dlpack(torch.tensor([ids])),
        "dlpack capsule of an int32 [n] tensor": lambda: dlpack.to_dlpack(torch.tensor(ids, dtype=torch.int32)),
        "dlpack capsule of a strided view": lambda: dlpack.to_dlpack(torch.tensor([[i, -1] for i in ids])[:, 0]),
        "torch tensor (__dlpack__)": lambda: torch.Tensor([ids]).to(torch.int64),
        "numpy array": lambda: np.array([ids], dtype=np.int64),
        "capsule numpy made": lambda: np.array(ids, dtype=np.int64).__dlpack__(),
        "versioned capsule (DLPack 1.0)": lambda: np.array([ids]).__dlpack__(max_version=(1, 0)),
        "list": lambda: list(ids),
        "list of one list": lambda: [list(ids)],
    }


def test_start_request_reads_every_input_form(api_engine):
    engine, name, _ = api_engine
    expected = alone(api_engine, PROMPT, NEW)
    for what, make in _forms(PROMPT).items():
        status, handle, queue = engine.start_request(name, {"input_ids": make()},
                                                     generate_config=greedy(len(PROMPT) + NEW).build())
        assert status == OK, (what, engine.last_error)
        assert collect(queue)[0] == expected, what
        assert engine.release_request(name, handle) == OK


def test_start_request_refusals(api_engine):
    engine, name, _ = api_engine
    import torch
    from torch.utils import dlpack
    used = dlpack.to_dlpack(torch.tensor([PROMPT]))
    np.from_dlpack(type("Once", (), {"__dlpack__": lambda s, **k: used, "__dlpack_device__": lambda s: (1, 0)})())
    gen = greedy(40).build()
    for inputs, words in [([1, 2], "inputs must be a dict"), ({}, "no 'input_ids'"),
                          ({"input_ids": PROMPT, "attention_mask": [1] * 9}, "'attention_mask'"),
                          ({"input_ids": used}, "not an unused DLPack tensor"),
                          ({"input_ids": [[1, 2], [3, 4]]}, "one sequence")]:
        status, handle, queue = engine.start_request(name, inputs, gen)
        assert (status, handle, queue) == (AsStatus.ALLSPARK_PARAM_ERROR, None, None), inputs
        assert words in engine.last_error, (inputs, engine.last_error)


def test_one_capsule_starts_several_requests(api_engine):
    """DashInfer copies a capsule's ids and leaves it unused: its performance examples pass one
    capsule to every request of a batch."""
    engine, name, _ = api_engine
    from torch.utils import dlpack
    import torch
    capsule = dlpack.to_dlpack(torch.tensor([PROMPT]))
    expected = alone(api_engine, PROMPT, NEW)
    for _ in range(2):
        status, handle, queue = engine.start_request(name, {"input_ids": capsule}, greedy(len(PROMPT) + NEW).build())
        assert status == OK, engine.last_error
        assert collect(queue)[0] == expected
        assert engine.release_request(name, handle) == OK


def test_dlpack_input_needs_no_torch():
    """numpy reads the capsule: with torch unimportable, a capsule still becomes the ids."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np\n"
            "from dashinfer_client.raw_inputs import input_ids_of\n"
            "ids = input_ids_of({'input_ids': np.array([[3, 4, 5]]).__dlpack__()})\n"
            "assert ids.tolist() == [[3, 4, 5]] and 'torch' not in [m for m in sys.modules if sys.modules[m]]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def _upstream_loop(engine, name, queue, raw):
    """The polling loop of DashInfer's EngineHelper / benchmark_throughput / rc2 x86 test: any
    status but Init, Generating or a final one is an error that ends the loop early. raw: through
    the engine's get_request_status / get_wait (v2's deprecated calls), else the queue's own."""
    out, unexpected = [], []
    while True:
        status = engine.get_request_status(name, queue) if raw else queue.GenerateStatus()
        if status == S.Init:
            pass
        elif status in (S.Generating, S.GenerateFinished):
            if raw:
                out += engine.get_wait(name, queue)
            else:
                ele = queue.Get()
                out += ele.ids_from_generate if ele is not None else []
            if status == S.GenerateFinished:
                return out, unexpected
        else:  # GenerateInterrupted, ContextFinished, ...
            unexpected.append(status)
            return out, unexpected


@pytest.mark.parametrize("raw", [False, True], ids=["queue", "engine-get-calls"])
def test_upstream_polling_loops_run_to_the_end(api_engine, raw):
    engine, name, _ = api_engine
    prompts = [prompt_of(7 + i, 20 + i) for i in range(4)]

    def one(prompt):
        gen = greedy(len(prompt) + 24)
        if raw:
            status, handle, queue = engine.start_request(name, {"input_ids": [prompt]}, generate_config=gen.build())
        else:  # as benchmark_throughput.py
            status, handle, queue = engine.start_request_ids(name, None, prompt, gen)
        assert status == OK
        result = _upstream_loop(engine, name, queue, raw)
        assert engine.release_request(name, request_handle=handle) == OK
        return result

    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    for prompt, (ids, unexpected) in zip(prompts, results):
        assert unexpected == [] and ids == alone(api_engine, prompt, 24)


def test_get_calls(api_engine):
    engine, name, _ = api_engine
    expected = alone(api_engine, PROMPT, NEW)
    status, handle, queue = engine.start_request(name, {"input_ids": PROMPT}, greedy(len(PROMPT) + NEW).build())
    assert status == OK and engine.sync_request(name, request_handle=handle) == OK
    assert engine.get_request_status(name, queue) == S.GenerateFinished
    assert engine.get_no_wait(name, queue) == expected  # all of it, ids only
    assert engine.get_no_wait(name, queue) == [] and engine.get_wait(name, queue) == []  # ended: []
    assert engine.get_output_no_wait(name, queue) is None and engine.get_output_wait(name, queue) is None
    engine.release_request(name, handle)
    status, handle, queue = engine.start_request(name, {"input_ids": PROMPT}, greedy(len(PROMPT) + NEW).build())
    engine.sync_request(name, handle)
    ele = engine.get_output_wait(name, queue)  # v1's name: the whole GeneratedElements
    assert isinstance(ele, GeneratedElements) and ele.ids_from_generate == expected
    assert ele.tensors_from_model_inference == []  # DashInfer's list of dicts
    engine.release_request(name, handle)
    for call in ("get_no_wait", "get_wait", "get_request_status", "get_output_wait", "get_output_no_wait"):
        with pytest.raises(TypeError, match=f"{call} takes the ResultQueue"):
            getattr(engine, call)(name, handle)


def test_uuid_is_kept_in_the_request_statistics(api_engine):
    engine, name, loader = api_engine
    gen = greedy(len(PROMPT) + 3)
    gen.update({"uuid": "req-42"})
    *_, queue, handle = run(api_engine, PROMPT, gen)
    assert queue.RequestStatInfo()["uuid"] == queue.RequestStatInfo().uuid == "req-42"
    engine.release_request(name, handle)
    *_, queue, handle = run(api_engine, PROMPT, greedy(len(PROMPT) + 3))
    assert queue.RequestStatInfo().uuid == ""
    engine.release_request(name, handle)


def test_eos_list_of_a_hf_generation_config_is_eos_and_stop_words(api_engine):
    """As DashInfer: GenerationConfig(eos_token_id=[a, b]) -> eos_token_id a, stop_words_ids
    [[a], [b]]; generating b ends the request as a stop word."""
    from transformers import GenerationConfig
    engine, name, _ = api_engine
    expected = alone(api_engine, PROMPT, NEW)
    b = expected[4]
    other = next(t for t in range(3, 200) if t not in expected)
    gen = ASGenerationConfigBuilder(GenerationConfig(eos_token_id=[other, b]), seed=1)
    gen.update({"do_sample": False, "top_k": 0, "max_length": len(PROMPT) + NEW})
    assert gen.build()["eos_token_id"] == other and gen.build()["stop_words_ids"] == [[other], [b]]
    ids, _, queue, handle = run(api_engine, PROMPT, gen)
    assert ids == expected[:expected.index(b) + 1] and queue.RequestStatInfo().finish_reason == "stop_words"
    engine.release_request(name, handle)


def test_a_single_eos_of_the_loader_is_no_stop_word(api_engine):
    """The model's one eos id (tiny LLaMA: 2) stays an int, so early_stopping(False) (as
    benchmark_throughput.py --test_random_input) runs every request to max_length."""
    _, _, loader = api_engine
    cfg = loader.create_reference_generation_config_builder().build()
    assert cfg["eos_token_id"] == 2 and cfg["stop_words_ids"] == []


def test_the_extra_generation_keys_work_or_are_refused(api_engine):
    engine, name, _ = api_engine
    expected = alone(api_engine, PROMPT, NEW)
    gen = greedy(len(PROMPT) + NEW)
    gen.update({"vocab": {"<a>": 3, "<b>": 4}, "vocab_type": VocabType.VOCAB_TYPE_BPE,
                "enable_tensors_from_model_inference": False, "bad_words_ids": None})
    ids, elements, _, handle = run(api_engine, PROMPT, gen)
    assert ids == expected and all(e.tensors_from_model_inference == [] for e in elements)
    engine.release_request(name, handle)
    for update, status, words in [
            ({"enable_tensors_from_model_inference": True}, AsStatus.ALLSPARK_PARAM_ERROR, "no hidden states"),
            ({"vocab": {"<a>": 10**6}}, AsStatus.ALLSPARK_PARAM_ERROR, "vocab has an id outside"),
            ({"lora_name": "x"}, AsStatus.ALLSPARK_LORA_NOT_LOADED, "LoRA")]:
        gen = greedy(len(PROMPT) + NEW)
        gen.update(update)
        assert engine.start_request_ids(name, None, PROMPT, gen)[0] == status, update
        assert words in engine.last_error


def test_upstream_keyword_names(api_engine):
    engine, name, loader = api_engine
    text = "Hello, tiny model!"
    ids = loader.get_tokenizer()(text)["input_ids"]
    status, handle, queue = engine.start_request_text(model_name=name, model=loader, input_str_or_array=text,
                                                      generate_config_builder=greedy(len(ids) + 4))
    assert status == OK and collect(queue)[0] == alone(api_engine, ids, 4)
    assert engine.release_request(model_name=name, request_handle=handle) == OK
    status, handle, queue = engine.start_request_ids(model_name=name, model=loader, input_ids=PROMPT,
                                                     generate_config_builder=greedy(len(PROMPT) + NEW))
    assert engine.sync_request(model_name=name, request_handle=handle) == OK
    assert engine.stop_request(model_name=name, request_handle=handle) == OK
    assert engine.get_no_wait(model_name=name, result_queue=queue) == alone(api_engine, PROMPT, NEW)
    assert engine.get_request_status(model_name=name, result_queue=queue) == S.GenerateFinished
    assert engine.release_request(name, handle) == OK
    status, handle, queue = engine.start_request(model_name=name, inputs={"input_ids": PROMPT},
                                                 generate_config=greedy(len(PROMPT) + 2).build())
    assert status == OK and engine.get_wait(name, queue) and engine.release_request(name, handle) == OK


def test_lora_is_refused_alike(api_engine):
    engine, name, _ = api_engine
    for call in (engine.load_lora, engine.unload_lora):
        assert call(name, "adapter") == AsStatus.ALLSPARK_LORA_NOT_FOUND
        assert "loads no LoRA adapters" in engine.last_error
        assert call(name, "") == AsStatus.ALLSPARK_PARAM_ERROR
        assert call("no-such-model", "adapter") == AsStatus.ALLSPARK_PARAM_ERROR
        assert "unknown model" in engine.last_error
    status, handle, _ = engine.start_request_ids(name, None, PROMPT, greedy(len(PROMPT) + 2))
    assert status == OK and engine.release_request(name, handle) == OK  # and it serves on
