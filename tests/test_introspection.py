"""DashInfer's introspection calls on both engines (the api_engine fixture runs each test on the
in-process Engine and on a ClientEngine): AsEngineStat's figures against what the requests did,
op profiling against the model's structure, and upstream's documented answers (version layout,
rank 0, is_allspark_work_as_service, empty values and error statuses for bad input)."""
import os
import re
import threading
import time

import pytest

import dashinfer_client as allspark
from dashinfer_client import AsEngineStat, AsFileInfo, AsStatus, introspection
from dashinfer_client.client_engine import ClientEngine
from dashinfer_client.model.serialized import DashInferModel
from dashinfer_server.block_pool import BlockPool
from dashinfer_server.engine import Engine
from dashinfer_server.engine_stat import StatCounters
from dashinfer_server.scheduler import Scheduler
from dashinfer_server.sequence import Sequence
from tests.engine_helpers import API_CONTEXT, collect, greedy

SUCCESS, PARAM = AsStatus.ALLSPARK_SUCCESS, AsStatus.ALLSPARK_PARAM_ERROR
SPAN = 16
QUERIES = {"get_as_engine_stat", "get_free_frame", "get_op_profiling_info", "get_model_info",
           "get_file_information", "get_version_full", "get_rank_id", "is_allspark_work_as_service",
           "unload_device_mem", "load_device_mem", "call_with_status"}


def install(engine, loader, name, max_batch=4, max_length=256):
    cfg = (loader.create_reference_runtime_config_builder(name, allspark.TargetDevice.CPU, [0], max_batch=max_batch)
           .max_length(max_length).kv_cache_span_size(SPAN).build())
    assert engine.install_model(cfg) == SUCCESS, engine.last_error
    return cfg


def run(engine, name, prompt, max_length):
    status, handle, queue = engine.start_request_ids(name, None, prompt, greedy(max_length))
    assert status == SUCCESS, engine.last_error
    ids, _ = collect(queue)
    assert engine.release_request(name, handle) == SUCCESS
    return ids


def model_layers(loader) -> int:
    return DashInferModel(loader.model_output_dir, loader.serialize_model_name).config.num_hidden_layers


def profiled_rows(engine) -> dict:
    """{kernel: its row's columns} of rank 0's table (rank opname count min max mean total %)."""
    table = engine.get_op_profiling_info("profiled")
    assert table, engine.last_error
    return {cols[1]: cols for cols in (line.split() for line in table.splitlines()) if cols and cols[0] == "0"}


