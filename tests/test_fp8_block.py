"""Block-wise FP8 checkpoints (quantization_config quant_method "fp8", as Qwen3-*-FP8 and
DeepSeek-V3 ship): dequantized at conversion into the model's dtype or into InstantQuant.

Each checkpoint is tests/helpers.py's tiny random model with its linear weights (attention, MLP,
every expert; not the embeddings, norms, head or router) quantized here to torch.float8_e4m3fn in
blocks of BLOCK, which divides none of the tiny dimensions, so every weight has ragged last
blocks, with one `{weight}_scale_inv` [ceil(N / 48), ceil(K / 40)] a weight, as the released
checkpoints store them. The reference is transformers on the same model with those weights set to
transformers' own dequantization (`finegrained_fp8._dequantize_fp8_weight`): transformers 5.25
cannot load such a directory on CPU without `accelerate`, which this project does not install,
and with it, its load-time dequantization takes the block size from the scale grid, which ragged
blocks make fail or come out wrong (checked by hand; with blocks that divide, it loads exactly
those dequantized weights).
"""
import math
import os
import re
import shutil

import numpy as np
import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from dashinfer_client.model.fp8 import E4M3
from dashinfer_client.model.safetensors_io import SafetensorsFile
from tests.helpers import load_hf_model, serialize, write_config_variant
from tests.test_families import test_logits_match_transformers as logits_match_transformers

BLOCK = [48, 40]
SCALE_DTYPE = {"llama": "float32", "qwen3": "bfloat16", "qwen3_moe": "float32"}  # both kinds ship


def quantize_fp8(w, block, scale_dtype):
    """w [N, K] (torch fp32) -> (fp8 e4m3 weight, scale_inv [ceil(N / rows), ceil(K / cols)]): each
    block scaled so its largest magnitude is e4m3's 448."""
    import torch
    (n, k), (rows, cols) = w.shape, block
    scale = torch.empty(math.ceil(n / rows), math.ceil(k / cols))
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            scale[i, j] = w[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols].abs().max() / 448
    scale = scale.to(getattr(torch, scale_dtype))
    whole = scale.float().repeat_interleave(rows, 0)[:n].repeat_interleave(cols, 1)[:, :k]
    return (w / whole).to(torch.float8_e4m3fn), scale


def parameter_of(params, name):
    """The transformers parameter (or the slice of one) a checkpoint weight loads into: transformers
    5 stacks each layer's experts, gate rows then up rows, where the checkpoint has one per expert."""
    m = re.match(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", name)
    if not m:
        return params[name]
    layer, e, proj = m[1], int(m[2]), m[3]
    if proj == "down":
        return params[layer + ".down_proj"][e]
    gate_up = params[layer + ".gate_up_proj"][e]
    half = gate_up.shape[0] // 2
    return gate_up[:half] if proj == "gate" else gate_up[half:]


def fp8_config(config, **quant):
    q = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": BLOCK,
         "modules_to_not_convert": ["lm_head", "model.embed_tokens", "mlp.gate"]}
    return dict(config, quantization_config=dict(q, **quant))


@pytest.fixture(scope="module")
def fp8_checkpoint(tiny_checkpoint, tmp_path_factory):
    """fp8_checkpoint(arch) -> (the FP8 checkpoint's directory, transformers on its dequantized
    weights, {weight name: dequantized torch tensor})."""
    built = {}

    def get(arch):
        if arch not in built:
            import torch
            from safetensors.torch import load_file, save_file
            from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
            src = tiny_checkpoint(arch)
            out = tmp_path_factory.mktemp(f"{arch}-fp8") / "hf"
            shutil.copytree(src, out)
            tensors = load_file(os.path.join(src, "model.safetensors"))
            hf = load_hf_model(src)
            params, dequantized = dict(hf.named_parameters()), {}
            for name in [n for n in tensors if n.endswith("_proj.weight")]:
                weight, scale = quantize_fp8(tensors[name], BLOCK, SCALE_DTYPE[arch])
                tensors[name], tensors[name + "_scale_inv"] = weight, scale
                dequantized[name] = _dequantize_fp8_weight(weight, scale, BLOCK, torch.float32)
                with torch.no_grad():
                    parameter_of(params, name).copy_(dequantized[name])
            save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            write_config_variant(str(out), fp8_config)
            hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
            built[arch] = str(out), hf, dequantized
        return built[arch]
    return get


@pytest.fixture(scope="module")
def served(fp8_checkpoint, tmp_path_factory):
    models = {}

    def get(arch, dtype="float32"):
        if (arch, dtype) not in models:
            out = tmp_path_factory.mktemp(f"{arch}-fp8-{dtype}")
            serialize(fp8_checkpoint(arch)[0], out, dtype=dtype)
            models[arch, dtype] = DashInferModel(str(out), "tiny")
        return models[arch, dtype]
    return get


def test_e4m3_values_are_torchs():
    import torch
    want = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(E4M3, want)


def test_the_reader_gives_f8_e4m3_as_its_bits(tmp_path):
    import torch
    from safetensors.torch import save_file
    w = torch.randn(5, 7).to(torch.float8_e4m3fn)
    save_file({"w": w}, tmp_path / "t.safetensors")
    f = SafetensorsFile(tmp_path / "t.safetensors")
    assert f.info("w") == ("F8_E4M3", (5, 7))
    np.testing.assert_array_equal(f.get("w"), w.view(torch.uint8).numpy())


