"""gpt-oss checkpoints whose experts are stored in MXFP4, as the released gpt-oss-20b/120b store
them (test_moe.py runs the family's fp32 checkpoint against transformers like every MoE family).

The checkpoint is tests/helpers.py's tiny random gpt-oss with its experts quantized to e2m1 codes
and e8m0 scales here, laid out as the real checkpoints are (`*_blocks` [E, out, in/32, 16],
`*_scales` [E, out, in/32], config.json's quantization_config quant_method "mxfp4"). The reference
is transformers on the same model with its expert parameters set to transformers' own
dequantization of those blocks (`convert_moe_packed_tensors`): the engine must give its logits
within 1e-3 and its greedy tokens, in process and on 2 ranks, from the blocks kept as stored.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from tests.engine_helpers import DEFAULT_KV_FORMAT, reference
from tests.helpers import load_hf_model, serialize, write_config_variant
from tests.test_families import prompt_of
from tests.test_families import test_logits_match_transformers as logits_match_transformers
from tests.test_parallel import HERE, MPIEXEC, group_env, result_of

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)  # the OCP e2m1 magnitudes, codes 0..7


def to_mxfp4(w):
    """w [..., N, K] -> (blocks uint8 [..., N, K/32, 16], scales uint8 [..., N, K/32]): each block of
    32 k scaled by the power of two that brings its largest magnitude to at most 6, each weight
    rounded to the nearest e2m1 value, two codes a byte, the even k in the low nibble."""
    g = w.reshape(*w.shape[:-1], -1, 32).astype(np.float64)
    exp = np.ceil(np.log2(np.maximum(np.abs(g).max(axis=-1), 1e-30) / 6.0))
    scaled = g / np.exp2(exp)[..., None]
    code = np.abs(np.abs(scaled)[..., None] - E2M1).argmin(axis=-1) + 8 * (scaled < 0)
    code = code.astype(np.uint8)
    return code[..., 0::2] | code[..., 1::2] << 4, (exp + 127).astype(np.uint8)


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tiny_checkpoint, tmp_path_factory):
    """(the MXFP4 checkpoint's directory, transformers on its dequantized experts)."""
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    src = tiny_checkpoint("gpt_oss")
    out = tmp_path_factory.mktemp("gpt-oss-mxfp4") / "hf"
    shutil.copytree(src, out)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    hf = load_hf_model(src)
    params = dict(hf.named_parameters())
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        # the parameter is [E, in, out]; the checkpoint's blocks run along `in`, one row per output
        blocks, scales = to_mxfp4(np.ascontiguousarray(tensors.pop(name).transpose(0, 2, 1)))
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        with torch.no_grad():
            params[name].copy_(convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                                          dtype=torch.float32))
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    write_config_variant(str(out), lambda c: dict(c, quantization_config={
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]}))
    hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
    return str(out), hf


