"""Conversion streams: converting a checkpoint many times larger than its largest tensor grows the
converting process's resident memory by no more than conversion_memory_bound (derived from the
largest tensor, not the model), and loading the result holds the weights once, not twice. Peak RSS
is the kernel's VmHWM in a fresh child process (bench/convert_memory.py), a memory bound, not a
speed figure. And work that would not fit is refused before it starts, with both figures: a
conversion (memory or disk), a model to serve (weights + KV cache and workspaces), `dashinfer
convert` and `dashinfer serve` exiting 78."""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from bench.convert_memory import files_bytes, measure
from dashinfer_client.dtypes import to_bf16
from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model.arch import normalize_hf_config
from dashinfer_client.model.conversion_fit import conversion_memory_bound
from dashinfer_client.model.quant import InstantQuantSettings
from dashinfer_client.model.safetensors_io import SafetensorsWriter
from dashinfer_client.model.serialized import weight_shapes

# Qwen3-MoE's layout, small tensors, many of them: 8 layers of 64 experts of 256 x 256 (~200 MB
# of bf16) whose largest tensor is 1024 x 256
CONFIG = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=256, intermediate_size=512,
              moe_intermediate_size=256, num_experts=64, num_experts_per_tok=4, norm_topk_prob=True,
              num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1024,
              max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2)
SLACK = 32 << 20  # the interpreter's own growth while it converts (allocator arenas, module state)


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """A random bf16 checkpoint of CONFIG (numpy and our safetensors writer: no torch) -> (dir, shapes)."""
    out = tmp_path_factory.mktemp("moe-200mb")
    with open(out / "config.json", "w") as f:
        json.dump(CONFIG, f)
    shapes = weight_shapes(*reversed(normalize_hf_config(CONFIG)))
    writer = SafetensorsWriter(out / "model.safetensors", [(n, "BF16", s) for n, s in shapes.items()])
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        w = np.ones(shape, np.float32) if len(shape) == 1 else rng.standard_normal(shape, np.float32) * 0.05
        writer.write(name, to_bf16(w))
    writer.close()
    return str(out), shapes


def test_conversion_and_loading_stay_near_one_tensor(moe_checkpoint, tmp_path):
    src, shapes = moe_checkpoint
    quantized = InstantQuantSettings("uint4", 32).quantized_names(shapes)
    bound, largest = conversion_memory_bound(shapes, set(quantized))
    model_bytes = files_bytes(os.path.join(src, "*.safetensors"))
    assert model_bytes > 4 * (bound + SLACK)  # the model is far bigger than what conversion may hold
    convert = measure("convert", src, str(tmp_path), "m", {"format": "uint4", "group": 32})
    grown = convert["peak"] - convert["before"]
    assert grown < bound + SLACK, f"conversion grew {grown >> 20} MiB, bound {bound >> 20} MiB (+ slack)"
    asparam = os.path.getsize(tmp_path / "m.asparam")
    load = measure("load", src, str(tmp_path), "m")
    grown = load["peak"] - load["before"]
    # packed weights (uint4 codes, fp16 scales, an int8 head) are smaller than the file: once is < 1x
    assert grown < asparam + SLACK, f"loading grew {grown >> 20} MiB for {asparam >> 20} MiB of weights"


# gpt-oss as released: each layer's experts fused in one MXFP4 tensor (10 layers of 64 experts, 512
# wide: ~280 MB), which conversion reads one expert at a time
GPT_OSS_CONFIG = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_size=512,
                      intermediate_size=512, num_local_experts=64, num_experts_per_tok=4, num_hidden_layers=10,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=256,
                      sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 5,
                      max_position_embeddings=4096, rope_theta=150000.0, rms_norm_eps=1e-5, swiglu_limit=7.0,
                      attention_bias=True, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                      quantization_config={"quant_method": "mxfp4"})


@pytest.fixture(scope="module")
def gpt_oss_checkpoint(tmp_path_factory):
    """A random gpt-oss checkpoint of GPT_OSS_CONFIG in the release layout (numpy, no torch) -> dir."""
    from bench.make_model import checkpoint_tensors
    out = tmp_path_factory.mktemp("gpt-oss-280mb")
    with open(out / "config.json", "w") as f:
        json.dump(GPT_OSS_CONFIG, f)
    architecture, cfg = normalize_hf_config(GPT_OSS_CONFIG)
    stored = checkpoint_tensors(cfg, weight_shapes(cfg, architecture))
    codes = {name: "U8" if name.endswith(("_blocks", "_scales")) else "BF16" for name in stored}
    writer = SafetensorsWriter(out / "model.safetensors", [(n, codes[n], s) for n, s in stored.items()])
    rng = np.random.default_rng(0)
    for name, shape in stored.items():
        if codes[name] == "U8":
            writer.write(name, rng.integers(0, 256, shape, np.uint8) if name.endswith("_blocks")
                         else np.full(shape, 127 - 8, np.uint8))
        else:
            writer.write(name, to_bf16(rng.standard_normal(shape, np.float32) * 0.02))
    writer.close()
    return str(out)


