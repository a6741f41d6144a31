"""FP8 checkpoints with a scale a tensor, a row or a block in compressed-tensors' float-quantized
format (llm-compressor's FP8 and FP8-dynamic releases: quant_method "compressed-tensors",
{weight}_scale) and in AutoFP8's per-tensor layout (quant_method "fp8", a scalar {weight}_scale,
static input_scale): dequantized at conversion.

Each checkpoint is written by compressed-tensors itself (apply_quantization_config, the weights'
scales set to absmax / 448, compress_model, save_pretrained) from tests/helpers.py's tiny random
models, in float32 or in bf16 (whose scales are bf16, as bf16 releases store them). The reference is
compressed-tensors' own decompression, as transformers loads such a directory: the weights bit for
bit (with bf16 scales it multiplies in bf16, so the weights are bf16 values at any dtype), and
transformers' logits and greedy tokens over them, the activations unquantized (the runtime computes
nothing in FP8; the releases' dynamic FP8 activations are left out of both sides).
"""
import functools
import json
import os
import re
import shutil

import numpy as np
import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from tests.compressed_reference import decompressed
from tests.helpers import serialize, write_config_variant
from tests.test_families import test_logits_match_transformers as logits_match_transformers

# (family, the weights' strategy, the checkpoint's dtype (its scales'), static input scales,
# AutoFP8's layout)
CASES = [("llama", "tensor", "float32", False, False), ("llama", "channel", "bfloat16", False, False),
         ("qwen3", "block", "float32", False, False), ("qwen3", "channel", "float32", True, False),
         ("llama", "tensor", "float32", True, True)]
BLOCK = [32, 16]


def _scheme(strategy, static):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    weights = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True, dynamic=False,
                               **({"block_structure": BLOCK} if strategy == "block" else {}))
    inputs = QuantizationArgs(num_bits=8, type="float", strategy="tensor" if static else "token", dynamic=not static)
    return QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights,
                                                                           input_activations=inputs)},
                              ignore=["lm_head"])


def _absmax_scale(w, strategy):
    n, k = w.shape
    if strategy == "tensor":
        return w.abs().amax() / 448
    if strategy == "channel":
        return w.abs().amax(1, keepdim=True) / 448
    return w.reshape(n // BLOCK[0], BLOCK[0], k // BLOCK[1], BLOCK[1]).abs().amax((1, 3)) / 448


def _write(src, out, strategy, dtype, static):
    """compressed-tensors' checkpoint of src in out."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config
    from transformers import AutoModelForCausalLM
    shutil.copytree(src, out)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype))
    apply_quantization_config(model, _scheme(strategy, static))
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                scale = _absmax_scale(module.weight.float(), strategy)
                module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
                if static:
                    module.input_scale.fill_(0.02)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))


def _as_autofp8(out):
    """The per-tensor checkpoint in AutoFP8's layout: one scalar a weight and its input, quant_method fp8."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    save_file({n: t.reshape(()) if n.endswith("_scale") else t for n, t in tensors.items()}, path,
              metadata={"format": "pt"})
    write_config_variant(str(out), lambda c: dict(c, quantization_config={
        "quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}))


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint, tmp_path_factory):
    """checkpoint(case) -> (the FP8 directory, {weight: compressed-tensors' dequantized tensor},
    transformers' float32 model over those weights)."""
    @functools.cache  # each case built once a module
    def get(case):
        arch, strategy, dtype, static, autofp8 = case
        src = tiny_checkpoint(arch)
        out = tmp_path_factory.mktemp(f"{arch}-{strategy}") / "hf"
        _write(src, out, strategy, dtype, static)
        dequantized, hf = decompressed(out, src)
        if autofp8:
            _as_autofp8(out)
        return str(out), dequantized, hf
    return get


@pytest.mark.parametrize("case", CASES, ids=["-".join(str(v) for v in c) for c in CASES])
def test_fp8_checkpoint_converts_to_the_dequantized_weights_and_serves_their_logits(case, checkpoint, tmp_path):
    import torch
    out, dequantized, hf = checkpoint(case)
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["quantization_config"]["quant_method"] == ("fp8" if case[4] else "compressed-tensors")
    for dtype in ("float32", "bfloat16"):
        serialize(out, tmp_path / dtype, dtype=dtype)
        model = DashInferModel(str(tmp_path / dtype), "tiny")
        assert not [n for n in model.tensor_names() if n.endswith("_scale")]
        for name, want in dequantized.items():
            want = want.to(getattr(torch, dtype))
            want = want.view(torch.int16).numpy().view(np.uint16) if dtype == "bfloat16" else want.numpy()
            np.testing.assert_array_equal(model.tensor(name), want, err_msg=name)
    logits_match_transformers(("-".join(map(str, case)), DashInferModel(str(tmp_path / "float32"), "tiny"), hf))


def _edit_groups(edit):
    def apply(config):
        q = json.loads(json.dumps(config["quantization_config"]))
        edit(q)
        return dict(config, quantization_config=q)
    return apply


@pytest.mark.parametrize("edit,refused", [
    (lambda q: q["config_groups"]["group_0"].update(format="pack-quantized"),
     "group_0: format 'pack-quantized', weights 'float' of 8 bits"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(type="int", num_bits=4),
     "group_0: format 'float-quantized', weights 'int' of 4 bits"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=32),
     "group_0: strategy 'group'"),
    (lambda q: q.update(transform_config={"config_groups": {"u": {}}}), "transform_config (rotated weights)"),
    (lambda q: q.update(sparsity_config={"format": "sparse-24-bitmask"}), "sparsity_config (sparse weights)"),
])
def test_a_compressed_tensors_config_it_cannot_serve_is_refused_by_name(edit, refused, checkpoint, tmp_path):
    src = shutil.copytree(checkpoint(CASES[0])[0], tmp_path / "m")
    write_config_variant(str(src), _edit_groups(edit))
    with pytest.raises(ModelSerializerException, match="compressed-tensors checkpoint with .*" + re.escape(refused)):
        HuggingFaceModel(str(src), "m").read_model_config()


def test_a_scale_of_no_known_shape_is_refused_naming_the_shapes_it_could_have(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file
    src = shutil.copytree(checkpoint(CASES[1])[0], tmp_path / "m")
    path = os.path.join(src, "model.safetensors")
    tensors = load_file(path)
    name = "model.layers.0.mlp.up_proj.weight_scale"
    tensors[name] = tensors[name][:5]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ModelSerializerException, match=r"'model.layers.0.mlp.up_proj.weight_scale' is \[5, 1\], but "
                                                       r".* has one scale, one a row \(\[\d+, 1\]\) \(the config "
                                                       r"names no block size\)"):
        HuggingFaceModel(str(src), "m").load_model()
