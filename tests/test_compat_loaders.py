"""The model loaders called as DashInfer's users call them (issue 10, points 6, 7, 8 and 11):
upstream's argument order and keywords, the load and serialize options it accepts, DashInferModel
with a DIConfig, InstantQuant's per-channel default, and an AsModelConfig installed on the Engine."""
import json
import os
import time

import numpy as np
import pytest

import dashinfer_client as allspark
from dashinfer_client import (AsModelConfig, AsStatus, HuggingFaceModel, DashInferModel, ModelSerializerException,
                              TargetDevice)
from tests.engine_helpers import collect, greedy
from tests.helpers import build_tiny_model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat")
    built = {dtype: build_tiny_model(str(root / dtype), dtype=dtype)
             for dtype in ("float32", "float16", "bfloat16")}
    built["bin"] = build_tiny_model(str(root / "bin"), dtype="float16", weights="bin")
    return built


def config_dtype(hf_dir):
    hf = json.load(open(os.path.join(hf_dir, "config.json")))
    return hf.get("torch_dtype") or hf.get("dtype")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_no_data_type_keeps_the_checkpoints(checkpoints, tmp_path, dtype):
    hf = checkpoints[dtype]
    assert config_dtype(hf) == dtype  # what transformers wrote is the reference
    loader = HuggingFaceModel(hf, "tiny", progress=False).load_model()
    assert loader.data_type == dtype
    loader.serialize_to_path(None, str(tmp_path))
    assert DashInferModel(str(tmp_path), "tiny").dtype == dtype


def test_no_data_type_and_none_in_config_is_bfloat16(checkpoints):
    """Upstream's fallback when config.json names no dtype (this .bin checkpoint's does not)."""
    assert config_dtype(checkpoints["bin"]) is None
    assert HuggingFaceModel(checkpoints["bin"], "t", progress=False).read_model_config().data_type == "bfloat16"


def test_upstream_positional_order_and_in_memory(checkpoints):
    loader = HuggingFaceModel(checkpoints["float32"], "tiny", True, "bfloat16", False, progress=False)
    assert (loader.in_memory_serialize, loader.data_type, loader.trust_remote_code) == (True, "bfloat16", False)
    # serialize_to_memory(engine, enable_quant, weight_only_quant, multinode_mode, customized_quant_config)
    loader.load_model().serialize_to_memory(None, True, True, False, {"quant_method": "instant_quant",
                                                                      "weight_format": "int8"})
    try:
        rt = loader.create_reference_runtime_config_builder(
            engine_model_name="mem", device_type=TargetDevice.CPU, device_ids=[0], max_batch=2).build()
        assert (rt.model_name, rt.compute_unit, rt.max_batch) == ("mem", "CPU:0", 2)
        assert DashInferModel(rt.model_dir, rt.model_prefix).dtype == "bfloat16"
        gen = loader.create_reference_generation_config_builder(runtimeConfig=rt.__class__(
            **dict(rt.to_dict(), max_length=40))).build()
        assert gen["max_length"] == 40
    finally:
        loader.free_memory_serialize_file()


def test_load_model_options(checkpoints, tmp_path):
    loader = HuggingFaceModel(checkpoints["float32"], "tiny", progress=False)
    loader.load_model(override_data_type="float16", load_format="safetensors")
    assert loader.data_type == "float16"
    loader.serialize_to_path(None, str(tmp_path), multinode_mode=False)  # same unsharded files either way
    assert DashInferModel(str(tmp_path), "tiny").dtype == "float16"
    HuggingFaceModel(checkpoints["bin"], "t", progress=False).load_model(None, True, "pt")  # .bin files
    HuggingFaceModel(checkpoints["float32"], "t", progress=False).load_model(load_format=None)
    for kwargs, match in (({"load_format": "pt"}, "expected pytorch_model.bin"),
                          ({"load_format": "gguf"}, "not one of"),
                          ({"override_data_type": "int8"}, "override_data_type 'int8'")):
        with pytest.raises(ModelSerializerException, match=match):
            HuggingFaceModel(checkpoints["float32"], "t", progress=False).load_model(**kwargs)
    with pytest.raises(ModelSerializerException, match="safetensors"):
        HuggingFaceModel(checkpoints["bin"], "t", progress=False).load_model(load_format="safetensors")
    with pytest.raises(ModelSerializerException, match="LoRA"):
        loader.serialize_to_path(None, str(tmp_path), lora_cfg={"name": "x"})


def test_model_file_path_keywords():
    cfg = (allspark.AsModelRuntimeConfigBuilder().model_name("m")
           .model_file_path(model_file_name="/d/p.asgraph", weight_file_path="/d/p.asparam").build())
    assert (cfg.model_path, cfg.weights_path) == ("/d/p.asgraph", "/d/p.asparam")


def test_instant_quant_without_group_size_is_per_channel(checkpoints, tmp_path):
    """Upstream's IQSettings: group_size = quant_config.get("group_size", -1)."""
    loader = HuggingFaceModel(checkpoints["float32"], "tiny", progress=False).load_model()
    loader.serialize_to_path(None, str(tmp_path), enable_quant=True, weight_only_quant=True,
                             customized_quant_config={"quant_method": "instant_quant", "weight_format": "int8"})
    model = DashInferModel(str(tmp_path), "tiny")
    assert model.quantization["group_size"] == -1
    n, k = model.tensor("model.layers.0.mlp.down_proj.weight.qweight").shape
    assert model.tensor("model.layers.0.mlp.down_proj.weight.scales").shape == (n, 1)  # one scale a row


