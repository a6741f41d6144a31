"""Hugging Face checkpoints -> serialized model -> DashInferModel, on tiny random LLaMA / Qwen2 models."""
import glob
import json
import os
import shutil
import struct

import numpy as np
import pytest

from dashinfer_client.dtypes import from_bf16, to_bf16
from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from dashinfer_client.model.quant import dequantize, group_params
from dashinfer_client.model.safetensors_io import SafetensorsFile, save_file
from dashinfer_server import kernels as K
from tests.helpers import TINY, UNEVEN, build_tiny_model, chat_prompt_ids, serialize, source_tensors, variant
from tests.quant_reference import numpy_quantize, stored_parts, u4_reference

TO_CODE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def expected_storage(array, target):
    """What serialization must store for a source tensor: bit-exact when the dtype is unchanged."""
    if array.dtype == np.uint16:  # bf16 bits
        return array if target == "bfloat16" else from_bf16(array).astype(np.float16 if target == "float16" else np.float32)
    if target == "bfloat16":
        return to_bf16(array.astype(np.float32))
    return array.astype(np.float16 if target == "float16" else np.float32)


CASES = [  # arch, checkpoint dtype, weights layout, serialized dtype, extra config
    ("llama", "float32", "safetensors", "float32", {}),
    ("llama", "bfloat16", "sharded", "bfloat16", {}),
    ("llama", "float32", "bin", "bfloat16", {"tie_word_embeddings": True}),
    ("llama", "float16", "bin-sharded", "float32", {"uneven": True}),
    ("qwen2", "float32", "bin", "float32", {}),
    ("qwen2", "bfloat16", "sharded", "bfloat16", {"tie_word_embeddings": True}),
    ("qwen2", "bfloat16", "safetensors", "float32", {"uneven": True}),
]


@pytest.mark.parametrize("arch,src_dtype,layout,dtype,extra", CASES,
                         ids=[f"{a}-{s}-{w}-to-{d}{'-' + '-'.join(e) if e else ''}" for a, s, w, d, e in CASES])
