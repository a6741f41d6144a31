"""DashInfer 1.3's CPU flow, as its examples ran it: a JSON config, dashinfer.helper.EngineHelper,
serialize_model_from_torch into {name}.dimodel/.ditensors, build_model_from_config_struct, and the
request loop; checked against transformers' greedy output on tiny random models."""
import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dashinfer_client as allspark
from dashinfer.helper import ConfigManager, EngineHelper
from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model.safetensors_io import SafetensorsFile
from dashinfer_client.quantization import QuantizeConfig
from tests.helpers import load_hf_model

MODEL_TYPES = {"qwen2": "Qwen_v20", "llama": "LLaMA_v3"}
PROMPT = "<|im_start|>user\nWhere is the capital of Zhejiang?<|im_end|>\n<|im_start|>assistant\n"
GREEDY = {"top_k": 1, "repetition_penalty": 1.0, "max_length": 64, "eos_token_id": 2, "stop_words_ids": [[2]]}


def v13_config(arch, model_path, **changes):
    """A config as DashInfer 1.3's examples/python/model_config files are, for a tiny model."""
    config = {"model_name": f"tiny-{arch}", "model_type": MODEL_TYPES[arch], "model_path": str(model_path),
              "data_type": "float32", "device_type": "CPU", "device_ids": [0], "multinode_mode": False,
              "engine_config": {"engine_max_length": 256, "engine_max_batch": 4, "do_profiling": False,
                                "num_threads": 0, "matmul_precision": "medium"},
              "generation_config": {"temperature": 1.0, "early_stopping": True, "top_k": 1024, "top_p": 0.8,
                                    "repetition_penalty": 1.1, "presence_penalty": 0.0, "min_length": 0,
                                    "max_length": 256, "no_repeat_ngram_size": 0, "eos_token_id": 2,
                                    "seed": 1234, "stop_words_ids": [[0], [1], [2]]},
              "convert_config": {"do_dynamic_quantize_convert": False},
              "quantization_config": {"activation_type": "bfloat16", "weight_type": "uint8", "SubChannel": True,
                                      "GroupSize": 64}}
    return ConfigManager.recursive_merge(config, changes)


def hf_greedy(hf_dir, ids, max_length):
    """transformers' greedy continuation of ids, up to max_length tokens in all, cut after eos (2)."""
    import torch
    out = load_hf_model(hf_dir).generate(torch.tensor([ids]), max_length=max_length, do_sample=False,
                                         eos_token_id=2, pad_token_id=0)[0, len(ids):].tolist()
    return out[: out.index(2) + 1] if 2 in out else out


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_engine_helper_end_to_end_matches_transformers(arch, tiny_checkpoint, tmp_path, capsys):
    hf_dir = tiny_checkpoint(arch)
    helper = EngineHelper(v13_config(arch, tmp_path / "models"))
    assert helper.model_name == f"tiny-{arch}_cpu_single_float32"  # DashInfer 1.3's file naming
    helper.init_tokenizer(hf_dir)
    assert not helper.check_model_exist()
    helper.convert_model(hf_dir)
    assert helper.check_model_exist()
    assert sorted(os.listdir(tmp_path / "models")) == [helper.model_name + s for s in
                                                      (".dimodel", ".ditensors", ".tokenizer")]
    helper.init_engine()
    try:
        gen = dict(copy.deepcopy(helper.default_gen_cfg), **GREEDY)
        requests = helper.create_request([PROMPT, PROMPT], [gen, gen])
        helper.process_one_request(requests[0])
        streamed = list(helper.process_one_request_stream(requests[1]))
    finally:
        helper.uninit_engine()
    want = hf_greedy(hf_dir, requests[0].in_tokens, GREEDY["max_length"])
    assert requests[0].in_tokens == helper.tokenizer(PROMPT)["input_ids"]
    assert requests[0].out_tokens == want and requests[1].out_tokens == want
    assert requests[0].status == int(allspark.GenerateRequestStatus.GenerateFinished)
    assert requests[0].out_text == helper.tokenizer.decode(want, skip_special_tokens=True)
    assert streamed and streamed[-1] == requests[1].out_text
    helper.print_profiling_data(requests, 1.0)
    table = capsys.readouterr().out
    assert "Avg_out_tokens" in table and f"| {len(want)}.000" in table  # both answers have len(want) tokens
    assert json.loads(helper.convert_request_to_jsonstr(requests[0]))["out_tokens"] == want


