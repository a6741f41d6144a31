"""One API contract: Engine and ClientEngine inherit EngineAPI (dashinfer_client/api.py), so they
have the same public methods, and input that is bad whatever the engine gets the same AsStatus
from both, never an exception (the messages are compared in test_client_engine.py)."""

from dashinfer_client import AsModelRuntimeConfigBuilder, ASGenerationConfigBuilder, AsStatus
from dashinfer_client.api import EngineAPI, ModelState
from dashinfer_client.client_engine import ClientEngine
from dashinfer_server.engine import Engine
from tests.engine_helpers import greedy

PARAM, HANDLE = AsStatus.ALLSPARK_PARAM_ERROR, AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID
DASHINFER_METHODS = {"install_model", "start_model", "stop_model", "release_model", "start_request_ids",
                     "start_request_text", "stop_request", "release_request", "sync_request",
                     "start_request", "get_no_wait", "get_wait", "get_request_status", "get_output_wait",
                     "get_output_no_wait", "load_lora", "unload_lora"}


def public_methods(cls) -> set:
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


def test_both_engines_have_the_same_public_methods():
    engine, client = public_methods(Engine), public_methods(ClientEngine)
    assert engine == client
    assert DASHINFER_METHODS | {"get_stats", "get_model_state", "call_with_reason", "close"} <= engine
    assert engine == public_methods(EngineAPI)  # nothing public is engine-specific


class _BrokenBuilder:
    def build(self):
        raise RuntimeError("broken on purpose")


class _BrokenGeneration(ASGenerationConfigBuilder):
    def build(self):
        raise ValueError("broken on purpose")


def bad_calls(name):
    """(what, call(engine) -> status, expected status): wrong whatever the engine."""
    gen = greedy(40)
    start = lambda model, g=gen: (lambda e: e.start_request_ids(model, None, [5, 6], g)[0])  # noqa: E731
    return [
        ("bytes name: start_model", lambda e: e.start_model(name.encode()), PARAM),
        ("int name: stop_model", lambda e: e.stop_model(7), PARAM),
        ("None name: release_model", lambda e: e.release_model(None), PARAM),
        ("lone surrogate: start_model", lambda e: e.start_model("tiny\udc80"), PARAM),
        ("bytes name: start_request_ids", start(name.encode()), PARAM),
        ("lone surrogate: start_request_ids", start("\ud800"), PARAM),
        ("bytes name: start_request_text", lambda e: e.start_request_text(b"x", None, "hi", gen)[0], PARAM),
        ("bytes name: sync_request", lambda e: e.sync_request(name.encode(), None), PARAM),
        ("bytes name: stop_request", lambda e: e.stop_request(name.encode(), 1), PARAM),
        ("str handle", lambda e: e.stop_request(name, "1"), HANDLE),
        ("float handle", lambda e: e.release_request(name, 1.0), HANDLE),
        ("bool handle", lambda e: e.sync_request(name, True), HANDLE),
        ("None handle: release", lambda e: e.release_request(name, None), HANDLE),
        ("handle never given out", lambda e: e.stop_request(name, 10**12), HANDLE),
        ("runtime config whose build() raises", lambda e: e.install_model(_BrokenBuilder()), PARAM),
        ("runtime config named with a lone surrogate", lambda e: e.install_model(
            AsModelRuntimeConfigBuilder().model_name("x\udc80").model_dir("/nonexistent", "x")), PARAM),
        ("generation config whose build() raises", start(name, _BrokenGeneration()), PARAM),
        ("generation config of a wrong type", start(name, [1, 2]), PARAM),
    ]


def test_bad_input_gets_the_same_status_on_both_engines(api_engine):
    engine, name, _ = api_engine
    for what, call, expected in bad_calls(name):
        engine.last_error = None
        assert call(engine) == expected, (what, engine.last_error)
        assert engine.last_error, what
    status, handle, queue = engine.start_request_ids(name, None, [5, 6, 7], greedy(20))
    assert status == AsStatus.ALLSPARK_SUCCESS  # and the engine serves on
    assert engine.sync_request(name, handle) == AsStatus.ALLSPARK_SUCCESS
    assert engine.release_request(name, handle) == AsStatus.ALLSPARK_SUCCESS


def test_a_generation_config_that_is_no_dict_nor_builder_is_refused_by_the_api(api_engine):
    """The API builds a builder and refuses any other non-dict, once for both engines (the
    engine's own checks then take the built dict only)."""
    engine, name, _ = api_engine
    for gen in (42, [("top_k", 1)], "greedy"):
        assert engine.start_request_ids(name, None, [5, 6], gen)[0] == PARAM
        assert "generate_config must be an ASGenerationConfig(Builder)" in engine.last_error, gen


def test_model_state_and_stats(api_engine):
    engine, name, _ = api_engine
    assert engine.get_model_state(name) is ModelState.Running
    assert engine.get_model_state("nope") is engine.get_model_state(b"x") is ModelState.Released
    stats = engine.get_stats()
    assert set(stats) == {"models", "streams", "sessions", "draining"} and stats["draining"] is False
    model = stats["models"][name]
    assert model["state"] is ModelState.Running and model["state"] == "Running"
    assert model["runtime_config"]["model_name"] == name and model["runtime_config"]["max_length"] == 512
    assert model["running"] == model["waiting"] == model["requests"] == 0
    assert 0 < model["kv_blocks_free"] <= model["kv_blocks_total"]
    assert engine.world_size == 1


def test_a_closed_client_engine_refuses_every_call_alike(tmp_path, caplog):
    """Every status-returning call of a closed ClientEngine is ALLSPARK_RUNTIME_ERROR saying so,
    without a traceback: load_lora and unload_lora had let get_stats' Unavailable through, logged
    as a bug with its traceback and worded "Unavailable: ..." unlike every other call."""
    from dashinfer_server.grpc_server import serve
    srv = serve(Engine(), f"unix://{tmp_path}/c.sock")
    try:
        client = ClientEngine(srv.address, startup_timeout=10)
        client.close()
        calls = {"stop_model": lambda e: e.stop_model("tiny"), "sync_request": lambda e: e.sync_request("tiny"),
                 "load_lora": lambda e: e.load_lora("tiny", "adapter"),
                 "unload_lora": lambda e: e.unload_lora("tiny", "adapter"),
                 "load_device_mem": lambda e: e.load_device_mem("tiny")}
        for what, call in calls.items():
            caplog.clear()
            assert call(client) == AsStatus.ALLSPARK_RUNTIME_ERROR, what
            assert client.last_error == f"{what}: this ClientEngine is closed"
            assert not [r for r in caplog.records if r.exc_info], f"{what} logged a traceback"
    finally:
        srv.stop()