DICONFIG = """
runtime_config:
  model_name: di_model
  compute_unit: {device_type: CPU, device_ids: [0], compute_thread_in_device: 1}
  engine_max_length: 96
  engine_max_batch: 3
  enable_prefix_cache: TRUE
generation_config:
  top_k: 7
  eos_token_id: [5]
"""


def test_dashinfer_model_default_name_and_diconfig(checkpoints, tmp_path):
    HuggingFaceModel(checkpoints["float32"], "model", progress=False).load_model().serialize_to_path(
        None, str(tmp_path))
    plain = DashInferModel(str(tmp_path))  # name defaults to "model", as upstream
    cfg = plain.create_reference_runtime_config_builder().build()  # argument-free, as upstream
    assert (cfg.model_name, cfg.model_prefix, cfg.compute_unit) == ("model", "model", "CPU:0")
    assert cfg.max_length == plain.get_model_context_length()

    di = DashInferModel(str(tmp_path), config_content=DICONFIG)
    cfg = di.create_reference_runtime_config_builder().build()
    assert (cfg.model_name, cfg.engine_max_length, cfg.engine_max_batch, cfg.num_threads) == ("di_model", 96, 3, 1)
    assert di.create_reference_runtime_config_builder(max_batch=9).build().max_batch == 9  # arguments win
    gen = di.create_reference_generation_config_builder(runtimeConfig=cfg).build()
    assert (gen["top_k"], gen["eos_token_id"], gen["max_length"]) == (7, 5, 96)  # one eos id stays an int

    exporter = HuggingFaceModel(checkpoints["float32"], "model", progress=False)
    exporter.export_model_diconfig(str(tmp_path / "exported.yaml"))  # read back as a DIConfig
    back = DashInferModel(str(tmp_path), config_file_path=str(tmp_path / "exported.yaml"))
    cfg = back.create_reference_runtime_config_builder().build()
    assert (cfg.model_name, cfg.compute_unit, cfg.engine_max_batch) == ("model", "CPU:0", 32)
    assert cfg.engine_max_length == min(2048, back.get_model_context_length())

    (tmp_path / "dimodel_config.yaml").write_text(DICONFIG)  # found beside the model when not given
    assert DashInferModel(str(tmp_path)).create_reference_runtime_config_builder().build().model_name == "di_model"
    with pytest.raises(ModelSerializerException, match="cuda_mem"):
        DashInferModel(str(tmp_path), config_content="runtime_config: {cuda_mem: {memory_ratio: 0.9}}")
    with pytest.raises(ModelSerializerException, match="cannot read the DIConfig"):
        DashInferModel(str(tmp_path), config_file_path=str(tmp_path / "nowhere.yaml"))


def run_prompt(engine, name, prompt):
    status, handle, queue = engine.start_request_ids(name, None, prompt, greedy(len(prompt) + 4))
    assert status == AsStatus.ALLSPARK_SUCCESS
    ids, elements = collect(queue)
    engine.release_request(name, handle)
    return ids, {e.prefix_cache_len for e in elements}


def test_engine_installs_as_model_config_and_expires_prefixes(checkpoints, tmp_path):
    """An AsModelConfig filled by attribute is installed as it is; with prefix_cache_ttl 2 a prefix
    reused at once is served from the cache, and after 3 idle seconds it is computed again."""
    HuggingFaceModel(checkpoints["float32"], "tiny", progress=False).load_model().serialize_to_path(None, str(tmp_path))
    cfg = AsModelConfig(model_name="ttl", model_path=str(tmp_path / "tiny.asgraph"),
                        weights_path=str(tmp_path / "tiny.asparam"), engine_max_length=128, engine_max_batch=2)
    cfg.cache_span_size, cfg.prefix_cache_ttl = 16, 2
    engine = allspark.Engine()
    assert engine.install_model(cfg) == AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model("ttl") == AsStatus.ALLSPARK_SUCCESS
    try:
        prompt = [int(x) for x in np.random.default_rng(3).integers(3, 200, 40)]
        first, cached = run_prompt(engine, "ttl", prompt)
        assert cached == {0}
        again, cached = run_prompt(engine, "ttl", prompt)
        assert cached == {32} and again == first  # two whole blocks of 16 reused
        time.sleep(3)
        late, cached = run_prompt(engine, "ttl", prompt)
        assert cached == {0} and late == first
    finally:
        engine.release_model("ttl")


def test_both_engines_install_an_as_model_config(api_engine):
    """The v1 keyword form, installed through install_model on Engine and ClientEngine alike."""
    engine, _, loader = api_engine
    rt = loader.create_reference_runtime_config_builder().build()
    cfg = AsModelConfig(model_name="v1-style", model_path=rt.model_path, weights_path=rt.weights_path,
                        compute_unit="CPU:0", engine_max_length=64, engine_max_batch=2, num_threads=1,
                        matmul_precision="medium")
    assert engine.install_model(cfg) == AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model("v1-style") == AsStatus.ALLSPARK_SUCCESS
    try:
        prompt = [7, 8, 9, 10]
        ids, _ = run_prompt(engine, "v1-style", prompt)
        reference, _ = run_prompt(engine, api_engine[1], prompt)
        assert len(ids) == 4 and ids == reference  # the same model under another config
    finally:
        engine.release_model("v1-style")
