"""DashInfer 2.0's dynamic-quantization flow (its rc2 test_12): HuggingFaceModel -> serialize(engine,
enable_quant=True, customized_quant_config=...) -> install_model/start_model -> greedy requests,
for each InstantQuant setting DashInfer ships, on a tiny random model. Supported settings serve and
stay close to the unquantized model's greedy output; the ones DashInfer marks unsupported (and fp8,
which needs GPU hardware) are refused at serialization with a message naming the setting."""
import pytest

import dashinfer_client as allspark
from dashinfer_client import AsCacheMode, AsStatus, GenerateRequestStatus, TargetDevice
from dashinfer_client.errors import ModelSerializerException

PROMPT_IDS = [1, 17, 42, 99, 5, 63, 120, 7]
NEW_TOKENS = 8
INT8 = {"quant_method": "instant_quant", "weight_format": "int8"}
# name: (customized_quant_config, kv cache mode, greedy tokens that must equal bf16's). A random
# tiny model has near-ties that 4-bit noise (uint4 per channel: ~9% relative RMS error) flips after
# the first token; 8-bit noise (~0.5%) keeps the first three. A uint4 KV cache moves this model's
# logits by up to ~1.5 (test_engine_logits checks it against transformers with the same rounding),
# enough to change even the first token here: that variant is only checked to serve.
SUPPORTED = {
    "a16w8_per_channel": (INT8, None, 3),
    "a16w8_per_channel_kv8": (INT8, AsCacheMode.AsCacheQuantI8, 3),
    "a16w8_per_channel_kv4": (INT8, AsCacheMode.AsCacheQuantU4, 0),
    "a16w8_group32": (dict(INT8, group_size=32), None, 3),
    "a8w8_per_channel": (dict(INT8, compute_method="activate_quant"), None, 3),
    "a16w4_per_channel": ({"quant_method": "instant_quant", "weight_format": "uint4"}, None, 1),
}
UNSUPPORTED = {
    "fp8_a8w8_per_tensor": ({"quant_method": "instant_quant", "weight_format": "fp8_e4m3",
                             "compute_method": "activate_quant"}, "weight_format 'fp8_e4m3'"),
    "a8w8_group": (dict(INT8, group_size=32, compute_method="activate_quant"), "group_size -1"),
    "a8w4": ({"quant_method": "instant_quant", "weight_format": "uint4", "compute_method": "activate_quant"},
             "weight_format 'int8'"),
}


def greedy_ids(engine, hf_dir, out_dir, quant_config=None, cache_mode=None):
    """The rc2 flow once: serialize (quantized when quant_config), serve one greedy request -> ids."""
    loader = allspark.HuggingFaceModel(str(hf_dir), "tiny", in_memory_serialize=False,
                                       user_set_data_type="bfloat16")
    (loader.load_model().read_model_config()
     .serialize(engine, model_output_dir=str(out_dir), enable_quant=quant_config is not None,
                customized_quant_config=quant_config, weight_only_quant=True)
     .free_model())
    builder = loader.create_reference_runtime_config_builder("tiny", TargetDevice.CPU, [0], max_batch=1)
    builder.max_length(64)
    if cache_mode is not None:
        builder.kv_cache_mode(cache_mode)
    runtime_cfg = builder.build()
    assert engine.install_model(runtime_cfg) == AsStatus.ALLSPARK_SUCCESS
    engine.start_model("tiny")
    try:
        gen_cfg = loader.create_reference_generation_config_builder(runtime_cfg)
        total = len(PROMPT_IDS) + NEW_TOKENS
        gen_cfg.update({"top_k": 1, "max_length": total, "min_length": total})
        status, handle, queue = engine.start_request_ids("tiny", loader, PROMPT_IDS, gen_cfg)
        assert status == AsStatus.ALLSPARK_SUCCESS
        engine.sync_request("tiny", handle)
        assert queue.GenerateStatus() == GenerateRequestStatus.GenerateFinished
        ids = queue.Get().ids_from_generate
        engine.release_request("tiny", handle)
        return ids
    finally:
        engine.stop_model("tiny")
        engine.release_model("tiny")


@pytest.fixture(scope="module")
def flow(tiny_checkpoint, tmp_path_factory):
    hf_dir = tiny_checkpoint("llama")
    engine = allspark.Engine()
    reference = greedy_ids(engine, hf_dir, tmp_path_factory.mktemp("bf16"))
    return engine, hf_dir, reference


@pytest.mark.parametrize("name", SUPPORTED)
def test_supported_setting_serves_close_to_bf16(name, flow, tmp_path):
    engine, hf_dir, reference = flow
    quant_config, cache_mode, same = SUPPORTED[name]
    ids = greedy_ids(engine, hf_dir, tmp_path, quant_config, cache_mode)
    assert len(ids) == NEW_TOKENS
    assert ids[:same] == reference[:same], (name, ids, reference)
    saved = allspark.DashInferModel(str(tmp_path), "tiny").quantization
    assert saved["weight_format"] == quant_config["weight_format"]
    assert saved["group_size"] == quant_config.get("group_size", -1)  # DashInfer's default: per channel
    assert saved["compute_method"] == quant_config.get("compute_method", "weight_only")


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_setting_is_refused_naming_it(name, flow, tmp_path):
    engine, hf_dir, reference = flow
    quant_config, named = UNSUPPORTED[name]
    with pytest.raises(ModelSerializerException, match=named):
        greedy_ids(engine, hf_dir, tmp_path, quant_config)
    assert not list(tmp_path.iterdir())  # nothing half-written
    assert greedy_ids(engine, hf_dir, tmp_path / "after") == reference  # the engine still serves


@pytest.mark.parametrize("path", ["vnni", "avx2", "portable"])
def test_activate_quant_computes_with_int8_activations_on_every_cpu(path, monkeypatch):
    from dashinfer_server import weights
    monkeypatch.setattr(weights.K, "linear_q8_path", lambda: path)
    for wtype in ("i8", "u4"):
        assert weights.quantized_wtype(wtype, 576, activate_quant=True) == wtype + "q"
        assert weights.quantized_wtype(wtype, 48, activate_quant=True) == wtype  # not whole blocks
    # weight-only codes take the int8-activation path only where its kernel beats the exact one
    assert weights.quantized_wtype("i8", 576) == ("i8q" if path == "vnni" else "i8")
    assert weights.quantized_wtype("u4", 576) == ("u4" if path == "portable" else "u4q")
