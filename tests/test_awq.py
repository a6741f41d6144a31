"""AutoAWQ's GEMM checkpoints (quant_method "awq", Qwen's *-AWQ releases): dequantized at conversion.

Each checkpoint is tests/helpers.py's tiny random model with its linear weights quantized here to 4
bits in groups of 32 (round to nearest, with zero points or without) and packed as AutoAWQ stores
them (transposed, eight codes an int32 in its interleaved order, fp16 scales). The reference does
not share that reading: compressed-tensors' own AutoAWQ converter (convert_checkpoint) turns the
directory into its pack-quantized format and its decompression, as transformers loads that, gives
the weights (bit for bit) and transformers' logits and greedy tokens over them.
"""
import functools
import json
import os
import shutil

import numpy as np
import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from tests.compressed_reference import decompressed
from tests.helpers import serialize, write_config_variant
from tests.test_families import test_logits_match_transformers as logits_match_transformers

GROUP = 32
AWQ_COLUMN_OF_NIBBLE = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's pack order
CASES = [("llama", True), ("qwen3", False)]  # (family, zero points stored)


def _pack(codes):
    """codes [rows, cols] (0..15) -> int32 [rows, cols / 8], nibble j of each word the column
    AWQ_COLUMN_OF_NIBBLE[j] of its eight."""
    import torch
    words = torch.zeros(codes.shape[0], codes.shape[1] // 8, dtype=torch.int64)
    for j, column in enumerate(AWQ_COLUMN_OF_NIBBLE):
        words |= codes[:, column::8].to(torch.int64) << (4 * j)
    return words.to(torch.uint32).view(torch.int32) if hasattr(torch, "uint32") else words.to(torch.int32)


def _awq_checkpoint(src, out, zero_point):
    import torch
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, out)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        w = tensors.pop(name).T  # [K, N]
        groups = w.reshape(-1, GROUP, w.shape[1])
        if zero_point:
            low, high = groups.amin(1), groups.amax(1)
            scale = ((high - low) / 15).half()
            zero = torch.clamp(torch.round(-low / scale.float()), 0, 15)
        else:
            scale = (groups.abs().amax(1) / 7).half()
            zero = torch.full_like(scale, 8, dtype=torch.float32)
        codes = torch.clamp(torch.round(groups / scale.float()[:, None]) + zero[:, None], 0, 15).reshape(w.shape)
        module = name.removesuffix(".weight")
        tensors[module + ".qweight"], tensors[module + ".scales"] = _pack(codes.to(torch.int64)), scale
        if zero_point:
            tensors[module + ".qzeros"] = _pack(zero.to(torch.int64))
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    write_config_variant(str(out), lambda c: dict(c, quantization_config={
        "quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": zero_point, "version": "gemm",
        "modules_to_not_convert": None}))


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint, tmp_path_factory):
    """checkpoint(case) -> (the AWQ directory, {weight: the reference's dequantized tensor},
    transformers' float32 model over the checkpoint's weights so dequantized)."""
    @functools.cache  # each case built once a module
    def get(case):
        from compressed_tensors.entrypoints.convert import convert_checkpoint
        from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter
        arch, zero_point = case
        src, root = tiny_checkpoint(arch), tmp_path_factory.mktemp(f"{arch}-awq")
        _awq_checkpoint(src, root / "awq", zero_point)
        convert_checkpoint(root / "awq", root / "ct", AutoAWQConverter.from_pretrained(str(root / "awq")),
                           max_workers=1, device="cpu")
        return (str(root / "awq"), *decompressed(root / "ct", src))
    return get


@pytest.mark.parametrize("case", CASES, ids=[f"{a}-zeros-{z}" for a, z in CASES])
def test_awq_checkpoint_converts_to_the_dequantized_weights_and_serves_their_logits(case, checkpoint, tmp_path):
    import torch
    out, dequantized, hf = checkpoint(case)
    assert len(dequantized) == 14  # every projection of the 2 layers
    serialize(out, tmp_path / "f32", dtype="float32")
    model = DashInferModel(str(tmp_path / "f32"), "tiny")
    assert not [n for n in model.tensor_names() if n.endswith((".qweight", ".qzeros", ".scales"))]
    for name, want in dequantized.items():
        np.testing.assert_array_equal(model.tensor(name), want.to(torch.float32).numpy(), err_msg=name)
    logits_match_transformers((f"{case[0]}-awq", model, hf))


@pytest.mark.parametrize("quant,refused", [
    (dict(bits=8), "bits=8 (only 4 is)"),
    (dict(version="gemv"), "version='gemv' (only AutoAWQ's 'gemm' layout is)"),
])
def test_an_awq_config_it_cannot_serve_is_refused_by_name(quant, refused, checkpoint, tmp_path):
    src = shutil.copytree(checkpoint(CASES[0])[0], tmp_path / "m")
    write_config_variant(str(src), lambda c: dict(c, quantization_config=dict(c["quantization_config"], **quant)))
    with pytest.raises(ModelSerializerException, match=f"awq checkpoint with {refused}".replace("(", r"\(")
                       .replace(")", r"\)")):
        HuggingFaceModel(str(src), "m").read_model_config()


def test_scales_of_another_group_size_are_refused_naming_the_shapes(checkpoint, tmp_path):
    src = shutil.copytree(checkpoint(CASES[0])[0], tmp_path / "m")
    write_config_variant(str(src), lambda c: dict(c, quantization_config=dict(c["quantization_config"],
                                                                              group_size=16)))
    with pytest.raises(ModelSerializerException, match=r"AWQ module '.*' of qweight \[\d+, \d+\] in groups of 16: "
                                                       r"'.*\.scales' is \[\d+, \d+\], not \[\d+, \d+\]"):
        HuggingFaceModel(str(src), "m").load_model()
    with open(os.path.join(src, "config.json")) as f:
        assert json.load(f)["quantization_config"]["group_size"] == 16
