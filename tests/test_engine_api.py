"""DashInfer's API on a tiny model, through the public API only (engine, model name, loader).

Runs against both engines `api_engine` (tests/conftest.py) offers: the in-process Engine and the
ClientEngine over gRPC. Greedy requests of the tiny fp32 model are deterministic, so "the same
tokens as alone" is an exact check; a request run alone before a test is its reference.
"""
import logging
import random
import threading
import time

import pytest

from dashinfer_client import AsStatus, GenerateRequestStatus, TargetDevice
from dashinfer_client.refusals import CALLER_MISTAKES
from tests.api_helpers import (Finished, Interrupted, OK, VOCAB, alone, install, logged, prompt_of, run,
                               still_serving)
from tests.engine_helpers import collect, greedy, hf_greedy
from tests.helpers import load_hf_model


@pytest.fixture(scope="module")
def small_pool(api_engine):
    """A model whose KV pool (1 MB: 2048 tokens of the tiny model's fp32 K/V) is smaller than max_length."""
    name = install(api_engine, "tiny-small-pool", max_batch=16, max_length=8192, kv_cache_memory_mb=1)
    yield name
    assert api_engine[0].release_model(name) == OK


# ---- generation ------------------------------------------------------------------------------

def test_greedy_matches_transformers(api_engine):
    _, _, loader = api_engine
    prompt = prompt_of(20, 1)
    ids, _, queue, _ = run(api_engine, prompt, greedy(len(prompt) + 32))
    assert ids == hf_greedy(load_hf_model(loader.model_path), prompt, 32)
    assert queue.GenerateStatus() == Finished and queue.GeneratedLength() == 32


def test_status_sequence_and_stats(api_engine):
    engine, name, loader = api_engine
    prompt = prompt_of(40, 2)
    status, handle, queue = engine.start_request_ids(name, loader, prompt, greedy(len(prompt) + 100))
    assert status == OK and isinstance(handle, int)
    seen, ids, reasons = [queue.GenerateStatus()], [], set()
    while True:
        ele = queue.Get()
        seen.append(queue.GenerateStatus())
        if ele is None:
            break
        ids += ele.ids_from_generate
        if seen[-1] != Finished:
            reasons.add(queue.RequestStatInfo()["finish_reason"])
    order = [GenerateRequestStatus.Init, GenerateRequestStatus.Generating, Finished]  # as DashInfer's
    assert all(s in order for s in seen) and seen == sorted(seen, key=order.index)
    assert seen[-1] == Finished and len(ids) == 100 == queue.GeneratedLength()
    assert queue.Get() is None and queue.GetNoWait() is None and queue.GetWithTimeout(1) is None
    info = queue.RequestStatInfo()
    assert info["context_token_length"] == 40 and info["generated_token_length"] == 100
    assert info["context_cached_length"] == 0
    assert info["time_to_first_token"] > 0 and info["prefill_time"] > 0 and info["decode_time"] > 0
    assert info["time_in_queue"] >= 0
    assert abs(info["time_to_first_token"] - info["time_in_queue"] - info["prefill_time"]) < 1e-6
    assert info["finished_time"] >= info["time_to_first_token"] + info["decode_time"] - 1.0
    assert info["context_tps"] > 0 and info["generate_tps"] > 0
    assert info["last_token_time"] >= info["first_token_time"] >= info["arrival_time"] > 1.6e12
    assert reasons <= {""} and info["finish_reason"] == info.finish_reason == "length"
    assert engine.release_request(name, handle) == OK


def test_text_requests(api_engine):
    engine, name, loader = api_engine
    text = "Hello, tiny model!"
    ids = loader.get_tokenizer()(text)["input_ids"]
    status, handle, queue = engine.start_request_text(name, loader, text, greedy(len(ids) + 12))
    assert status == OK
    assert collect(queue)[0] == alone(api_engine, ids, 12)
    status, handles, queues = engine.start_request_text(name, loader, [text, text + "!"],
                                                        greedy(len(ids) + 13))
    assert status == OK and len(handles) == len(queues) == 2
    outs = [collect(q)[0] for q in queues]
    assert len(outs[0]) == 13 and outs[0][:12] == alone(api_engine, ids, 12)
    for h in [handle] + handles:
        assert engine.release_request(name, h) == OK


