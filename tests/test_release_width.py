"""A checkpoint quantized as released keeps its width unless told otherwise: converted with no
quantization named (`dashinfer convert` / `serve` without --quant, model_cache.resolve_model with
quant None), a 4-bit AWQ release becomes the uint4 model `--quant uint4` makes of it, not floats
four times its size; `--quant none` gives the float model. hf.release_quant reads the width."""
import json

import numpy as np
import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel
from dashinfer_client.model.hf import release_quant
from dashinfer_client.model_cache import resolve_model
from tests.helpers import serialize
from tests.test_awq import _awq_checkpoint
from tests.test_cli import dashinfer


@pytest.fixture(scope="module")
def awq_dir(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "awq"
    _awq_checkpoint(tiny_checkpoint("llama"), out, zero_point=True)
    return str(out)


def same_tensors(got, want):
    assert sorted(got.tensor_names()) == sorted(want.tensor_names())
    for name in want.tensor_names():
        np.testing.assert_array_equal(got.tensor(name), want.tensor(name), err_msg=name)


def test_resolve_model_serves_a_4_bit_release_as_uint4(awq_dir, tmp_path):
    serialize(awq_dir, tmp_path / "explicit", dtype="bfloat16", enable_quant=True, weight_only_quant=True,
              customized_quant_config={"quant_method": "instant_quant", "weight_format": "uint4", "group_size": 32})
    serialize(awq_dir, tmp_path / "floats", dtype="bfloat16")
    default = DashInferModel(*resolve_model(awq_dir, cache_dir=str(tmp_path / "cache")))
    assert default.quantization["weight_format"] == "uint4"
    same_tensors(default, DashInferModel(str(tmp_path / "explicit"), "tiny"))
    floats = DashInferModel(*resolve_model(awq_dir, quant="none", cache_dir=str(tmp_path / "cache")))
    assert floats.quantization is None
    same_tensors(floats, DashInferModel(str(tmp_path / "floats"), "tiny"))
    # a serialized model asked for with "none" must hold floats
    with pytest.raises(ModelSerializerException, match="quantized as uint4, not none"):
        resolve_model(str(tmp_path / "explicit"), quant="none")
    assert DashInferModel(*resolve_model(str(tmp_path / "floats"), quant="none")).quantization is None


def test_convert_keeps_the_release_width_unless_told(awq_dir, tmp_path):
    done = dashinfer("convert", awq_dir, str(tmp_path / "a"), "--name", "m")
    assert done.returncode == 0, done.stderr
    assert "linear layers uint4 in groups of 32" in done.stdout
    done = dashinfer("convert", awq_dir, str(tmp_path / "b"), "--name", "m", "--quant", "none")
    assert done.returncode == 0, done.stderr
    assert DashInferModel(str(tmp_path / "b"), "m").quantization is None


def _quantization_config(kind):
    int_group = lambda bits: {"weights": {"type": "int", "num_bits": bits, "strategy": "group", "group_size": 128}}
    fp8 = {"weights": {"type": "float", "num_bits": 8, "strategy": "channel"}}
    return {"awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
            "w4a16": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                      "config_groups": {"group_0": int_group(4)}},
            "w8a16": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                      "config_groups": {"group_0": int_group(8)}},
            "fp8-ct": {"quant_method": "compressed-tensors", "format": "float-quantized",
                       "config_groups": {"group_0": fp8}},
            "fp8": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
            "float": None}[kind]


@pytest.mark.parametrize("kind,width", [("awq", "uint4"), ("w4a16", "uint4"), ("w8a16", "int8"), ("fp8-ct", None),
                                        ("fp8", None), ("float", None)])
def test_release_quant_reads_the_width(tmp_path, kind, width):
    """An FP8 release converts exactly to the float dtype, so it stays None (int8 would round it again)."""
    config = {"architectures": ["LlamaForCausalLM"]}
    if _quantization_config(kind):
        config["quantization_config"] = _quantization_config(kind)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert release_quant(str(tmp_path)) == width
