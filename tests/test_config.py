"""AsModelRuntimeConfigBuilder: every option, every refusal (generation: test_generation_config.py)."""
import json

import pytest

from dashinfer_client import AsCacheMode, AsModelRuntimeConfig, AsModelRuntimeConfigBuilder, TargetDevice


def runtime():
    return AsModelRuntimeConfigBuilder().model_name("m")


# ---- runtime config ------------------------------------------------------------------------------

def test_runtime_defaults_are_dashinfers():
    cfg = runtime().build()
    assert (cfg.device_type, cfg.device_ids, cfg.thread_num) == (TargetDevice.CPU, [0], 0)
    assert (cfg.max_batch, cfg.max_length, cfg.max_prefill_length) == (32, 2048, 0)
    assert cfg.prefill_cache is True
    assert cfg.kv_cache_mode == AsCacheMode.AsCacheDefault
    assert (cfg.kv_cache_span_size, cfg.kv_cache_memory_mb) == (32, 0)


def test_runtime_every_option():
    cfg = (AsModelRuntimeConfigBuilder().model_name("qwen").model_dir("/models", "qwen_q8")
           .compute_unit(TargetDevice.CPU_NUMA, [0, 1], 6).max_length(4096).max_batch(8)
           .max_prefill_length(512).prefill_cache(False).kv_cache_mode(AsCacheMode.AsCacheQuantU4)
           .kv_cache_span_size(64).kv_cache_memory_mb(700).build())
    assert cfg.model_name == "qwen"
    assert (cfg.model_dir, cfg.model_prefix) == ("/models", "qwen_q8")
    assert cfg.model_path == "/models/qwen_q8.asgraph"
    assert cfg.weights_path == "/models/qwen_q8.asparam"
    assert (cfg.device_type, cfg.device_ids, cfg.thread_num) == (TargetDevice.CPU_NUMA, [0, 1], 6)
    assert (cfg.max_length, cfg.max_batch, cfg.max_prefill_length) == (4096, 8, 512)
    assert cfg.prefill_cache is False
    assert cfg.kv_cache_mode == AsCacheMode.AsCacheQuantU4
    assert (cfg.kv_cache_span_size, cfg.kv_cache_memory_mb) == (64, 700)


def test_runtime_thread_num_and_compute_unit_forms():
    b = runtime().thread_num(3)
    assert b.build().thread_num == 3
    assert b.compute_unit("cpu").build().thread_num == 3  # not reset when no thread count is given
    assert b.compute_unit("CPU_NUMA", [1]).build().device_type == TargetDevice.CPU_NUMA
    # a single-process CPU model has no device choice: the ids are ignored, as in DashInfer
    assert runtime().compute_unit(TargetDevice.CPU, [3, 4]).build().device_ids == [0]
    assert runtime().compute_unit(TargetDevice.CPU_NUMA).build().device_ids == [0]


@pytest.mark.parametrize("mode", [AsCacheMode.AsCacheQuantI8, "AsCacheQuantI8", "asCacheQuantI8", 1])
def test_runtime_kv_cache_mode_spellings(mode):
    assert runtime().kv_cache_mode(mode).build().kv_cache_mode == AsCacheMode.AsCacheQuantI8


@pytest.mark.parametrize("span", [16, 32, 64, 128])
def test_runtime_span_sizes(span):
    assert runtime().kv_cache_span_size(span).build().kv_cache_span_size == span


def test_runtime_model_file_path():
    cfg = runtime().model_file_path("/d/p.asgraph", "/d/p.asparam").build()
    assert (cfg.model_dir, cfg.model_prefix) == ("/d", "p")
    with pytest.raises(ValueError, match="model_file_path"):
        runtime().model_file_path("/d/p.asgraph", "/e/p.asparam")
    with pytest.raises(ValueError, match="model_file_path"):
        runtime().model_file_path("/d/p.graph", "/d/p.asparam")


def test_runtime_to_dict_from_dict_round_trip():
    cfg = (runtime().model_dir("/x", "y").compute_unit(TargetDevice.CPU_NUMA, [0, 2], 4)
           .kv_cache_mode(AsCacheMode.AsCacheQuantI8).kv_cache_span_size(16).build())
    d = cfg.to_dict()
    assert d["device_type"] == "CPU_NUMA" and d["kv_cache_mode"] == "AsCacheQuantI8"
    assert json.loads(json.dumps(d)) == d  # plain JSON types for the wire
    assert AsModelRuntimeConfig.from_dict(d) == cfg
    assert AsModelRuntimeConfigBuilder().from_dict(d).build() == cfg


def test_runtime_from_dashinfer_diconfig_dict():
    di = {"model_name": "qwen", "engine_max_length": 1024, "engine_max_batch": 4,
          "engine_max_prefill_length": 256, "enable_prefix_cache": False,
          "kv_cache_mode": "AsCacheQuantU4", "kv_cache_span_size": 128,
          "compute_unit": {"device_type": "CPU_NUMA", "device_ids": [0, 1], "compute_thread_in_device": 2}}
    cfg = AsModelRuntimeConfigBuilder().from_dict(di).build()
    assert (cfg.model_name, cfg.max_length, cfg.max_batch, cfg.max_prefill_length) == ("qwen", 1024, 4, 256)
    assert cfg.prefill_cache is False and cfg.kv_cache_mode == AsCacheMode.AsCacheQuantU4
    assert (cfg.kv_cache_span_size, cfg.device_type, cfg.device_ids, cfg.thread_num) == \
        (128, TargetDevice.CPU_NUMA, [0, 1], 2)