def test_batch_invariance(api_engine):
    """A greedy request gets the same ids alone and among 15 others of other lengths, whether
    it starts with them or joins their running batch."""
    engine, name, loader = api_engine
    probe = prompt_of(23, 3)
    expected = alone(api_engine, probe, 48)
    others = [(prompt_of(5 + 7 * i, 100 + i), 20 + 9 * i) for i in range(15)]
    for join_late in (False, True):
        queues = []
        for i, (prompt, new) in enumerate(others):
            if i == (8 if join_late else 0):
                if join_late:  # the batch is decoding when the probe arrives
                    while queues[0][1].GeneratedLength() < 3:
                        time.sleep(0.001)
                status, probe_handle, probe_queue = engine.start_request_ids(
                    name, loader, probe, greedy(len(probe) + 48))
                assert status == OK
            status, handle, queue = engine.start_request_ids(name, loader, prompt, greedy(len(prompt) + new))
            assert status == OK
            queues.append((handle, queue))
        assert collect(probe_queue)[0] == expected
        for (handle, queue), (prompt, new) in zip(queues, others):
            assert len(collect(queue)[0]) == new
            engine.release_request(name, handle)
        engine.release_request(name, probe_handle)
    # and one of the others, alone, is what it was in the batch
    first, new = others[4]
    ids, *_ = run(api_engine, first, greedy(len(first) + new))
    assert ids == alone(api_engine, first, new)


def test_prefix_cache_reuse(api_engine):
    engine, name, loader = api_engine
    first = prompt_of(100, 4)
    second = first[:90] + prompt_of(10, 5)
    ids, elements, queue, _ = run(api_engine, first, greedy(130))
    assert {e.prefix_cache_len for e in elements} == {0}
    ids, elements, queue, _ = run(api_engine, second, greedy(130))
    # blocks of 16: the first five (80 tokens) are shared, the sixth differs at token 90
    assert {e.prefix_cache_len for e in elements} == {80}
    assert {e.prefix_len_cpu for e in elements} == {80} and {e.prefix_len_gpu for e in elements} == {0}
    assert queue.RequestStatInfo()["context_cached_length"] == 80
    nocache = install(api_engine, "tiny-nocache", prefill_cache=False)
    try:
        for _ in range(2):
            ref, ref_elements, _, _ = run(api_engine, second, greedy(130), model=nocache)
            assert {e.prefix_cache_len for e in ref_elements} == {0}
        assert ids == ref
    finally:
        assert engine.release_model(nocache) == OK


def pool_tokens(engine, model) -> int:
    """Tokens the model's KV pool holds (blocks of 16: install() sets kv_cache_span_size 16)."""
    return engine.get_stats()["models"][model]["kv_blocks_total"] * 16


def test_kv_pressure_preempts_and_every_request_finishes_as_alone(api_engine):
    engine, name, loader = api_engine
    # One kernel thread: a lone decode row splits its context over the threads (another summation
    # order than in a batch, which flipped one of 16 such greedy answers at token 844 with two),
    # and "as alone" is then exact.
    pool = install(api_engine, "tiny-quarter-pool", max_batch=16, max_length=8192, kv_cache_memory_mb=1,
                   thread_num=1)
    prompts = [prompt_of(10, 200 + i) for i in range(16)]
    new = 502
    # 16 x 512 tokens: four times the pool. A decoding request that finds no free block preempts
    # the latest admitted, which recomputes later: nobody is cut short (vLLM's recompute).
    assert 16 * (10 + new) == 4 * pool_tokens(engine, pool)
    started = []
    for prompt in prompts:
        status, handle, queue = engine.start_request_ids(pool, loader, prompt, greedy(len(prompt) + new))
        assert status == OK
        started.append((handle, queue))
    outs = [collect(queue)[0] for _, queue in started]
    assert [queue.GenerateStatus() for _, queue in started] == [Finished] * 16
    assert engine.get_stats()["models"][pool]["preemptions"] > 0
    for prompt, (handle, queue), out in zip(prompts, started, outs):
        assert queue.RequestStatInfo().finish_reason == "length" and queue.GeneratedLength() == new
        assert engine.release_request(pool, handle) == OK
        ids, *_ = run(api_engine, prompt, greedy(len(prompt) + new), model=pool)  # alone
        assert out == ids and len(ids) == new
    assert engine.release_model(pool) == OK