def test_serialize_from_torch_builds_on_both_engines(tiny_checkpoint, tmp_path):
    """serialize_model_from_torch (a state_dict and config.__dict__, as EngineHelper passes them),
    then build_model_from_config_struct on Engine and ClientEngine: both give transformers' tokens."""
    hf_dir = tiny_checkpoint("qwen2")
    model = load_hf_model(hf_dir)
    ids = [1, 40, 41, 42, 43, 2]
    want = hf_greedy(hf_dir, ids, 24)
    out_dir = str(tmp_path)
    engines = [allspark.Engine(), allspark.ClientEngine(startup_timeout=120)]
    try:
        engines[0].serialize_model_from_torch("qwen", "Qwen_v15", model.state_dict(), model.config.__dict__,
                                              out_dir, multinode_mode=True, data_type="float32")
        for engine in engines:
            cfg = allspark.AsModelConfig(model_name="qwen", model_path=os.path.join(out_dir, "qwen.dimodel"),
                                         weights_path=os.path.join(out_dir, "qwen.ditensors"),
                                         engine_max_length=64, engine_max_batch=2)
            cfg.prefill_mode = allspark.AsMHAPrefill.AsPrefillFlashV2  # what DashInfer 1.3 chose on AVX-512
            assert engine.build_model_from_config_struct(cfg) == allspark.AsStatus.ALLSPARK_SUCCESS
            assert engine.start_model("qwen") == allspark.AsStatus.ALLSPARK_SUCCESS
            status, handle, queue = engine.start_request_ids("qwen", None, ids, dict(GREEDY, max_length=24))
            assert status == allspark.AsStatus.ALLSPARK_SUCCESS
            got = []
            while (elements := queue.Get()) is not None:
                got += elements.ids_from_generate
            assert got == want
            engine.release_request("qwen", handle)
            engine.stop_model("qwen")
            engine.release_model("qwen")
    finally:
        engines[1].close()


@pytest.mark.parametrize("weight_type,sub_channel,fmt,group", [
    ("uint8", True, "int8", 64), ("int8", False, "int8", -1), ("uint4", True, "uint4", 64),
    ("uint4", False, "uint4", -1)])
