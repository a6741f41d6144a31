"""The runtime config as DashInfer's users write it (issue 10, points 7 and 8): upstream's builder
methods and DIConfig keys, AsModelConfig by attribute and by keyword, its attribute names on the
built config, and prefix_cache_ttl honoured by the KV block pool."""
import pytest

from dashinfer_client import (AsCacheMode, AsModelConfig, AsModelRuntimeConfigBuilder, TargetDevice)
from dashinfer_client.runtime_config import get_cache_mode_from_str
from dashinfer_server.block_pool import BlockPool


def runtime():
    return AsModelRuntimeConfigBuilder().model_name("m")


def test_built_config_reads_under_as_model_config_names():
    cfg = (runtime().compute_unit(TargetDevice.CPU_NUMA, [0, 1], 3).max_length(1024).max_batch(4)
           .max_prefill_length(64).prefill_cache(False).kv_cache_mode(AsCacheMode.AsCacheQuantI8)
           .kv_cache_span_size(16).build())
    assert cfg.compute_unit == "CPU:0,1"  # upstream's string for a CPU_NUMA unit
    assert (cfg.engine_max_length, cfg.engine_max_batch, cfg.engine_max_prefill_length) == (1024, 4, 64)
    assert (cfg.num_threads, cfg.cache_mode, cfg.enable_prefix_cache) == (3, AsCacheMode.AsCacheQuantI8, False)
    assert (cfg.cache_span_size, cfg.prefix_cache_ttl, cfg.enable_sparsity_matmul) == (16, 300, False)
    assert runtime().build().compute_unit == "CPU:0"


def test_from_dict_prints_as_the_expected_as_model_config():
    """Upstream's rc2 tests/python/gpu/test_runtime_config.py, with CUDA:0,1 -> CPU:0,1."""
    expected = AsModelConfig()
    expected.model_name = "test_model"
    expected.compute_unit = "CPU:0,1"
    expected.engine_max_length = 100
    expected.engine_max_batch = 32
    expected.num_threads = 2
    built = AsModelRuntimeConfigBuilder().from_dict({
        "model_name": "test_model",
        "compute_unit": {"device_type": "cpu_numa", "device_ids": [0, 1], "compute_thread_in_device": 2},
        "engine_max_length": 100, "engine_max_batch": 32}).build()
    assert str(expected) == str(built)
    assert str(expected) != str(AsModelRuntimeConfigBuilder().model_name("test_model").build())


def test_compute_unit_strings():
    assert AsModelRuntimeConfigBuilder.parse_device_type("CPU:0,1") == ("CPU", [0, 1])
    assert AsModelRuntimeConfigBuilder.parse_device_type("CPU_NUMA:2") == ("CPU_NUMA", [2])
    one = runtime().set_compute_unit_from_str("CPU:0").build()
    assert (one.device_type, one.device_ids) == (TargetDevice.CPU, [0])
    two = runtime().set_compute_unit_from_str("CPU:0,1").build()
    assert (two.device_type, two.device_ids) == (TargetDevice.CPU_NUMA, [0, 1])
    for bad, match in (("CUDA:0", "no CUDA"), ("CPU", "look like"), ("CPU:a", "integers")):
        with pytest.raises(ValueError, match=match):
            runtime().set_compute_unit_from_str(bad)


def test_upstream_builder_methods_work_or_say_why():
    cfg = (runtime().prefix_cache_ttl(60).set_span_init_size(0).enable_sparsity_matmul(False)
           .lora_max_rank(32).lora_max_num(2).build())
    assert (cfg.prefix_cache_ttl, cfg.lora_max_rank, cfg.lora_max_num) == (60, 32, 2)
    with pytest.raises(ValueError, match="sparse tensor cores"):
        runtime().enable_sparsity_matmul(True)
    with pytest.raises(ValueError, match="kv_cache_memory_mb"):
        runtime().set_span_init_size(100)
    with pytest.raises(ValueError, match="prefix_cache_ttl"):
        runtime().prefix_cache_ttl(0)
    assert get_cache_mode_from_str("AsCacheQuantU4") == AsCacheMode.AsCacheQuantU4


