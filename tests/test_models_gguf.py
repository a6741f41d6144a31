"""GGUF files -> serialized model -> DashInferModel, checked against transformers' own GGUF loader."""
import os

import numpy as np
import pytest

from dashinfer_client.dtypes import to_bf16
from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, GGUFModel
from dashinfer_client.model.quant import dequantize
from tests.gguf_builders import build_tiny_gguf
from tests.helpers import build_tiny_model, source_tensors
from tests.quant_reference import stored_parts, u4_reference


# -- GGUF files (written here from the tiny models, as llama.cpp's converter writes them) ----------

def transformers_gguf_tensors(gguf_path):
    """What transformers' own GGUF loader makes of the file (name map, Q/K un-permutation, dequantization)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    config = AutoConfig.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(gguf_path, return_tensors=True, model_to_load=skeleton)["tensors"]
    return {k: v.numpy() for k, v in tensors.items()}


def serialize_gguf(gguf_path, out_dir, dtype="float32"):
    loader = GGUFModel(gguf_path, "tg", user_set_data_type=dtype, progress=False)
    loader.load_model().read_model_config().serialize_to_path(None, str(out_dir))
    return DashInferModel(str(out_dir), "tg")


@pytest.mark.parametrize("arch,uneven,quant", [("llama", False, None), ("llama", True, None), ("qwen2", True, None),
                                               ("llama", False, "Q8_0"), ("qwen2", False, "Q4_1")])
def test_gguf_matches_source_and_transformers(tmp_path, arch, uneven, quant):
    from transformers import AutoTokenizer
    hf = build_tiny_model(tmp_path / "hf", arch=arch, uneven=uneven)
    gguf_path = build_tiny_gguf(tmp_path / "tiny.gguf", hf, quant_type=quant, rope_theta=100000.0)
    model = serialize_gguf(gguf_path, tmp_path / "out")
    c = model.config
    assert model.architecture == arch and c.rope_theta == 100000.0 and c.attention_bias == (arch == "qwen2")
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == ((9, 3, 16) if uneven else (4, 2, 16))
    assert c.eos_token_id == [2] and model.generation_config == {"bos_token_id": 1, "pad_token_id": 0, "eos_token_id": [2]}
    reference = transformers_gguf_tensors(gguf_path)
    source = source_tensors(hf)
    assert sorted(model.tensor_names()) == sorted(reference) == sorted(source)
    for name, expected in reference.items():
        np.testing.assert_array_equal(model.tensor(name), expected, err_msg=name)
        if quant is None:  # F32 GGUF: the permutation round trip is exact
            np.testing.assert_array_equal(model.tensor(name), source[name], err_msg=name)
    text = "Hello, world! <|im_end|>"
    assert model.get_tokenizer().encode(text) == AutoTokenizer.from_pretrained(hf).encode(text)


def test_gguf_to_bf16_and_quantized(tmp_path):
    hf = build_tiny_model(tmp_path / "hf", arch="llama", uneven=True)
    gguf_path = build_tiny_gguf(tmp_path / "tiny.gguf", hf)
    loader = GGUFModel(gguf_path, "tq", user_set_data_type="bfloat16", progress=False)
    loader.load_model().serialize_to_path(None, str(tmp_path / "out"), enable_quant=True,
                                          customized_quant_config={"weight_format": "uint4", "group_size": 8})
    model = DashInferModel(str(tmp_path / "out"), "tq")
    source = source_tensors(hf)
    np.testing.assert_array_equal(model.tensor("model.norm.weight"), to_bf16(source["model.norm.weight"]))
    name = "model.layers.0.self_attn.k_proj.weight"  # permuted in the GGUF, quantized after un-permuting
    deq = dequantize(stored_parts(model, name, "uint4"), "uint4", 8)
    np.testing.assert_allclose(deq, u4_reference(source[name], 8)[4], rtol=1e-6, atol=1e-7)


def test_gguf_bad_inputs(tmp_path):
    import gguf
    with pytest.raises(ModelSerializerException, match="GGUF file .*missing.gguf does not exist"):
        GGUFModel(str(tmp_path / "missing.gguf"), "x").load_model()
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelSerializerException, match="cannot read GGUF file .*junk.gguf"):
        GGUFModel(str(tmp_path / "junk.gguf"), "x").load_model()
    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelSerializerException, match="GGUF architecture 'gpt2' .* is not supported"):
        GGUFModel(str(tmp_path / "gpt2.gguf"), "x").read_model_config()


def test_big_endian_gguf_is_refused_by_name(tmp_path):
    import gguf
    path = str(tmp_path / "be.gguf")
    writer = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(8, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf.GGUFReader(path).endianess == gguf.GGUFEndian.BIG  # the gguf package's own reading
    with pytest.raises(ModelSerializerException, match=r"cannot read GGUF file .*be\.gguf: it is big-endian"):
        GGUFModel(path, "x").read_model_config()


@pytest.mark.parametrize("kind", ["bert", "rwkv", "zzz"])
def test_a_tokenizer_kind_no_one_builds_is_refused_naming_the_file(tmp_path, kind):
    from dashinfer_client.model_cache import resolve_model
    hf = build_tiny_model(tmp_path / "hf")
    gguf_path = build_tiny_gguf(tmp_path / "tiny.gguf", hf, tokenizer_model=kind)
    with pytest.raises(ModelSerializerException, match=r"cannot read the tokenizer of GGUF file .*tiny\.gguf"):
        serialize_gguf(gguf_path, tmp_path / "out")
    assert not os.listdir(tmp_path / "out")  # the temporary files are gone
    with pytest.raises(ModelSerializerException, match=r"tiny\.gguf"):
        resolve_model(gguf_path, cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("kind", [None, "none"])
def test_a_gguf_without_a_tokenizer_converts_without_one(tmp_path, kind):
    """As a Hugging Face directory without tokenizer files: the weights, no tokenizer (the Engine
    takes and gives token ids); asking for its tokenizer is refused by name."""
    hf = build_tiny_model(tmp_path / "hf")
    gguf_path = build_tiny_gguf(tmp_path / "tiny.gguf", hf, tokenizer_model=kind)
    model = serialize_gguf(gguf_path, tmp_path / "out")
    assert model.graph["tokenizer"] is None and sorted(os.listdir(tmp_path / "out")) == ["tg.asgraph", "tg.asparam"]
    for name, expected in transformers_gguf_tensors(gguf_path).items():
        np.testing.assert_array_equal(model.tensor(name), expected, err_msg=name)
    with pytest.raises(ModelSerializerException, match="has no tokenizer"):
        model.get_tokenizer()
    with pytest.raises(ModelSerializerException, match=r"GGUF file .*tiny\.gguf has no tokenizer"):
        GGUFModel(gguf_path, "x").get_tokenizer()