def test_serialize_roundtrip(tmp_path, arch, src_dtype, layout, dtype, extra):
    src = build_tiny_model(tmp_path / "hf", arch=arch, dtype=src_dtype, weights=layout, **extra)
    loader = serialize(src, tmp_path / "out", dtype=dtype)
    model = DashInferModel(str(tmp_path / "out"), "tiny")

    hf_config = json.load(open(os.path.join(src, "config.json")))
    c = model.config
    assert model.architecture == arch and model.dtype == dtype and model.quantization is None
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (
        hf_config["hidden_size"], hf_config["num_attention_heads"], hf_config["num_key_value_heads"])
    assert c.head_dim == (UNEVEN["head_dim"] if extra.get("uneven") else TINY["hidden_size"] // TINY["num_attention_heads"])
    assert c.attention_bias == (arch == "qwen2")
    assert c.tie_word_embeddings == bool(extra.get("tie_word_embeddings"))
    assert c.eos_token_id == [2] and model.generation_config["eos_token_id"] == [2]
    assert c.rope_theta == 10000.0 and c.rope_scaling is None
    assert model.config == loader.config

    source = source_tensors(src)
    if c.tie_word_embeddings:
        source.pop("lm_head.weight", None)
    assert sorted(model.tensor_names()) == sorted(source)
    for name, array in source.items():
        stored = model.tensor(name)
        assert model.tensor_dtype(name) == TO_CODE[dtype]
        np.testing.assert_array_equal(stored, expected_storage(array, dtype), err_msg=name)
    if arch == "qwen2":
        assert "model.layers.1.self_attn.k_proj.bias" in model.tensor_names()


def test_asparam_opens_with_safetensors_library(tmp_path):
    import torch
    from safetensors.torch import load_file
    src = build_tiny_model(tmp_path / "hf", dtype="bfloat16")
    serialize(src, tmp_path / "out", dtype="bfloat16", enable_quant=True, weight_only_quant=True)
    lib = load_file(str(tmp_path / "out" / "tiny.asparam"))
    model = DashInferModel(str(tmp_path / "out"), "tiny")
    assert sorted(lib) == sorted(model.tensor_names())
    for name, t in lib.items():
        mine = model.tensor(name)
        theirs = t.view(torch.int16).numpy().view(np.uint16) if model.tensor_dtype(name) == "BF16" else t.numpy()
        np.testing.assert_array_equal(mine, theirs, err_msg=name)


def test_writer_mixed_dtypes_readable_by_library_and_aligned(tmp_path):
    import safetensors
    import torch
    tensors = {"a": np.arange(3, dtype=np.uint8), "b": np.ones((2, 3), np.float32), "c": np.arange(5, dtype=np.uint16)}
    save_file(tensors, tmp_path / "x.safetensors", dtypes={"c": "BF16"})
    st = SafetensorsFile(tmp_path / "x.safetensors")
    assert st.info("c") == ("BF16", (5,)) and st.info("b") == ("F32", (2, 3))
    for name, array in tensors.items():
        view = st.get(name)
        np.testing.assert_array_equal(view, array)
        assert view.ctypes.data % view.itemsize == 0
    with safetensors.safe_open(str(tmp_path / "x.safetensors"), "pt") as f:  # numpy has no bf16: torch
        assert sorted(f.keys()) == ["a", "b", "c"]
        assert f.get_tensor("b").sum().item() == 6.0
        assert f.get_tensor("c").view(torch.int16).numpy().view(np.uint16).tolist() == [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def serialized(tmp_path_factory, llama_dir):
    out = tmp_path_factory.mktemp("serialized")
    serialize(llama_dir, out)
    return str(out)


def copy_serialized(serialized, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(serialized, out)
    return str(out)


def test_truncated_asparam(serialized, tmp_path):
    out = copy_serialized(serialized, tmp_path)
    path = os.path.join(out, "tiny.asparam")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(ModelSerializerException, match=r"truncated safetensors file: tensor '.*' in .*tiny.asparam ends at"):
        DashInferModel(out, "tiny")
    with open(path, "r+b") as f:
        f.truncate(5)
    with pytest.raises(ModelSerializerException, match=r"truncated safetensors file .*tiny.asparam: 5 bytes"):
        DashInferModel(out, "tiny")


def test_bad_asparam_header(serialized, tmp_path):
    out = copy_serialized(serialized, tmp_path)
    path = os.path.join(out, "tiny.asparam")
    with open(path, "r+b") as f:
        f.seek(8)  # the JSON header starts after its 8-byte length
        f.write(b"{not json")
    with pytest.raises(ModelSerializerException, match=r"bad safetensors header in .*tiny.asparam: not valid JSON"):
        DashInferModel(out, "tiny")


def test_asparam_offsets_out_of_range(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                         "v": {"dtype": "F32", "shape": [2], "data_offsets": [16, 20]}}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(24))
    with pytest.raises(ModelSerializerException, match=r"tensor 'v' in .*bad.safetensors has offsets \[16, 20\] for 8 bytes"):
        SafetensorsFile(path)


def test_asgraph_shape_mismatch(serialized, tmp_path):
    out = copy_serialized(serialized, tmp_path)
    path = os.path.join(out, "tiny.asgraph")
    graph = json.load(open(path))
    graph["config"]["intermediate_size"] = 96
    json.dump(graph, open(path, "w"))
    with pytest.raises(ModelSerializerException,
                       match=r"tensor 'model.layers.0.mlp.gate_proj.weight' in .*tiny.asparam is F32\[128, 64\], "
                             r"the config in .*tiny.asgraph implies F32\[96, 64\]"):
        DashInferModel(out, "tiny")


def test_asgraph_missing_or_invalid(serialized, tmp_path):
    out = copy_serialized(serialized, tmp_path)
    path = os.path.join(out, "tiny.asgraph")
    with open(path, "w") as f:
        f.write("{")
    with pytest.raises(ModelSerializerException, match=r"tiny.asgraph is not valid JSON"):
        DashInferModel(out, "tiny")
    os.remove(path)
    with pytest.raises(ModelSerializerException, match=r"serialized model file .*tiny.asgraph is missing"):
        DashInferModel(out, "tiny")


def test_asparam_missing_tensor(serialized, tmp_path):
    out = copy_serialized(serialized, tmp_path)
    path = os.path.join(out, "tiny.asgraph")
    graph = json.load(open(path))
    graph["config"]["tie_word_embeddings"] = False
    graph["config"]["num_hidden_layers"] = 3
    json.dump(graph, open(path, "w"))
    with pytest.raises(ModelSerializerException, match=r"tensor 'model.layers.2.input_layernorm.weight' is missing from"):
        DashInferModel(out, "tiny")


# -- quantized serialization, memory serialization, DashInfer steps -----------------------------

@pytest.mark.parametrize("fmt,group", [("int8", 32), ("uint4", 64), ("int8", -1)])
def test_quantized_serialization(llama_dir, tmp_path, fmt, group):
    cfg = {"quant_method": "instant_quant", "weight_format": fmt, "group_size": group}
    loader = serialize(llama_dir, tmp_path, dtype="bfloat16", enable_quant=True, customized_quant_config=cfg)
    model = DashInferModel(str(tmp_path), "tiny")
    q = model.quantization
    assert q["weight_format"] == fmt and q["group_size"] == group
    assert len(q["quantized"]) == 7 * TINY["num_hidden_layers"] and "lm_head.weight" not in q["quantized"]
    source = source_tensors(llama_dir)
    name = "model.layers.1.mlp.down_proj.weight"  # [64, 128]
    parts = stored_parts(model, name, fmt)
    qw, scales, zeros = parts[:3]
    g = 128 if group == -1 else group
    assert qw.shape == (64, 128 if fmt == "int8" else 64) and scales.shape == (64, 128 // g) == zeros.shape
    w = source[name]
    deq = dequantize(parts, fmt, group)
    if fmt == "int8":
        assert (np.abs(deq - w) <= np.repeat(scales, g, axis=1) / 2 + 1e-6).all()
    else:  # the rule, group by group (tests/helpers.py)
        np.testing.assert_allclose(deq, u4_reference(w, g)[4], rtol=1e-6, atol=1e-7)
    step = np.max(group_params(parts, fmt)[0])
    assert model.tensor_dtype("lm_head.weight") == "BF16" and model.tensor_dtype("model.norm.weight") == "BF16"
    report = loader.serialization_report
    assert report["asparam_bytes"] == os.path.getsize(tmp_path / "tiny.asparam")
    assert 0 < report["quantization"]["max_abs_error"] <= 2 * float(step) and report["quantization"]["relative_rms_error"] < 0.2


def test_uint4_asparam_round_trip(llama_dir, tmp_path):
    """uint4 in groups of 32 stores 4.5 + 32/K bits a weight (native/linear.h): uint8 codes two a
    byte, a uint8 scale code and zero code per group, a float32 row scale; they load back as
    written and pack into the kernels' buffer at the same size (+ its 64-byte header). A file of
    format version 1 with uint4 weights (float32 group pairs) is refused with what to do; one
    with int8 weights still loads."""
    cfg = {"quant_method": "instant_quant", "weight_format": "uint4", "group_size": 32}
    serialize(llama_dir, tmp_path, dtype="bfloat16", enable_quant=True, customized_quant_config=cfg)
    model = DashInferModel(str(tmp_path), "tiny")
    name = "model.layers.1.mlp.down_proj.weight"  # [64, 128]
    parts = stored_parts(model, name, "uint4")
    assert [(p.dtype, p.shape) for p in parts] == [(np.uint8, (64, 64)), (np.uint8, (64, 4)), (np.uint8, (64, 4)),
                                                   (np.float32, (64,))]
    for got, want in zip(parts, numpy_quantize(source_tensors(llama_dir)[name], "uint4", 32)):
        assert np.array_equal(got, want)
    n, k = 64, 128
    assert sum(p.nbytes for p in parts) * 8 / (n * k) == 4.5 + 32 / k
    assert K.load().pack_linear(parts[0], "u4", 32, *parts[1:]).nbytes == 64 + sum(p.nbytes for p in parts)
    for fmt, refused in (("uint4", True), ("int8", False)):
        out = tmp_path / fmt
        if fmt == "int8":
            serialize(llama_dir, out, dtype="bfloat16", enable_quant=True,
                      customized_quant_config={"quant_method": "instant_quant", "weight_format": "int8"})
        else:
            shutil.copytree(tmp_path, out, ignore=shutil.ignore_patterns("uint4", "int8"))
        graph = json.load(open(out / "tiny.asgraph"))
        graph["version"] = 1
        json.dump(graph, open(out / "tiny.asgraph", "w"))
        if refused:
            with pytest.raises(ModelSerializerException, match="uint4 weights of format version 1.*convert the model again"):
                DashInferModel(str(out), "tiny")
        else:
            assert DashInferModel(str(out), "tiny").quantization["weight_format"] == "int8"


def test_quantize_lm_head_option(llama_dir, tmp_path):
    cfg = {"quant_method": "instant_quant", "weight_format": "int8", "quantize_lm_head": True}
    serialize(llama_dir, tmp_path, enable_quant=True, customized_quant_config=cfg)
    model = DashInferModel(str(tmp_path), "tiny")
    assert "lm_head.weight" in model.quantization["quantized"] and "lm_head.weight.qweight" in model.tensor_names()


def test_failed_conversion_leaves_previous_model(llama_dir, tmp_path, monkeypatch):
    serialize(llama_dir, tmp_path)
    cfg = {"quant_method": "instant_quant", "weight_format": "uint4", "group_size": 47}
    with pytest.raises(ModelSerializerException, match="uint4 needs an even group_size, got 47"):
        serialize(llama_dir, tmp_path, enable_quant=True, customized_quant_config=cfg)
    from dashinfer_client.model import hf

    def broken_fetch(self, name):
        if name.endswith("down_proj.weight"):
            raise OSError("disk on fire")
        return original_fetch(self, name)
    original_fetch = hf.HFWeights.fetch
    monkeypatch.setattr(hf.HFWeights, "fetch", broken_fetch)
    with pytest.raises(OSError, match="disk on fire"):
        serialize(llama_dir, tmp_path, dtype="bfloat16")
    model = DashInferModel(str(tmp_path), "tiny")
    assert model.quantization is None and model.dtype == "float32"
    assert not glob.glob(str(tmp_path / "*.tmp-*"))


def test_serialize_to_memory_and_reference_builders(llama_dir):
    from dashinfer_client.types import TargetDevice
    loader = HuggingFaceModel(llama_dir, "tiny/model", in_memory_serialize=True, progress=False)
    loader.load_model().read_model_config().serialize_to_memory(None, enable_quant=True, weight_only_quant=True)
    loader.free_model()  # DashInfer frees the source before install_model: the files must stay
    rt = loader.create_reference_runtime_config_builder("tiny", TargetDevice.CPU, [0], max_batch=4).max_length(100).build()
    assert rt.model_prefix == "tiny_model" and os.path.exists(rt.model_path) and os.path.exists(rt.weights_path)
    assert DashInferModel(rt.model_dir, rt.model_prefix).quantization["weight_format"] == "int8"
    gen = loader.create_reference_generation_config_builder(rt).build()
    assert gen["eos_token_id"] in ([2], 2) and gen["max_length"] == 100
    assert loader.get_model_context_length() == TINY["max_position_embeddings"]
    temp_dir = rt.model_dir
    loader.free_memory_serialize_file()
    assert not os.path.exists(temp_dir)


def test_serialize_to_memory_needs_the_flag(llama_dir):
    with pytest.raises(ModelSerializerException, match="in_memory_serialize=True"):
        HuggingFaceModel(llama_dir, "tiny").load_model().serialize_to_memory(None)


def test_skip_if_exists_and_diconfig(llama_dir, tmp_path):
    import yaml
    serialize(llama_dir, tmp_path)
    stamp = os.stat(tmp_path / "tiny.asparam").st_mtime_ns
    loader = serialize(llama_dir, tmp_path, skip_if_exists=True)
    assert os.stat(tmp_path / "tiny.asparam").st_mtime_ns == stamp
    serialize(llama_dir, tmp_path, dtype="bfloat16", skip_if_exists=True)  # other dtype: converts again
    assert DashInferModel(str(tmp_path), "tiny").dtype == "bfloat16"
    loader.export_model_diconfig(str(tmp_path / "di" / "diconfig.yaml"))
    doc = yaml.safe_load(open(tmp_path / "di" / "diconfig.yaml"))
    assert doc["model"]["data_type"] == "float32" and doc["model"]["architecture"] == "llama"
    assert doc["serialized"] == {"model_dir": str(tmp_path), "prefix": "tiny"}


def test_tokenizer_travels_with_the_model(serialized, llama_dir):
    from transformers import AutoTokenizer
    model = DashInferModel(serialized, "tiny")
    text = "Hello, world! <|im_end|>"
    assert model.init_tokenizer().get_tokenizer().encode(text) == AutoTokenizer.from_pretrained(llama_dir).encode(text)
    ids = chat_prompt_ids(model.get_tokenizer(), "hi")
    assert model.get_tokenizer().decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_serialized_without_tokenizer_says_so(llama_dir, tmp_path):
    model_dir = variant(llama_dir, tmp_path, lambda c: c)
    for path in glob.glob(os.path.join(model_dir, "tokenizer*")) + glob.glob(os.path.join(model_dir, "special*")):
        os.remove(path)
    serialize(model_dir, tmp_path / "out")
    with pytest.raises(ModelSerializerException, match="has no tokenizer"):
        DashInferModel(str(tmp_path / "out"), "tiny").get_tokenizer()


def test_memory_serialization_removed_at_exit(llama_dir):
    import subprocess
    import sys
    script = ("import sys; from dashinfer_client.model import HuggingFaceModel; "
              "m = HuggingFaceModel(sys.argv[1], 'tiny', in_memory_serialize=True, progress=False); "
              "m.load_model().serialize_to_memory(None); print(m.model_output_dir)")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", script, llama_dir], capture_output=True, text=True, env=env, check=True)
    temp_dir = done.stdout.strip()
    assert temp_dir.startswith(tempfile_root()) and not os.path.exists(temp_dir)


def tempfile_root():
    import tempfile
    return tempfile.gettempdir()


def test_progress_and_quiet(llama_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DASHINFER_QUIET", "1")
    HuggingFaceModel(llama_dir, "tiny").load_model().serialize_to_path(None, str(tmp_path / "a"))
    assert capsys.readouterr().err == ""
    HuggingFaceModel(llama_dir, "tiny").load_model().serialize_to_path(None, str(tmp_path / "b"), progress=True)
    assert "Model tiny serialized to" in capsys.readouterr().err