def test_update_from_dict_takes_upstreams_diconfig_keys():
    """The keys of upstream's update_from_dict and its DIConfig runtime_config section."""
    section = {"model_name": "default_model_id", "engine_max_length": 2048, "engine_max_batch": 8,
               "compute_unit": {"device_type": "CPU_NUMA", "device_ids": [0, 1], "compute_thread_in_device": 0},
               "kv_cache_mode": "AsCacheDefault", "eviction_strategy": "MaxLength", "enable_prefix_cache": True,
               "prefix_cache_ttl": 120, "enable_sparsity_matmul": False, "cache_span_num_init": 0,
               "engine_max_prefill_length": 512, "kv_cache_span_size": 64, "sparse_compute": "none"}
    cfg = AsModelRuntimeConfigBuilder().from_dict(section).build()
    assert (cfg.model_name, cfg.compute_unit, cfg.engine_max_batch, cfg.prefix_cache_ttl) == \
        ("default_model_id", "CPU:0,1", 8, 120)
    assert (cfg.engine_max_prefill_length, cfg.cache_span_size) == (512, 64)
    assert runtime().update_from_dict({"compute_unit": "CPU:0,1"}).build().device_ids == [0, 1]
    for bad, match in (({"eviction_strategy": "Random"}, "only MaxLength"),
                       ({"sparse_compute": "nv_tensor_sparse_2_4"}, "only 'none'"),
                       ({"enable_sparsity_matmul": True}, "sparse"),
                       ({"cuda_mem": {"memory_ratio": 0.9}}, "cuda_mem")):
        with pytest.raises(ValueError, match=match):
            runtime().update_from_dict(bad)


def test_as_model_config_default_constructor_and_attributes(tmp_path):
    cfg = AsModelConfig()
    cfg.model_name = "qwen"
    cfg.model_path = str(tmp_path / "qwen.asgraph")
    cfg.weights_path = str(tmp_path / "qwen.asparam")
    cfg.engine_max_length, cfg.engine_max_batch, cfg.num_threads = 1024, 4, 2
    cfg.cache_mode = AsCacheMode.AsCacheQuantU4
    built = cfg.build()
    assert (built.model_dir, built.model_prefix) == (str(tmp_path), "qwen")
    assert (built.engine_max_length, built.engine_max_batch, built.num_threads) == (1024, 4, 2)
    assert (built.compute_unit, built.cache_mode) == ("CPU:0", AsCacheMode.AsCacheQuantU4)


def test_as_model_config_v1_keyword_constructor():
    """The keywords of DashInfer 1.3's EngineHelper (its AsModelConfig binding, default CPU:0)."""
    cfg = AsModelConfig(model_name="qwen", model_path="/m/qwen.asgraph", weights_path="/m/qwen.asparam",
                        engine_max_length=512, engine_max_batch=2, num_threads=1, matmul_precision="medium")
    assert cfg.compute_unit == "CPU:0" and cfg.enable_prefix_cache is True and cfg.prefix_cache_ttl == 300
    built = cfg.build()
    assert (built.model_name, built.max_length, built.max_batch, built.thread_num) == ("qwen", 512, 2, 1)
    assert AsModelConfig(model_name="q", model_path="/m/q.asgraph", weights_path="/m/q.asparam").build().max_batch == 32


@pytest.mark.parametrize("attr,value,match", [
    ("compute_unit", "CUDA:0", "no CUDA"), ("matmul_precision", "low", "matmul_precision"),
    ("swap_threshold", 0, "swap_threshold"), ("lora_names", ["a"], "LoRA"),
    ("enable_sparsity_matmul", True, "sparse"), ("weights_path", "/other/q.asparam", "model_file_path"),
])
def test_as_model_config_refusals_say_why(attr, value, match):
    cfg = AsModelConfig(model_name="q", model_path="/m/q.asgraph", weights_path="/m/q.asparam")
    setattr(cfg, attr, value)
    with pytest.raises(ValueError, match=match):
        cfg.build()


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_prefix_blocks_expire_after_ttl():
    clock = FakeClock()
    pool = BlockPool(8, 4, prefix_cache=True, prefix_cache_ttl=300, clock=clock)
    prompt = list(range(13))  # 3 full blocks reusable (the last token is never matched)
    first = pool.allocate(prompt)
    pool.register_full_blocks(first, prompt, len(prompt))
    pool.free(first)
    clock.now += 299
    assert pool.match_prefix(prompt) == 12  # still within the ttl
    second = pool.allocate(prompt)
    assert second.cached_len == 12
    pool.free(second)  # used again: its clock restarts now
    clock.now += 299
    assert pool.match_prefix(prompt) == 12
    clock.now += 1
    assert pool.match_prefix(prompt) == 0  # 300 s unused: forgotten
    assert pool.num_available == 8 and not pool.cached


def test_blocks_in_use_never_expire():
    clock = FakeClock()
    pool = BlockPool(8, 4, prefix_cache=True, prefix_cache_ttl=10, clock=clock)
    prompt = list(range(9))
    holder = pool.allocate(prompt)
    pool.register_full_blocks(holder, prompt, len(prompt))
    clock.now += 1000
    assert pool.match_prefix(prompt) == 8  # the sequence still holds them
    pool.free(holder)
    clock.now += 10
    assert pool.match_prefix(prompt) == 0