def test_quantize_config_gives_instant_quant(weight_type, sub_channel, fmt, group, tiny_checkpoint, tmp_path):
    """The .ditensors of a QuantizeConfig hold the same tensors as serialize_to_path with the
    equivalent customized_quant_config; per channel (SubChannel False) means one scale per row."""
    hf_dir = tiny_checkpoint("llama")
    model = load_hf_model(hf_dir)
    q = QuantizeConfig("bfloat16", weight_type, extra_option={"SubChannel": sub_channel, "GroupSize": 64})
    assert q.customized_quant_config() == {"quant_method": "instant_quant", "weight_format": fmt, "group_size": group}
    allspark.Engine().serialize_model_from_torch("m", "LLaMA_v2", model, model.config.__dict__, str(tmp_path / "a"),
                                                 False, "float32", True, q)
    loader = allspark.HuggingFaceModel(hf_dir, "m", user_set_data_type="float32", progress=False)
    loader.load_model().serialize_to_path(None, str(tmp_path / "b"), enable_quant=True,
                                          customized_quant_config={"weight_format": fmt, "group_size": group})
    ours, ref = SafetensorsFile(str(tmp_path / "a" / "m.ditensors")), SafetensorsFile(str(tmp_path / "b" / "m.asparam"))
    assert sorted(ours.keys()) == sorted(ref.keys())
    for name in ref.keys():
        assert np.array_equal(ours.get(name), ref.get(name)), name
    k = model.config.hidden_size
    scales = ours.get("model.layers.0.self_attn.q_proj.weight.scales")
    assert scales.shape[1] == (1 if group == -1 else k // group)
    graph = json.load(open(tmp_path / "a" / "m.dimodel"))
    assert graph["quantization"]["weight_format"] == fmt and graph["quantization"]["group_size"] == group


def test_quantize_config_refuses_what_dashinfer_refused():
    assert QuantizeConfig("float16", "int8").group_size == -1  # SubChannel off by default: per channel
    assert QuantizeConfig("bfloat16", "uint8", extra_option={"SubChannel": True}).group_size == 512
    for args, kwargs in [(("float32", "int8"), {}), (("bfloat16", "int4"), {}),
                         (("bfloat16", "int8"), {"extra_option": {"SubChannel": True, "GroupSize": 100}}),
                         (("bfloat16", "int8"), {"extra_option": {"Sparse": True}}),
                         (("bfloat16", "int8"), {"op_type_to_quantize": ["CONV"]}),
                         (("bfloat16", "int8"), {"quan_json": {"x": 1}})]:
        with pytest.raises(ValueError):
            QuantizeConfig(*args, **kwargs)


def test_serialize_from_torch_refusals(tiny_checkpoint, tmp_path):
    model = load_hf_model(tiny_checkpoint("llama"))
    state, cfg = model.state_dict(), model.config.__dict__
    engine = allspark.Engine()
    cases = [
        (("m", "ChatGLM_v2", state, cfg), {}, "architecture this runtime does not have"),
        (("m", "Qwen_v20", state, cfg), {}, "LlamaForCausalLM"),  # the config says LLaMA
        (("m", "LLaMA_v2", state, cfg), {"use_dynamic_ntk": True}, "use_dynamic_ntk"),
        (("m", "LLaMA_v2", state, cfg), {"seqlen_extrapolation": 2.0}, "seqlen_extrapolation"),
        (("m", "LLaMA_v2", state, cfg), {"do_dynamic_quantize_convert": True}, "needs a quant_config"),
        (("m", "LLaMA_v2", state, cfg), {"data_type": "int8"}, "data_type"),
        (("m", "LLaMA_v2", {k: v for k, v in state.items() if "layers.1." not in k}, cfg), {}, "lacks tensor"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ModelSerializerException, match=message):
            engine.serialize_model_from_torch(*args, str(tmp_path), **kwargs)
    assert os.listdir(tmp_path) == []  # nothing half-written


def test_rotary_base_overrides_the_config(tiny_checkpoint, tmp_path):
    model = load_hf_model(tiny_checkpoint("llama"))
    engine = allspark.Engine()
    engine.serialize_model_from_torch("a", "LLaMA_v3", model.state_dict(), model.config.__dict__, str(tmp_path))
    engine.serialize_model_from_torch("b", "LLaMA_v3", model.state_dict(), model.config.__dict__, str(tmp_path),
                                      rotary_base=500000.0)
    theta = {p: json.load(open(tmp_path / f"{p}.dimodel"))["config"]["rope_theta"] for p in "ab"}
    assert theta == {"a": model.config.rope_parameters["rope_theta"], "b": 500000.0}


def test_config_manager():
    config = ConfigManager.create_config({"model_name": "m", "model_type": "Qwen_v15",
                                          "engine_config": {"engine_max_batch": 2}})
    assert config["engine_config"] == dict(ConfigManager.get_default_config()["engine_config"], engine_max_batch=2)
    assert config["generation_config"]["top_k"] == 1024  # DashInfer 1.3's defaults underneath
    for bad in ({"model_name": "", "model_type": "Qwen_v15"}, {"model_name": "m", "model_type": "Baichuan"},
                {"model_name": "m", "model_type": "Qwen_v15", "device_type": "CUDA"}):
        with pytest.raises(ValueError):
            ConfigManager.create_config(bad)


def test_dimodel_file_names(serialized_tiny, tmp_path):
    builder = allspark.AsModelRuntimeConfigBuilder().model_name("m")
    cfg = builder.model_file_path(str(tmp_path / "p.dimodel"), str(tmp_path / "p.ditensors")).build()
    assert (cfg.model_dir, cfg.model_prefix) == (str(tmp_path), "p")
    with pytest.raises(ValueError):
        builder.model_file_path(str(tmp_path / "p.dimodel"), str(tmp_path / "p.asparam"))
    bad = allspark.AsModelConfig(model_name="m", model_path=str(tmp_path / "p.dimodel"),
                                 weights_path=str(tmp_path / "p.ditensors"))
    bad.prefill_mode = allspark.AsMHAPrefill.AsPrefillXformer
    with pytest.raises(ValueError, match="xformers"):
        bad.build()


def test_a_model_converted_by_dashinfer_is_refused_by_name(tmp_path):
    """DashInfer's own .dimodel is protobuf: install says so instead of failing on its bytes."""
    (tmp_path / "p.dimodel").write_bytes(b"\n\x05model\x12\x80\xff\xfe\x00")  # not UTF-8, not JSON
    (tmp_path / "p.ditensors").write_bytes(b"\x00" * 16)
    engine = allspark.Engine()
    cfg = allspark.AsModelConfig(model_name="p", model_path=str(tmp_path / "p.dimodel"),
                                 weights_path=str(tmp_path / "p.ditensors"), engine_max_length=64)
    status, reason = engine.call_with_reason("build_model_from_config_struct", cfg)
    assert status == allspark.AsStatus.ALLSPARK_IO_ERROR
    assert "p.dimodel is not valid JSON" in reason and "converted by DashInfer itself" in reason


SERVE_WITHOUT_TORCH = """
import json, sys
sys.modules["torch"] = None          # any import of torch or transformers now fails
sys.modules["transformers"] = None
from dashinfer.helper import EngineHelper
helper = EngineHelper(json.loads(sys.argv[1]))
helper.init_tokenizer(sys.argv[2])
assert helper.check_model_exist()
helper.init_engine()
request = helper.create_request([sys.argv[3]], [json.loads(sys.argv[4])])[0]
helper.process_one_request(request)
helper.uninit_engine()
print(json.dumps(request.out_tokens))
"""


def test_converted_model_serves_without_torch(tiny_checkpoint, tmp_path):
    """A DashInfer 1.3 script over a model already converted (check_model_exist, init_engine) runs
    where torch and transformers cannot be imported, and answers as transformers does."""
    hf_dir = tiny_checkpoint("qwen2")
    config = v13_config("qwen2", tmp_path)
    helper = EngineHelper(copy.deepcopy(config))
    helper.init_tokenizer(hf_dir)
    helper.convert_model(hf_dir)
    gen = dict(helper.default_gen_cfg, **GREEDY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", SERVE_WITHOUT_TORCH, json.dumps(config), hf_dir, PROMPT,
                          json.dumps(gen)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ids = helper.tokenizer(PROMPT)["input_ids"]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == hf_greedy(hf_dir, ids, GREEDY["max_length"])


def test_engine_helper_on_two_numa_nodes(tiny_checkpoint, tmp_path, monkeypatch):
    """device_ids [0, 1] (DashInfer 1.3's multi-NUMA config): a ClientEngine over two
    tensor-parallel ranks, same tokens as transformers."""
    monkeypatch.setenv("DASHINFER_NUMA_NODES", "0:0;1:1")  # two simulated nodes on this machine
    hf_dir = tiny_checkpoint("qwen2")
    helper = EngineHelper(v13_config("qwen2", tmp_path, device_ids=[0, 1]))
    assert isinstance(helper.engine, allspark.ClientEngine) and helper.model_name.endswith("_multi_float32")
    try:
        helper.init_tokenizer(hf_dir)
        helper.convert_model(hf_dir)
        helper.init_engine()
        request = helper.create_request([PROMPT], [dict(helper.default_gen_cfg, **GREEDY)])[0]
        helper.process_one_request(request)
        helper.uninit_engine()
        assert helper.engine.world_size == 2
    finally:
        helper.engine.close()
    assert request.out_tokens == hf_greedy(hf_dir, request.in_tokens, GREEDY["max_length"])
