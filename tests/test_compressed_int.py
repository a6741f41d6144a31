"""compressed-tensors' pack-quantized int checkpoints (llm-compressor's W4A16 and W8A16 releases):
dequantized at conversion.

Each checkpoint is written by compressed-tensors itself (apply_quantization_config, each weight's
scale and zero point from calculate_qparams over its groups' min and max, compress_model,
save_pretrained) from tests/helpers.py's tiny random models, in float32 or bf16 (bf16 scales). The
reference is compressed-tensors' own decompression as transformers loads the directory: the weights
bit for bit and transformers' logits and greedy tokens over them. GPTQ's activation order (a
`weight_g_idx` of each column's group, which compressed-tensors no longer writes) is checked on the
weights: the columns of a checkpoint permuted, with the g_idx that maps each to its group, give
the decompressed weight's columns permuted.
"""
import functools
import json
import os
import shutil

import numpy as np
import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from dashinfer_client.model.compressed import PackedIntWeights
from dashinfer_client.model.hf import HFWeights
from tests.compressed_reference import decompressed
from tests.helpers import serialize, write_config_variant
from tests.test_families import test_logits_match_transformers as logits_match_transformers

# (family, bits, strategy, group size, symmetric, the checkpoint's dtype)
CASES = [("llama", 4, "group", 32, False, "float32"), ("qwen3", 4, "channel", None, True, "bfloat16"),
         ("llama", 8, "group", 16, True, "float32"), ("qwen3", 8, "channel", None, False, "float32")]


def _args(bits, strategy, group_size, symmetric):
    from compressed_tensors.quantization import QuantizationArgs
    return QuantizationArgs(num_bits=bits, type="int", strategy=strategy, group_size=group_size, symmetric=symmetric,
                            dynamic=False)


def _write(src, out, bits, strategy, group_size, symmetric, dtype):
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, apply_quantization_config
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    from transformers import AutoModelForCausalLM
    shutil.copytree(src, out)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype))
    args = _args(bits, strategy, group_size, symmetric)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": QuantizationScheme(
        targets=["Linear"], weights=args)}, ignore=["lm_head"]))
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                w = module.weight.float()
                grouped = w.reshape(w.shape[0], -1, group_size) if strategy == "group" else w.unsqueeze(1)
                scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
                module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
                if hasattr(module, "weight_zero_point"):
                    module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint, tmp_path_factory):
    """checkpoint(case) -> (the directory, {weight: compressed-tensors' dequantized tensor},
    transformers' float32 model over the checkpoint's weights so dequantized)."""
    @functools.cache  # each case built once a module
    def get(case):
        src = tiny_checkpoint(case[0])
        out = tmp_path_factory.mktemp("-".join(map(str, case))) / "hf"
        _write(src, out, *case[1:])
        return (str(out), *decompressed(out, src))
    return get


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_int_checkpoint_converts_to_the_dequantized_weights_and_serves_their_logits(case, checkpoint, tmp_path):
    import torch
    out, dequantized, hf = checkpoint(case)
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["quantization_config"]["config_groups"]["group_0"]["format"] == "pack-quantized"
    assert not set(dequantized) & set(HFWeights(out, "auto").keys())  # stored packed, not as weights
    for dtype in ("float32", "bfloat16"):
        serialize(out, tmp_path / dtype, dtype=dtype)
        model = DashInferModel(str(tmp_path / dtype), "tiny")
        assert not [n for n in model.tensor_names() if n.endswith(("_packed", "_scale", "_zero_point", "_shape"))]
        for name, want in dequantized.items():
            want = want.to(getattr(torch, dtype))
            want = want.view(torch.int16).numpy().view(np.uint16) if dtype == "bfloat16" else want.numpy()
            np.testing.assert_array_equal(model.tensor(name), want, err_msg=name)
    logits_match_transformers(("-".join(map(str, case)), DashInferModel(str(tmp_path / "float32"), "tiny"), hf))


def test_g_idx_gives_each_column_its_groups_scale_and_zero_point(checkpoint, tmp_path):
    """A 4-bit asymmetric checkpoint with its columns permuted (code, as the packing stores it) and a
    g_idx naming each column's group: the decompressed weight's columns, permuted alike."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
    from safetensors.torch import load_file, save_file
    out, dequantized, _ = checkpoint(CASES[0])
    src = shutil.copytree(out, tmp_path / "m")
    path = os.path.join(src, "model.safetensors")
    tensors = load_file(path)
    name = "model.layers.1.mlp.down_proj.weight"
    n, k = tensors[name + "_shape"].tolist()
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(0))
    codes = unpack_from_int32(tensors[name + "_packed"], 4, torch.Size([n, k]))
    tensors[name + "_packed"] = pack_to_int32(codes[:, perm].contiguous(), 4)
    tensors[name + "_g_idx"] = (perm // 32).to(torch.int32)
    save_file(tensors, path, metadata={"format": "pt"})
    got, _ = PackedIntWeights(HFWeights(str(src), "auto"), str(src), (32,)).fetch(name)
    np.testing.assert_array_equal(got, dequantized[name][:, perm].numpy())


def _edit_group(edit):
    def apply(config):
        q = json.loads(json.dumps(config["quantization_config"]))
        edit(q["config_groups"]["group_0"])
        return dict(config, quantization_config=q)
    return apply


@pytest.mark.parametrize("edit,refused", [
    (lambda g: g["weights"].update(num_bits=2), "group_0: format 'pack-quantized', weights 'int' of 2 bits"),
    (lambda g: g.update(format="nvfp4-pack-quantized"), "group_0: format 'nvfp4-pack-quantized'"),
    (lambda g: g["weights"].update(strategy="tensor_group"), "group_0: strategy 'tensor_group'"),
])
def test_an_int_config_it_cannot_serve_is_refused_by_name(edit, refused, checkpoint, tmp_path):
    src = shutil.copytree(checkpoint(CASES[0])[0], tmp_path / "m")
    write_config_variant(str(src), _edit_group(edit))
    with pytest.raises(ModelSerializerException, match="compressed-tensors checkpoint with " + refused):
        HuggingFaceModel(str(src), "m").read_model_config()