def test_runtime_from_dict_resets_update_from_dict_keeps():
    b = runtime().max_batch(3)
    assert b.update_from_dict({"max_length": 77}).build().max_batch == 3
    b.from_dict({"model_name": "other", "max_length": 77})
    cfg = b.build()
    assert (cfg.model_name, cfg.max_batch, cfg.max_length) == ("other", 32, 77)


def test_runtime_build_returns_independent_configs():
    b = runtime().compute_unit(TargetDevice.CPU_NUMA, [0, 1])
    first = b.build()
    first.device_ids.append(5)
    b.max_batch(2)
    second = b.build()
    assert second.device_ids == [0, 1] and first.max_batch == 32 and second.max_batch == 2


RUNTIME_ERRORS = [
    (lambda b: b.max_batch(0), "max_batch"),
    (lambda b: b.max_batch(-3), "max_batch"),
    (lambda b: b.max_batch("4"), "max_batch"),
    (lambda b: b.max_batch(True), "max_batch"),
    (lambda b: b.max_batch(2.0), "max_batch"),
    (lambda b: b.max_length(0), "max_length"),
    (lambda b: b.max_length("2048"), "max_length"),
    (lambda b: b.max_prefill_length(-1), "max_prefill_length"),
    (lambda b: b.thread_num(-1), "thread_num"),
    (lambda b: b.thread_num("2"), "thread_num"),
    (lambda b: b.prefill_cache("yes"), "prefill_cache"),
    (lambda b: b.kv_cache_mode("AsCacheFP8"), "kv_cache_mode"),
    (lambda b: b.kv_cache_mode(7), "kv_cache_mode"),
    (lambda b: b.kv_cache_mode(None), "kv_cache_mode"),
    (lambda b: b.kv_cache_span_size(48), "kv_cache_span_size"),
    (lambda b: b.kv_cache_span_size(256), "kv_cache_span_size"),
    (lambda b: b.kv_cache_span_size("32"), "kv_cache_span_size"),
    (lambda b: b.kv_cache_memory_mb(-1), "kv_cache_memory_mb"),
    (lambda b: b.compute_unit("CUDA"), "compute_unit"),
    (lambda b: b.compute_unit(3), "compute_unit"),
    (lambda b: b.compute_unit(TargetDevice.CPU_NUMA, []), "device_ids"),
    (lambda b: b.compute_unit(TargetDevice.CPU_NUMA, [0, 0]), "device_ids"),
    (lambda b: b.compute_unit(TargetDevice.CPU_NUMA, [-1]), "device_ids"),
    (lambda b: b.compute_unit(TargetDevice.CPU_NUMA, "01"), "device_ids"),
    (lambda b: b.compute_unit(TargetDevice.CPU, None, -2), "thread_num"),
    (lambda b: b.model_name(3), "model_name"),
    (lambda b: b.model_dir("/d", None), "model_prefix"),
    (lambda b: b.update_from_dict({"max_batchh": 4}), "max_batchh"),
    (lambda b: b.from_dict({"engine_max_batch": 4, "swap_threshold": 1}), "swap_threshold"),
    (lambda b: b.update_from_dict({"compute_unit": {"device_type": "CPU", "cores": 2}}), "cores"),
    (lambda b: b.update_from_dict(["max_batch", 4]), "dict"),
    (lambda b: AsModelRuntimeConfig.from_dict({"model_name": "m", "batch": 2}), "batch"),
    (lambda b: AsModelRuntimeConfig.from_dict({"model_name": "m", "max_batch": 0}), "max_batch"),
    (lambda b: AsModelRuntimeConfig.from_dict({"model_name": "m", "kv_cache_mode": "x"}), "kv_cache_mode"),
]


@pytest.mark.parametrize("bad,key", RUNTIME_ERRORS)
def test_runtime_refusals_name_the_key(bad, key):
    with pytest.raises(ValueError, match=key):
        bad(runtime())


def test_runtime_range_message_says_what_is_allowed():
    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):
        runtime().max_batch(0)


def test_runtime_span_error_lists_allowed_values():
    with pytest.raises(ValueError, match="16, 32, 64, 128"):
        runtime().kv_cache_span_size(48)


def test_runtime_failed_update_changes_nothing():
    b = runtime().max_batch(5)
    with pytest.raises(ValueError, match="max_length"):
        b.update_from_dict({"max_batch": 9, "max_length": 0})
    with pytest.raises(ValueError, match="kv_cache_span_size"):
        b.from_dict({"model_name": "z", "kv_cache_span_size": 3})
    cfg = b.build()
    assert (cfg.model_name, cfg.max_batch, cfg.max_length) == ("m", 5, 2048)


def test_upstream_structs_construct_empty_and_install_refuses_a_nameless_model():
    """DashInfer's structs have default constructors (rc2's test builds an empty AsModelConfig;
    upstream scripts build an empty builder and fill it); the name is needed where a model is
    installed, not before."""
    import dashinfer_client as allspark
    cfg = AsModelRuntimeConfig()
    assert (cfg.model_name, cfg.max_batch, cfg.max_length, cfg.compute_unit) == ("", 32, 2048, "CPU:0")
    assert AsModelRuntimeConfigBuilder().build().model_name == ""
    engine = allspark.Engine()
    assert engine.install_model(cfg) == allspark.AsStatus.ALLSPARK_PARAM_ERROR
    assert "model_name must be set" in engine.last_error