def test_a_request_the_whole_pool_cannot_hold_is_interrupted(api_engine, small_pool, caplog):
    engine, name, loader = api_engine
    for logger in ("dashinfer_client", "dashinfer_server"):  # a Pipeline earlier in the process set ERROR
        caplog.set_level(logging.WARNING, logger=logger)
    # alone, 10 + 4200 tokens outgrow the 2048-token pool: DashInfer's GenerateInterrupted ("no
    # resource to finish this request's generation"), after every token the pool could hold
    ids, _, queue, handle = run(api_engine, prompt_of(10, 7), greedy(10 + 4200), model=small_pool)
    assert queue.GenerateStatus() == Interrupted and "KV cache" in queue.error
    held = pool_tokens(engine, small_pool) - 10 + 1  # the last one sampled, its K/V never needed
    assert queue.RequestStatInfo().finish_reason == "interrupted" and len(ids) == held
    assert logged(caplog, "interrupted", "KV cache", level=logging.WARNING)
    assert engine.release_request(small_pool, handle) == OK
    reference, _, queue, handle = run(api_engine, prompt_of(10, 7), greedy(10 + held), model=small_pool)
    assert queue.GenerateStatus() == Finished and ids == reference
    assert engine.release_request(small_pool, handle) == OK


# ---- refusals and errors -------------------------------------------------------------------

REFUSED = {
    "lora_name": (dict(lora_name="adapter"), AsStatus.ALLSPARK_LORA_NOT_LOADED, "LoRA"),
    "mm_info": (dict(mm_info={"images": ["x.png"]}), AsStatus.ALLSPARK_PARAM_ERROR, "mm_info"),
    "response_format": (dict(response_format={"type": "json_object", "json_schema": '{"type": "objectx"}'}),
                        AsStatus.ALLSPARK_PARAM_ERROR, "response_format"),
    "length_penalty": (dict(length_penalty=1.5), AsStatus.ALLSPARK_PARAM_ERROR, "length_penalty"),
}


@pytest.mark.parametrize("option", list(REFUSED))
def test_options_without_meaning_here_are_refused(api_engine, option, caplog):
    engine, name, loader = api_engine
    options, code, word = REFUSED[option]
    with still_serving(api_engine):
        result = engine.start_request_ids(name, loader, prompt_of(5, 20), greedy(20, **options))
        assert result == (code, None, None)
        assert logged(caplog, word)