def test_the_reader_refuses_f8_e5m2_by_name(tmp_path):
    import torch
    from safetensors.torch import save_file
    save_file({"w": torch.randn(4, 4).to(torch.float8_e5m2)}, tmp_path / "t.safetensors")
    with pytest.raises(ModelSerializerException, match="'w'.* has dtype F8_E5M2: fp8 e5m2 is not supported"):
        SafetensorsFile(tmp_path / "t.safetensors")


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_fp8_checkpoint_serves_transformers_logits_and_tokens(arch, fp8_checkpoint, served):
    logits_match_transformers((f"{arch}-fp8", served(arch), fp8_checkpoint(arch)[1]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fp8_weights_convert_to_transformers_dequantized_weights(dtype, fp8_checkpoint, served):
    """Bit for bit: the block's float32 product, rounded once to the model's dtype (experts too)."""
    import torch
    model = served("qwen3_moe", dtype)
    _, _, dequantized = fp8_checkpoint("qwen3_moe")
    assert "model.layers.0.mlp.experts.5.down_proj.weight" in dequantized
    for name, want in dequantized.items():
        want = want.to(getattr(torch, dtype))
        want = want.view(torch.int16).numpy().view(np.uint16) if dtype == "bfloat16" else want.numpy()
        np.testing.assert_array_equal(model.tensor(name), want, err_msg=name)
    assert not [n for n in model.tensor_names() if "scale_inv" in n]


@pytest.mark.parametrize("weight_format,group_size", [("int8", -1), ("uint4", 32)])
def test_instant_quant_of_fp8_checkpoint_is_that_of_its_dequantized_weights(
        weight_format, group_size, fp8_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file
    hf_dir, _, dequantized = fp8_checkpoint("qwen3_moe")
    floats = tmp_path / "floats"
    shutil.copytree(hf_dir, floats)
    tensors = {n: t for n, t in load_file(os.path.join(hf_dir, "model.safetensors")).items()
               if not n.endswith("_scale_inv")}
    save_file(dict(tensors, **dequantized), os.path.join(floats, "model.safetensors"), metadata={"format": "pt"})
    write_config_variant(str(floats), lambda c: {k: v for k, v in c.items() if k != "quantization_config"})
    quant = {"weight_format": weight_format, "group_size": group_size}
    for src in (hf_dir, floats):
        serialize(str(src), tmp_path / os.path.basename(src), dtype="bfloat16", enable_quant=True,
                  weight_only_quant=True, customized_quant_config=quant)
    got, want = DashInferModel(str(tmp_path / "hf"), "tiny"), DashInferModel(str(tmp_path / "floats"), "tiny")
    assert "model.layers.2.mlp.experts.3.gate_proj.weight" in got.quantization["quantized"]
    assert sorted(got.tensor_names()) == sorted(want.tensor_names())
    for name in want.tensor_names():
        np.testing.assert_array_equal(got.tensor(name), want.tensor(name), err_msg=name)


@pytest.mark.parametrize("quant,refused", [
    (dict(fmt="e5m2"), "fmt='e5m2'"),
    (dict(weight_block_size=[128]), r"weight_block_size=\[128\]"),
    (dict(expert_dtype="fp4"), "expert_dtype='fp4'"),
])
def test_an_fp8_config_it_cannot_serve_is_refused_by_name(quant, refused, fp8_checkpoint, tmp_path):
    src = shutil.copytree(fp8_checkpoint("llama")[0], tmp_path / "m")
    write_config_variant(str(src), lambda c: fp8_config(c, **quant))
    with pytest.raises(ModelSerializerException, match=f"fp8 checkpoint with {refused}.* is not supported"):
        HuggingFaceModel(str(src), "m").read_model_config()


def test_a_weight_block_size_the_scales_do_not_match_is_refused(fp8_checkpoint, tmp_path):
    src = shutil.copytree(fp8_checkpoint("llama")[0], tmp_path / "m")
    write_config_variant(str(src), lambda c: fp8_config(c, weight_block_size=[128, 128]))
    with pytest.raises(ModelSerializerException, match=r"_scale_inv' is \[\d+, \d+\], but .* in blocks of "
                                                       r"\[128, 128\] \(the config's block size\), a \[1, 1\] grid"):
        HuggingFaceModel(str(src), "m").load_model()


def _without_scales(t):
    del t["model.layers.1.mlp.up_proj.weight_scale_inv"]


def _byte_scales(t):  # ue8m0 exponents stored as bytes
    import torch
    name = "model.layers.0.self_attn.o_proj.weight_scale_inv"
    t[name] = t[name].to(torch.uint8)


def _stacked_expert_scales(t):  # transformers 5's FP8Experts names its scales so
    t["model.layers.0.mlp.experts.gate_up_proj_scale_inv"] = t["model.layers.0.mlp.up_proj.weight_scale_inv"].clone()


@pytest.mark.parametrize("edit,refused", [
    (_without_scales, "FP8 tensor 'model.layers.1.mlp.up_proj.weight' has no "
                      "'model.layers.1.mlp.up_proj.weight_scale_inv' or 'model.layers.1.mlp.up_proj.weight_scale' scales"),
    (_byte_scales, "scales 'model.layers.0.self_attn.o_proj.weight_scale_inv' are U8; supported are F32, BF16, F16"),
    (_stacked_expert_scales, "'model.layers.0.mlp.experts.gate_up_proj_scale_inv' scales no FP8 '.weight' tensor"),
])
def test_fp8_tensors_it_cannot_serve_are_refused_by_name(edit, refused, fp8_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file
    src = shutil.copytree(fp8_checkpoint("llama")[0], tmp_path / "m")
    path = os.path.join(src, "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ModelSerializerException, match=re.escape(refused)):
        HuggingFaceModel(str(src), "m").load_model()