@pytest.fixture(scope="module")
def served(mxfp4_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt-oss-mxfp4-serialized")
    serialize(mxfp4_checkpoint[0], out)
    return DashInferModel(str(out), "tiny")


def test_mxfp4_experts_are_stored_as_the_checkpoint_holds_them(mxfp4_checkpoint, served):
    from safetensors.numpy import load_file
    hf_dir, _ = mxfp4_checkpoint
    stored = load_file(os.path.join(hf_dir, "model.safetensors"))
    assert served.config.mxfp4_experts
    blocks = stored["model.layers.1.mlp.experts.gate_up_proj_blocks"][5]  # expert 5: [2I, H/32, 16]
    np.testing.assert_array_equal(served.tensor("model.layers.1.mlp.experts.5.up_proj.weight.mxfp4_blocks"),
                                  blocks[1::2].reshape(blocks.shape[0] // 2, -1))  # up: the odd rows
    np.testing.assert_array_equal(served.tensor("model.layers.1.mlp.experts.5.down_proj.weight.mxfp4_scales"),
                                  stored["model.layers.1.mlp.experts.down_proj_scales"][5])
    assert "model.layers.1.mlp.experts.5.up_proj.weight" not in served.tensor_names()


def test_mxfp4_experts_dequantize_as_transformers(mxfp4_checkpoint, served):
    """The packed expert weights the engine multiplies by are transformers' dequantized ones, bit
    for bit, gate and up rows taken apart from their alternation."""
    from dashinfer_server import kernels as K
    from dashinfer_server.shard import Shard
    from dashinfer_server.weights import WeightLoader
    _, hf = mxfp4_checkpoint
    K.load()
    c = served.config
    shard = Shard(0, 1, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.vocab_size,
                  num_experts=c.num_experts)
    layer = WeightLoader(served, shard).load().layers[2].moe
    assert K.unpack_linear(layer.experts_gate_up[3])[0] == "mxfp4"
    gate_up = hf.model.layers[2].mlp.experts.gate_up_proj[3].detach().numpy().T  # [2I, H], interleaved
    want = np.concatenate([gate_up[0::2], gate_up[1::2]])
    np.testing.assert_array_equal(K.dequantize_linear(layer.experts_gate_up[3]), want)
    np.testing.assert_array_equal(K.dequantize_linear(layer.experts_down[3]),
                                  hf.model.layers[2].mlp.experts.down_proj[3].detach().numpy().T)


def test_mxfp4_checkpoint_serves_transformers_logits_and_tokens(mxfp4_checkpoint, served):
    logits_match_transformers(("gpt_oss-mxfp4", served, mxfp4_checkpoint[1]))


def test_mxfp4_checkpoint_on_two_ranks_gives_transformers_greedy(mxfp4_checkpoint, served):
    """Experts split by their intermediate rows: each rank packs its columns of the down blocks."""
    prompt = prompt_of(served, 30, seed=5)
    want = reference(mxfp4_checkpoint[1], prompt, DEFAULT_KV_FORMAT)[0][:16]
    spec = {"dir": served.model_dir, "prefix": "tiny", "prompts": [prompt], "max_new": 16}
    cmd = [MPIEXEC, "-n", "2", sys.executable, os.path.join(HERE, "mpi_engine.py"), json.dumps({"models": [spec]})]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env=group_env(DASHINFER_MOE_SPLIT="intermediate"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert result_of(run.stdout)["models"][0][0]["ids"] == want


def test_instant_quant_leaves_mxfp4_experts_as_stored(mxfp4_checkpoint, served, tmp_path):
    serialize(mxfp4_checkpoint[0], tmp_path, enable_quant=True, weight_only_quant=True,
              customized_quant_config={"weight_format": "uint4", "group_size": 32})
    model = DashInferModel(str(tmp_path), "tiny")
    quantized = model.quantization["quantized"]
    assert "model.layers.0.self_attn.q_proj.weight" in quantized
    assert not [n for n in quantized if ".experts." in n]
    name = "model.layers.0.mlp.experts.2.down_proj.weight.mxfp4_blocks"
    np.testing.assert_array_equal(model.tensor(name), served.tensor(name))


def test_serialize_from_torch_by_class_name_splits_the_fused_experts(tmp_path, serialized_tiny):
    """serialize_model_from_torch given GptOssForCausalLM's own 3-D parameters writes the model
    the checkpoint directory converts to, tensor for tensor."""
    from dashinfer_server.engine import Engine
    loader = serialized_tiny("gpt_oss")
    hf = load_hf_model(loader.model_path)
    Engine().serialize_model_from_torch("m", "GptOssForCausalLM", hf, hf.config.to_dict(), str(tmp_path))
    got, want = DashInferModel(str(tmp_path), "m"), DashInferModel(loader.model_output_dir, loader.serialize_model_name)
    assert sorted(got.tensor_names()) == sorted(want.tensor_names())
    for name in want.tensor_names():
        np.testing.assert_array_equal(got.tensor(name), want.tensor(name), err_msg=name)


def test_the_checkpoint_says_whether_its_experts_are_mxfp4(tmp_path, mxfp4_checkpoint, served, serialized_tiny):
    """What the experts are is what the tensors are: float experts under a config.json that still says
    mxfp4 (a dequantized fine-tune saved beside the release's config) convert as the float checkpoint
    does, and MXFP4 blocks under a config without quantization_config are kept as stored."""
    floats = shutil.copytree(serialized_tiny("gpt_oss").model_path, tmp_path / "floats")
    write_config_variant(str(floats), lambda c: dict(c, quantization_config={"quant_method": "mxfp4"}))
    blocks = shutil.copytree(mxfp4_checkpoint[0], tmp_path / "blocks")
    write_config_variant(str(blocks), lambda c: {k: v for k, v in c.items() if k != "quantization_config"})
    loader = serialized_tiny("gpt_oss")
    for src, want in ((floats, DashInferModel(loader.model_output_dir, loader.serialize_model_name)),
                      (blocks, served)):
        serialize(str(src), tmp_path / f"{src.name}-out").free_model()
        got = DashInferModel(str(tmp_path / f"{src.name}-out"), "tiny")
        assert got.config.mxfp4_experts == want.config.mxfp4_experts
        assert sorted(got.tensor_names()) == sorted(want.tensor_names())
        for name in want.tensor_names():
            np.testing.assert_array_equal(got.tensor(name), want.tensor(name), err_msg=name)


@pytest.mark.parametrize("edit,feature", [
    (dict(swiglu_limit=10.0), "swiglu_limit"),
    (dict(swiglu_alpha=1.0), "swiglu_alpha"),
    (dict(swiglu_limit="7"), "swiglu_limit='7'"),
    (dict(quantization_config={"quant_method": "gptq"}), "gptq"),
])
def test_an_unsupported_gpt_oss_config_is_refused_by_name(tmp_path, tiny_checkpoint, edit, feature):
    src = tmp_path / "m"
    shutil.copytree(tiny_checkpoint("gpt_oss"), src)
    write_config_variant(str(src), lambda c: dict(c, **edit))
    with pytest.raises(ModelSerializerException, match=feature):
        HuggingFaceModel(str(src), "m").read_model_config()


def test_decode_bound_counts_mxfp4_experts_at_4_25_bits(served):
    """bench/bounds.py: one row reads top_k / E of each layer's experts at 17 bytes per 32 weights,
    the rest as stored (fp32 here), the router in fp32."""
    from bench import bounds
    c = served.config
    H, D, I, E = c.hidden_size, c.head_dim, c.moe_intermediate_size, c.num_experts
    attention = (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * D * H * 4
    experts = c.num_experts_per_tok * 3 * I * H * 17 / 32
    want = c.num_hidden_layers * (attention + E * H * 4 + experts) + c.vocab_size * H * 4
    assert bounds.weight_bytes_per_token(served, rows=1) == pytest.approx(want)