def bad_requests(name, small_pool):
    """(what, call(engine, loader) -> status, expected status, word the log line holds)."""
    E = AsStatus
    gen = greedy(60)
    start = lambda ids, model=name, g=gen: (lambda e, l: e.start_request_ids(model, l, ids, g)[0])  # noqa: E731
    return [
        ("negative id", start([5, -1, 7]), E.ALLSPARK_PARAM_ERROR, "-1"),
        ("id past the vocabulary", start([5, VOCAB]), E.ALLSPARK_PARAM_ERROR, str(VOCAB)),
        ("float ids", start([1.5, 2.0]), E.ALLSPARK_PARAM_ERROR, "integers"),
        ("text as ids", start("hello"), E.ALLSPARK_PARAM_ERROR, "integers"),
        ("two sequences", start([[1, 2], [3, 4]]), E.ALLSPARK_PARAM_ERROR, "one sequence"),
        ("empty ids", start([]), E.ALLSPARK_EMPTY_REQUEST, "empty"),
        ("empty text", lambda e, l: e.start_request_text(name, l, "", gen)[0], E.ALLSPARK_EMPTY_REQUEST, "empty"),
        ("prompt over max_length", start(list(range(3, 259)) * 2, g=greedy(512)), E.ALLSPARK_EXCEED_LIMIT_ERROR,
         "max_length"),
        ("generation max_length over the engine's", start([5, 6], g=greedy(513)), E.ALLSPARK_EXCEED_LIMIT_ERROR,
         "513"),
        ("generation max_length <= prompt", start(list(range(3, 63)), g=greedy(60)), E.ALLSPARK_EXCEED_LIMIT_ERROR,
         "no room"),
        ("not a generation config", start([5, 6], g=42), E.ALLSPARK_PARAM_ERROR, "generate_config"),
        ("bad generation value", start([5, 6], g={"top_k": -3}), E.ALLSPARK_PARAM_ERROR, "top_k"),
        ("prompt the KV pool can never hold", start([7] * 5000, model=small_pool, g=greedy(5100)),
         E.ALLSPARK_CACHE_MEMORY_OUT, "KV cache"),
        ("unknown model: start_request", start([5, 6], model="nope"), E.ALLSPARK_PARAM_ERROR, "nope"),
        ("unknown model: start_model", lambda e, l: e.start_model("nope"), E.ALLSPARK_PARAM_ERROR, "nope"),
        ("unknown model: stop_model", lambda e, l: e.stop_model("nope"), E.ALLSPARK_PARAM_ERROR, "nope"),
        ("unknown model: release_model", lambda e, l: e.release_model("nope"), E.ALLSPARK_PARAM_ERROR, "nope"),
        ("unknown model: sync_request", lambda e, l: e.sync_request("nope", None), E.ALLSPARK_PARAM_ERROR, "nope"),
        ("unknown handle: stop", lambda e, l: e.stop_request(name, 10**9), E.ALLSPARK_ILLEGAL_REQUEST_ID, "handle"),
        ("unknown handle: release", lambda e, l: e.release_request(name, -3), E.ALLSPARK_ILLEGAL_REQUEST_ID, "handle"),
        ("unknown handle: sync", lambda e, l: e.sync_request(name, "x"), E.ALLSPARK_ILLEGAL_REQUEST_ID, "handle"),
        ("start a running model", lambda e, l: e.start_model(name), E.ALLSPARK_INVALID_CALL_ERROR, "Running"),
        ("install twice", lambda e, l: e.install_model(
            l.create_reference_runtime_config_builder(name, TargetDevice.CPU, [0], max_batch=2).max_length(64)),
         E.ALLSPARK_INVALID_CALL_ERROR, "already installed"),
        ("install a bad config", lambda e, l: e.install_model("config"), E.ALLSPARK_PARAM_ERROR, "install_model"),
    ]


def test_error_paths(api_engine, small_pool, caplog):
    """Each bad call: its status and a log line naming the problem; the engine serves on."""
    engine, name, loader = api_engine
    with still_serving(api_engine):
        for what, call, code, word in bad_requests(name, small_pool):
            caplog.clear()
            assert call(engine, loader) == code, what
            # the caller's mistakes (what HTTP answers 400) are warnings, the rest errors
            level = logging.WARNING if code in CALLER_MISTAKES else logging.ERROR
            assert logged(caplog, word, level=level), f"{what}: nothing logged naming {word!r}"
            assert level == logging.ERROR or not logged(caplog, word, level=logging.ERROR, wait_s=0), what