def test_fused_mxfp4_experts_convert_one_expert_at_a_time(gpt_oss_checkpoint, tmp_path):
    shapes = weight_shapes(*reversed(normalize_hf_config(GPT_OSS_CONFIG)))
    bound, largest = conversion_memory_bound(shapes, set())
    assert files_bytes(os.path.join(gpt_oss_checkpoint, "*.safetensors")) > 4 * (bound + SLACK)
    convert = measure("convert", gpt_oss_checkpoint, str(tmp_path), "m")
    grown = convert["peak"] - convert["before"]
    assert grown < bound + SLACK, f"conversion grew {grown >> 20} MiB, bound {bound >> 20} MiB (+ slack)"


# CONFIG as a block-wise FP8 checkpoint (Qwen3-30B-A3B-FP8's layout: every layer's projections and
# experts F8_E4M3 with float32 scales a 128 x 128 block, the rest bf16), 12 layers (~150 MB)
FP8_CONFIG = dict(CONFIG, num_hidden_layers=12, quantization_config={
    "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    """A random FP8 checkpoint of FP8_CONFIG (numpy and our safetensors writer: no torch) -> dir."""
    out = tmp_path_factory.mktemp("moe-fp8-150mb")
    with open(out / "config.json", "w") as f:
        json.dump(FP8_CONFIG, f)
    shapes = weight_shapes(*reversed(normalize_hf_config(FP8_CONFIG)))
    fp8 = {n for n in shapes if n.endswith("_proj.weight")}
    layout = [(n, "F8_E4M3" if n in fp8 else "BF16", s) for n, s in shapes.items()]
    layout += [(n + "_scale_inv", "F32", (-(-s[0] // 128), -(-s[1] // 128))) for n, s in shapes.items() if n in fp8]
    writer = SafetensorsWriter(out / "model.safetensors", layout)
    rng = np.random.default_rng(0)
    for name, code, shape in layout:
        if code == "F8_E4M3":  # any finite e4m3 (S.1111.111 is NaN)
            writer.write(name, rng.integers(0, 0x7F, shape, np.uint8) | (rng.integers(0, 2, shape, np.uint8) << 7))
        elif code == "F32":
            writer.write(name, np.full(shape, 1 / 448, np.float32))
        else:
            writer.write(name, to_bf16(np.ones(shape, np.float32) if len(shape) == 1 else
                                       rng.standard_normal(shape, np.float32) * 0.05))
    writer.close()
    return str(out)


@pytest.mark.parametrize("quant", [None, {"format": "uint4", "group": 32}])
def test_fp8_weights_dequantize_one_tensor_at_a_time(fp8_checkpoint, quant, tmp_path):
    shapes = weight_shapes(*reversed(normalize_hf_config(FP8_CONFIG)))
    quantized = InstantQuantSettings("uint4", 32).quantized_names(shapes) if quant else []
    bound, largest = conversion_memory_bound(shapes, set(quantized))
    assert files_bytes(os.path.join(fp8_checkpoint, "*.safetensors")) > 4 * (bound + SLACK)
    convert = measure("convert", fp8_checkpoint, str(tmp_path), "m", quant)
    grown = convert["peak"] - convert["before"]
    assert grown < bound + SLACK, f"conversion grew {grown >> 20} MiB, bound {bound >> 20} MiB (+ slack)"


def test_conversion_that_will_not_fit_is_refused_before_writing(moe_checkpoint, tmp_path, monkeypatch):
    from dashinfer_client.model import HuggingFaceModel
    src, shapes = moe_checkpoint
    bound, largest = conversion_memory_bound(shapes, set())
    monkeypatch.setenv("DASHINFER_MEMORY_LIMIT_MB", str(bound // 2**20 - 1))
    loader = HuggingFaceModel(src, "m", user_set_data_type="bfloat16", progress=False)
    with pytest.raises(ModelSerializerException, match=rf"converting m takes up to .* GiB of memory at once \(tensor "
                                                       rf"{largest}.*more than the .* GiB .*DASHINFER_MEMORY_LIMIT_MB"):
        loader.load_model().serialize_to_path(None, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")  # refused before the output directory is made
    monkeypatch.setenv("DASHINFER_MEMORY_LIMIT_MB", str(bound // 2**20 + 1))
    monkeypatch.setattr("shutil.disk_usage", lambda path: SimpleNamespace(total=1 << 30, used=0, free=1 << 20))
    with pytest.raises(ModelSerializerException, match=r"writes 0.\d+ GiB \(\d+ bytes: the .asparam with its header and "
                                                       r"the .asgraph\), more than the 0.000977 GiB \(1048576 bytes\) free"):
        loader.serialize_to_path(None, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


def test_dashinfer_convert_exits_78_when_it_will_not_fit(moe_checkpoint, tmp_path):
    from tests.test_cli import dashinfer, one_line_error
    src, shapes = moe_checkpoint
    bound, largest = conversion_memory_bound(shapes, set(InstantQuantSettings("uint4", 32).quantized_names(shapes)))
    limit = bound // 2**20 - 1
    one_line_error(dashinfer("convert", src, str(tmp_path / "out"), "--quant", "uint4",
                             env={"DASHINFER_MEMORY_LIMIT_MB": str(limit)}), 78,
                   f"(tensor {largest}", f"more than the {limit / 1024:.3g} GiB", "(DASHINFER_MEMORY_LIMIT_MB)")