def wait_for(what, timeout_s=60.0):
    """Poll what() until it is true (the engine's loop picks requests up asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "the engine never reached the state"
        time.sleep(0.01)


def test_both_engines_have_dashinfer_s_introspection_methods():
    for cls in (Engine, ClientEngine):
        assert QUERIES <= {n for n in dir(cls) if callable(getattr(cls, n))}, cls


def test_engine_stat_counts_what_the_requests_did(api_engine):
    engine, _, loader = api_engine
    name = "stat-model"
    install(engine, loader, name)
    idle = engine.get_as_engine_stat(name)  # installed, not started: zeros, its name
    assert isinstance(idle, AsEngineStat) and idle.model_name == name and idle.total_token == 0
    assert engine.start_model(name) == SUCCESS
    try:
        fresh = engine.get_as_engine_stat(name)
        blocks = 4 * -(-256 // SPAN)  # max_batch requests of max_length (no KV memory budget set)
        assert fresh.total_token == fresh.free_token == blocks * SPAN and fresh.span_size == SPAN
        layers = model_layers(loader)
        assert fresh.total_span == blocks * 2 * layers  # upstream's unit: a layer's K or V
        assert fresh.total_token == fresh.total_span // (2 * layers) * fresh.span_size
        assert engine.get_free_frame(name) == fresh.free_span == fresh.total_span and fresh.used_span == 0
        assert fresh.total_generated_token == fresh.total_prefill_token == 0

        prompt = list(range(5, 45))  # 40 tokens: 2 full blocks of 16 to share, 8 more
        first = run(engine, name, prompt, 40 + 6)
        second = run(engine, name, prompt, 40 + 6)
        assert first == second and len(first) == 6
        stat = engine.get_as_engine_stat(name)
        assert stat.total_prefill_token == 80 and stat.total_generated_token == 12
        # the second prompt found the first's two full blocks in the prefix cache
        assert (stat.prefix_cache_hit_token, stat.prefix_cache_miss_token) == (32, 48)
        assert stat.prefix_cache_hit_rate == pytest.approx(32 / 80) and stat.prefix_cache_miss_rate == pytest.approx(48 / 80)
        assert stat.generate_token_persec > 0 and stat.process_token_persec > 0
        assert stat.running_request == stat.pendding_request == 0
        assert stat.free_token == stat.total_token  # finished requests hold no block
        assert stat.total_device_memory_pool_size == stat.used_device_memory_pool_size == 0  # CUDA pool
        as_map = stat.dict()
        assert as_map["total_generated_token"] == "12" and as_map["prefix_cache_hit_rate"] == "0.400000"
        assert stat.ToString().startswith("Members of AsEngineStat\n") and "free_token = " in stat.ToString()
    finally:
        assert engine.release_model(name) == SUCCESS


def test_a_request_preempted_in_its_prompt_counts_its_prefix_once():
    """Preempted after its first prompt chunk, a request finds that chunk's block in the prefix
    cache when admitted again: the statistics still count its 10 prompt tokens once, as the
    miss they were when it came."""
    sched, counters = Scheduler(BlockPool(16, 4), max_batch=8, max_step_tokens=4), StatCounters()
    seq = Sequence(list(range(10)), 64)
    sched.add(seq)

    def step():
        chunks, _ = sched.schedule()
        counters.count(chunks, prefix_cache=True)
        sched.advance(chunks)
        for c in chunks:
            if c.sample:
                c.seq.tokens.append(7)
    step()  # its first 4 prompt tokens: one full block, registered
    sched._preempt(seq, seq)
    while seq.num_generated == 0:
        step()
    assert seq.table.cached_len == 4  # the recompute did find its own block
    assert (counters.prefix_hit_tokens, counters.prefix_miss_tokens, counters.prefill_tokens) == (0, 10, 10)


def test_engine_stat_sees_running_and_pending_requests(api_engine):
    engine, _, loader = api_engine
    name = "busy-model"
    install(engine, loader, name, max_batch=1, max_length=API_CONTEXT)
    assert engine.start_model(name) == SUCCESS
    try:  # the first request runs for thousands of steps: long enough to look at it running
        started = [engine.start_request_ids(name, None, list(range(5, 15)), greedy(API_CONTEXT)) for _ in range(2)]
        assert [s[0] for s in started] == [SUCCESS, SUCCESS]
        assert started[0][2].Get() is not None  # the first one runs; max_batch 1 keeps the second waiting
        wait_for(lambda: engine.get_as_engine_stat(name).pendding_request == 1)
        stat = engine.get_as_engine_stat(name)
        assert stat.running_request == 1 and 0 < stat.free_token < stat.total_token
        assert stat.token_usage_percentage == pytest.approx((stat.total_token - stat.free_token) / stat.total_token)
        assert engine.get_free_frame(name) < stat.total_span
        for _, handle, _ in started:
            assert engine.release_request(name, handle) == SUCCESS
        stat = engine.get_as_engine_stat(name)
        assert stat.running_request == stat.pendding_request == 0 and stat.free_token == stat.total_token
    finally:
        engine.release_model(name)


def test_model_info_and_file_information(api_engine):
    engine, name, loader = api_engine
    info = engine.get_model_info(name)
    assert info.startswith("Model Type : llama\n") and "Model Inputs" in info and "max_length 512" in info
    graph = f"{loader.model_output_dir}/{loader.serialize_model_name}.asgraph"
    param = graph[:-len(".asgraph")] + ".asparam"
    files = engine.get_file_information(graph, param)
    assert isinstance(files, AsFileInfo)
    # format 2 since uint4's group codes (docs/design.md)
    assert files.create_version_graph == files.create_version_param == "dashinfer-py format 2"
    assert files.current_version_engine == engine.get_version_full().split("/")[0]
    missing, status, why = engine.call_with_status("get_file_information", graph + ".gone", param)
    assert status == AsStatus.ALLSPARK_IO_ERROR and ".gone" in why and missing.create_version_graph == ""
    assert engine.call_with_status("get_file_information", param, param)[1] == PARAM  # not a graph


def test_file_information_reads_only_regular_files_of_a_graph_s_size(api_engine, tmp_path, monkeypatch):
    """Any caller of a server may name any path: a FIFO blocked a server thread forever and
    /dev/zero read until rank 0 ran out of memory. They are refused unopened, as is a graph file
    larger than any graph (the size is checked before it is read)."""
    engine, _, loader = api_engine
    graph = f"{loader.model_output_dir}/{loader.serialize_model_name}.asgraph"
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    done = []
    for args in ((fifo, graph), (graph, fifo)):
        caller = threading.Thread(target=lambda a=args: done.append(engine.call_with_status("get_file_information", *a)))
        caller.start()
        caller.join(10)
        if caller.is_alive():  # blocked opening the FIFO: a writer lets it go
            with open(fifo, "w"):
                pass
            caller.join(10)
    assert [r[1] for r in done] == [PARAM, PARAM] and all("not a regular file" in r[2] for r in done), done
    monkeypatch.setattr(introspection, "MAX_GRAPH_BYTES", 10)
    with pytest.raises(ValueError, match="larger than any model graph"):
        introspection.file_information(graph, graph)


def test_version_rank_and_service(api_engine):
    engine, _, _ = api_engine
    assert re.fullmatch(r"\d+\.\d+\.\d+/\(GitSha1:\w+\)", engine.get_version_full())
    assert engine.get_rank_id() == 0
    assert engine.is_allspark_work_as_service() is isinstance(engine, ClientEngine)


def test_bad_input_gets_upstream_s_empty_value_and_a_status(api_engine):
    engine, name, _ = api_engine
    cases = [  # (call, args, expected status, expected value)
        ("get_as_engine_stat", ("nope",), PARAM, None),
        ("get_as_engine_stat", (b"x",), PARAM, None),
        ("get_free_frame", ("nope",), PARAM, 0),
        ("get_model_info", (7,), PARAM, ""),
        ("get_op_profiling_info", ("nope",), PARAM, ""),
        ("get_file_information", (None, "x"), PARAM, None),
        ("unload_device_mem", ("nope",), PARAM, PARAM),
        ("unload_device_mem", (name,), SUCCESS, SUCCESS),
        ("load_device_mem", (name,), SUCCESS, SUCCESS),
    ]
    for method, args, status, value in cases:
        result, got, why = engine.call_with_status(method, *args)
        assert got == status and bool(why) == (status != SUCCESS), (method, args, got, why)
        assert status == SUCCESS or why.startswith(f"{method}: "), why  # the call made, on both engines
        if value is not None:
            assert result == value, (method, args, result)
    stat = engine.get_as_engine_stat("nope")
    assert stat.model_name == "nope" and stat.total_token == 0 and "unknown model" in engine.last_error
    assert engine.get_as_engine_stat(name).total_token > 0  # and the engine serves on


def test_op_profiling_times_every_kernel_call(api_engine, monkeypatch):
    """AS_PROFILE=ON in the serving process when the model starts: one row per kernel, with as many
    calls as the model's structure makes; without it, "" (DashInfer's answer)."""
    engine, name, loader = api_engine
    assert engine.get_op_profiling_info(name) == ""
    profiled, spawned = engine, None
    if isinstance(engine, ClientEngine):  # the server's environment is set when it is spawned
        profiled = spawned = ClientEngine(env={"AS_PROFILE": "ON"}, startup_timeout=120)
    else:
        monkeypatch.setenv("AS_PROFILE", "ON")
    try:
        install(profiled, loader, "profiled")
        assert profiled.start_model("profiled") == SUCCESS
        assert profiled_rows(profiled) == {}  # the warm-up's steps are not counted
        generated = len(run(profiled, "profiled", list(range(5, 25)), 20 + 8))
        layers = model_layers(loader)
        rows = profiled_rows(profiled)
        steps = generated  # the prompt's step gives the first token, one decode step each other
        assert int(rows["embedding"][2]) == steps
        assert int(rows["linear"][2]) == steps * (5 * layers + 1)  # q k v o down, lm_head
        assert int(rows["linear_glu"][2]) == steps * layers  # gate_up with act(gate) * up
        assert int(rows["attention"][2]) == steps * layers
        assert sum(float(cols[7]) for cols in rows.values()) == pytest.approx(100, abs=0.1)
        assert all(float(c[3]) <= float(c[5]) <= float(c[4]) for c in rows.values())  # min <= mean <= max
        profiled.release_model("profiled")
    finally:
        if spawned is not None:
            spawned.close()


def test_v13_methods_without_a_runtime_behind_them_are_refused_alike(api_engine, tmp_path):
    engine, name, _ = api_engine
    for call, args in (("get_model_config", ({},)), ("reset_stream", (name,)),
                       ("save_model", (name, str(tmp_path))), ("dump_build_meta_to_proto", (None, "w", {}))):
        assert getattr(engine, call)(*args) == AsStatus.ALLSPARK_INVALID_CALL_ERROR
        assert engine.last_error.startswith(f"{call}: not served by this runtime")
    assert not list(tmp_path.iterdir())  # save_model wrote nothing
    assert engine.get_model_state(name) == "Running"  # and the model serves on