def test_calls_in_the_wrong_model_state(api_engine, caplog):
    engine, name, loader = api_engine
    idle = install(api_engine, "tiny-idle", start=False)
    try:
        with still_serving(api_engine):
            assert engine.start_request_ids(idle, loader, [5, 6], greedy(20))[0] == \
                AsStatus.ALLSPARK_INVALID_CALL_ERROR
            assert logged(caplog, "Initial")
            assert engine.stop_model(idle) == AsStatus.ALLSPARK_INVALID_CALL_ERROR
    finally:
        assert engine.release_model(idle) == OK
    assert engine.start_model(idle) == AsStatus.ALLSPARK_PARAM_ERROR  # released: unknown


def test_model_lifecycle(api_engine, caplog):
    """stop_model lets started requests finish and refuses new ones; a stopped model restarts;
    release_model frees it."""
    engine, name, loader = api_engine
    life = install(api_engine, "tiny-life", max_batch=4)
    prompts = [prompt_of(9 + i, 30 + i) for i in range(3)]
    started = []
    for prompt in prompts:
        status, handle, queue = engine.start_request_ids(life, loader, prompt, greedy(len(prompt) + 150))
        assert status == OK
        started.append((handle, queue))
    assert engine.stop_model(life) == OK
    for (handle, queue), prompt in zip(started, prompts):
        assert queue.GenerateStatus() == Finished
        assert collect(queue)[0] == alone(api_engine, prompt, 150)
    assert engine.start_request_ids(life, loader, prompts[0], greedy(40))[0] == AsStatus.ALLSPARK_REQUEST_DENIED
    assert logged(caplog, "stopped")
    assert engine.stop_model(life) == AsStatus.ALLSPARK_INVALID_CALL_ERROR
    assert engine.start_model(life) == OK
    ids, *_ = run(api_engine, prompts[1], greedy(len(prompts[1]) + 150), model=life)
    assert ids == alone(api_engine, prompts[1], 150)
    assert engine.release_model(life) == OK  # from Running: stops, then frees
    assert engine.start_request_ids(life, loader, prompts[0], greedy(40))[0] == AsStatus.ALLSPARK_PARAM_ERROR
    assert engine.release_model(life) == AsStatus.ALLSPARK_PARAM_ERROR
    assert collect(started[0][1])[0] == []  # queues of a released model stay readable (and drained)


# ---- threads -----------------------------------------------------------------------------

def test_many_user_threads(api_engine):
    """Six threads start, stop, release and sync requests at once; every request ends as its
    thread asked, with the tokens it would generate alone."""
    engine, name, loader = api_engine
    prompts = [prompt_of(8 + 5 * i, 40 + i) for i in range(3)]
    new = 60
    expected = [alone(api_engine, p, new) for p in prompts]
    failures = []

    def user(seed):
        rng = random.Random(seed)
        try:
            for _ in range(6):
                k = rng.randrange(3)
                status, handle, queue = engine.start_request_ids(name, loader, prompts[k],
                                                                 greedy(len(prompts[k]) + new))
                assert status == OK
                action = rng.choice(["finish", "stop", "release", "sync"])
                ids = []
                if action == "stop":
                    ids += queue.Get().ids_from_generate
                    assert engine.stop_request(name, handle) == OK
                elif action == "release":
                    assert engine.release_request(name, handle) == OK
                    assert engine.stop_request(name, handle) == AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID
                elif action == "sync":
                    assert engine.sync_request(name, handle) == OK
                ids += collect(queue)[0]
                assert queue.GenerateStatus() == Finished
                if action in ("finish", "sync"):
                    assert ids == expected[k], action
                else:
                    assert ids == expected[k][:len(ids)], action
                if action != "release":
                    assert engine.release_request(name, handle) == OK
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            failures.append(e)

    threads = [threading.Thread(target=user, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    syncing = True

    def syncer():
        while syncing:
            assert engine.sync_request(name, None) == OK
    watcher = threading.Thread(target=syncer)
    watcher.start()
    for t in threads:
        t.join(timeout=300)
    syncing = False
    watcher.join(timeout=60)
    assert not failures, failures
    assert not any(t.is_alive() for t in threads)
    assert run(api_engine, prompts[0], greedy(len(prompts[0]) + new))[0] == expected[0]
