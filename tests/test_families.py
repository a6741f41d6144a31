"""Every model family against transformers, on tiny random fp32 checkpoints that transformers
writes (tests/helpers.py FAMILY_CONFIGS): the engine's logits at every step of a prefilled prompt
and 16 decoded tokens within 1e-3 of transformers', the op-by-op reference path equal to the
native decoder, and 16 greedy tokens equal to transformers' on 2 tensor-parallel ranks.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from dashinfer_client import AsCacheMode
from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from tests.engine_helpers import DEFAULT_KV_FORMAT, engine_logits, hf_greedy, make_loop, reference
from tests.gguf_builders import build_tiny_gguf
from tests.helpers import FAMILY_CONFIGS, load_hf_model, serialize, write_config_variant
from tests.quant_reference import stored_parts
from tests.test_parallel import HERE, MPIEXEC, group_env, result_of

FAMILIES = ["llama-bias", "qwen3", "granite", "olmo2", "olmo3", "smollm3", "exaone4", "glm4", "ernie4_5", "seed_oss",
            "granite4", "hunyuan", "helium", "cohere", "cohere2", "arcee", "apertus", "nemotron", "starcoder2", "phi3", "mistral", "ministral", "ministral3", "qwen2-window", "gemma2", "gemma3", "phi4-mini",
            "qwen2-yarn"]
TOLERANCE = 1e-3


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, serialized_tiny):
    loader = serialized_tiny(request.param)
    hf = load_hf_model(loader.model_path)
    hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
    return request.param, DashInferModel(loader.model_output_dir, loader.serialize_model_name), hf


def prompt_of(model, n=45, seed=7):
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, model.config.vocab_size, n)]


def test_logits_match_transformers(family_model):
    name, model, hf = family_model
    loop = make_loop(model, AsCacheMode.AsCacheDefault)
    prompt = prompt_of(model)
    forced, plain, _ = reference(hf, prompt, DEFAULT_KV_FORMAT)
    got, _ = engine_logits(loop, prompt, forced)
    err = np.abs(got - plain).max(axis=1)
    assert err.max() < TOLERANCE, f"{name}: max abs logits error per step {err}"
    assert list(np.argmax(got[:-1], axis=1)) == forced, f"{name}: greedy tokens differ"


def test_op_by_op_reference_equals_native(family_model):
    """The Python path (written from the same layer description) agrees with the native decoder."""
    name, model, hf = family_model
    loop = make_loop(model, AsCacheMode.AsCacheDefault)
    prompt = prompt_of(model, 30, seed=3)
    forced = hf_greedy(hf, prompt, 4)
    native, _ = engine_logits(loop, prompt, forced)
    loop.model.fused = False
    python, _ = engine_logits(loop, prompt, forced)
    assert np.abs(native - python).max() < 1e-4, name


# one KV head under 4 query heads (Gemma 3 1B's shape): on 2 ranks, both hold it
ONE_KV_HEAD = dict(num_attention_heads=4, num_key_value_heads=1, hidden_size=64, head_dim=16)


def test_two_ranks_generate_transformers_greedy(serialized_tiny):
    """One mpiexec'd group of 2 ranks serves every family in turn; each gives transformers' 16
    greedy tokens. The uneven 9-head / 3-KV-head shape makes a GQA group straddle the ranks (and
    OLMo 2's whole-projection k norm then counts the shared head once); Gemma 3 and OLMo 2 with
    one KV head put it on both ranks."""
    specs, expected = [], []
    shapes = [(name, dict(uneven=True, hidden_size=144)) for name in FAMILIES] + \
        [(name, ONE_KV_HEAD) for name in ("gemma3", "olmo2")]
    for name, shape in shapes:
        # head_dim 16, the cache's smallest (Phi-3 takes it from hidden_size / heads)
        head_dim = {} if "head_dim" in FAMILY_CONFIGS[name][1] else {"head_dim": 16}
        loader = serialized_tiny(name, name=f"tp-{name}" + ("-1kv" if shape is ONE_KV_HEAD else ""),
                                 **dict(head_dim, **shape))
        hf = load_hf_model(loader.model_path)
        prompt = prompt_of(DashInferModel(loader.model_output_dir, loader.serialize_model_name), 30, seed=5)
        specs.append({"dir": loader.model_output_dir, "prefix": loader.serialize_model_name,
                      "prompts": [prompt], "max_new": 16})
        expected.append(hf_greedy(hf, prompt, 16))
    cmd = [MPIEXEC, "-n", "2", sys.executable, os.path.join(HERE, "mpi_engine.py"), json.dumps({"models": specs})]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=group_env())
    assert run.returncode == 0, run.stderr[-3000:]
    result = result_of(run.stdout)
    assert (result["world"], result["allreduce"]) == (2, "shm")
    assert len(result["models"]) == len(shapes)
    for (name, shape), want, got in zip(shapes, expected, result["models"]):
        assert got[0]["ids"] == want, f"{name} {shape} on 2 ranks: {got[0]} != transformers {want}"


def test_serialize_from_torch_refuses_a_contradicting_model_type(tmp_path, serialized_tiny):
    """A Granite config handed over as LLaMA_v2 must not be served as LLaMA (its multipliers would
    be dropped); as the class it is, it serializes."""
    from dashinfer_server.engine import Engine
    loader = serialized_tiny("granite")
    hf = load_hf_model(loader.model_path)
    config = hf.config.to_dict()
    config.pop("architectures", None)
    engine = Engine()
    with pytest.raises(ModelSerializerException, match="model_type 'granite'"):
        engine.serialize_model_from_torch("g", "LLaMA_v2", hf.state_dict(), config, str(tmp_path))
    engine.serialize_model_from_torch("g", "GraniteForCausalLM", hf.state_dict(), config, str(tmp_path))
    assert DashInferModel(str(tmp_path), "g").architecture == "granite"


def test_a_family_feature_this_runtime_lacks_is_refused(tmp_path, tiny_checkpoint):
    """Known family, unknown feature: refused by name at conversion, never served wrong."""
    src = tmp_path / "m"
    shutil.copytree(tiny_checkpoint("qwen3"), src)
    write_config_variant(str(src), lambda c: dict(c, hidden_act="relu"))
    with pytest.raises(ModelSerializerException, match="hidden_act='relu'"):
        HuggingFaceModel(str(src), "m").read_model_config()


def test_a_head_dim_the_kv_cache_lacks_is_refused_at_conversion(tmp_path, tiny_checkpoint):
    """hidden 96 over 4 heads: head_dim 24, which no KV cache format takes; refused before anything
    is converted, not when the converted model first starts."""
    src = tmp_path / "m"
    shutil.copytree(tiny_checkpoint("qwen2"), src)
    write_config_variant(str(src), lambda c: dict(c, hidden_size=96))
    with pytest.raises(ModelSerializerException, match="head_dim 24 is not served"):
        HuggingFaceModel(str(src), "m").read_model_config()


def test_serialize_from_torch_refuses_a_foreign_config_without_model_type(tmp_path, serialized_tiny):
    """DashInfer 1.3 scripts pass model.config.__dict__, which has no model_type: a Granite config
    given as LLaMA_v2 is still refused, by the Granite features LLaMA lacks."""
    from dashinfer_server.engine import Engine
    hf = load_hf_model(serialized_tiny("granite").model_path)
    config = dict(hf.config.__dict__, architectures=None)  # as a config built in code has it
    config.pop("model_type", None)
    with pytest.raises(ModelSerializerException, match="embedding_multiplier=6.0"):
        Engine().serialize_model_from_torch("g", "LLaMA_v2", hf.state_dict(), config, str(tmp_path))


# GGUF carries no query_pre_attn_scalar, local RoPE base or layer pattern: llama.cpp assumes
# Gemma's own (head_dim, 10000, every 2nd / 6th layer global), so these checkpoints use them. Gemma
# 3's attention soft-cap, written to the file, is one transformers ignores
GGUF_CASES = {"qwen3": {}, "phi3": {},
              # ERNIE-4.5-0.3B's shape: no biases (its RoPE over interleaved pairs, as llama.cpp's NORM rope)
              "ernie4_5": dict(use_bias=False),
              # LayerNorms with biases, a plain GELU-tanh MLP, biases everywhere (no window: GGUF keeps
              # StarCoder2's as llama.cpp reads it, and these prompts stay inside 4096)
              "starcoder2": dict(sliding_window=None),
              # Command R / Aya Expanse: its parallel block, LayerNorms, interleaved RoPE, logit scale
              "cohere": dict(attention_bias=False),
              # Granite 3: its four scalars, Q/K permuted as llama.cpp's LlamaModel does
              "granite": {},
              # Nemotron: LayerNorm1P (stored 1 + w), partial RoPE, a plain relu^2 MLP
              "nemotron": {},
              # llama.cpp rotates no 4th layer, whatever config.json said: the checkpoint's interval is 4
              "smollm3": dict(num_hidden_layers=4, no_rope_layer_interval=4, use_sliding_window=False,
                              sliding_window=None),
              "gemma2": dict(query_pre_attn_scalar=16),
              "gemma3": dict(query_pre_attn_scalar=16, rope_local_base_freq=10000.0, layer_types=None,
                             num_hidden_layers=6, attn_logit_softcapping=2.0)}


@pytest.mark.parametrize("name", GGUF_CASES)
def test_gguf_gives_the_tokens_of_the_hf_checkpoint(tmp_path, tiny_checkpoint, name):
    """The family's GGUF, as llama.cpp's converter writes it (gguf package), serves transformers'
    greedy tokens and logits, as the HF checkpoint does."""
    from dashinfer_client.model import GGUFModel
    hf_dir = tiny_checkpoint(name, **GGUF_CASES[name])
    gguf_path = build_tiny_gguf(tmp_path / f"{name}.gguf", hf_dir)
    GGUFModel(gguf_path, "g", user_set_data_type="float32", progress=False).load_model() \
        .serialize_to_path(None, str(tmp_path / "out"))
    model = DashInferModel(str(tmp_path / "out"), "g")
    assert model.architecture == name
    hf = load_hf_model(hf_dir)
    hf.config._attn_implementation = "eager"
    prompt = prompt_of(model, 30, seed=11)
    forced, plain, _ = reference(hf, prompt, DEFAULT_KV_FORMAT)
    got, _ = engine_logits(make_loop(model, AsCacheMode.AsCacheDefault), prompt, forced)
    assert list(np.argmax(got[:-1], axis=1)) == forced
    assert np.abs(got - plain).max() < TOLERANCE


# weights dtype / quantization and KV cache -> the largest relative RMS error of the logits over a
# prompt and 16 decoded tokens (teacher-forced) against fp32 transformers: of the checkpoint for
# bf16 and the KV formats (cache_rounding: transformers with K/V rounded as the cache stores them),
# of the dequantized weights for int8/uint4 (what the file describes: the engine must compute that
# model). Measured here at half of each bound or less (bf16: 0.005-0.022; quantized weights and KV
# formats against their rounded references: under 1e-4 but for Qwen3's uint4 KV, 0.011).
LOW_PRECISION = {
    "bf16": (dict(dtype="bfloat16"), AsCacheMode.AsCacheDefault, "fp32", 0.05),
    "int8": (dict(dtype="float32", enable_quant=True, weight_only_quant=True,
                  customized_quant_config={"weight_format": "int8", "group_size": 32}), AsCacheMode.AsCacheDefault,
             "fp32", 0.05),
    "uint4": (dict(dtype="float32", enable_quant=True, weight_only_quant=True,
                   customized_quant_config={"weight_format": "uint4", "group_size": 32}), AsCacheMode.AsCacheDefault,
              "fp32", 0.05),
    "kv-int8": (dict(dtype="float32"), AsCacheMode.AsCacheQuantI8, "int8", 0.01),
    "kv-uint4": (dict(dtype="float32"), AsCacheMode.AsCacheQuantU4, "uint4", 0.05),
}


def dequantized_into(hf, model):
    """hf with every weight the serialized model quantized replaced by its dequantization, and the
    output head quantized as the engine quantizes it at load (int8: weights.py HEAD_BITS, head_group)."""
    import torch
    from dashinfer_client.model.quant import dequantize, quantize
    from dashinfer_server.weights import head_group
    q = model.quantization
    fmt, group = q["weight_format"], q["group_size"]
    params = dict(hf.named_parameters())
    with torch.no_grad():
        for name in q["quantized"]:
            parts = stored_parts(model, name, fmt)
            hf_parameter(params, name).copy_(torch.from_numpy(in_checkpoint_order(model, name,
                                                                                  dequantize(parts, fmt, group))))
        out = hf.get_output_embeddings()  # a tied head gets a weight of its own: the lookup stays exact
        head = out.weight.detach().numpy()
        g = head_group(group, head.shape[1])
        out.weight = torch.nn.Parameter(torch.from_numpy(dequantize(quantize(head, "int8", g), "int8", g)))
    return hf


def in_checkpoint_order(model, name, w):
    """A serialized weight's rows in the checkpoint's order: the q and k rows of the families with
    interleaved RoPE were reordered at conversion (families/glm4.py HalvedRope)."""
    from dashinfer_client.model.families import family
    from dashinfer_client.model.families.glm4 import QK_ROWS, HalvedRope
    if HalvedRope not in family(model.architecture).checkpoint_views or not QK_ROWS.match(name):
        return w
    order = HalvedRope(None, model.config).order
    return w.reshape(-1, len(order), *w.shape[1:])[:, np.argsort(order)].reshape(w.shape)


EXPERT = re.compile(r"(model\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")


def hf_parameter(params, name):
    """The transformers parameter (or the part of one) a checkpoint tensor loads into: transformers 5
    holds a layer's experts in two 3-D parameters, gate_up_proj [E, 2I, H] and down_proj [E, H, I];
    gpt-oss's (it has gate_up_proj_bias) are [E, H, 2I] with gate and up alternating, and [E, I, H];
    Granite 3 MoE's sit under block_sparse_moe, every other family's under mlp."""
    m = EXPERT.fullmatch(name)
    if not m:  # Granite 4's MLP is stored as shared_mlp (families/granite4.py), StarCoder2's as c_fc / c_proj
        renamed = [name.replace("mlp.gate_up_proj", "shared_mlp.input_linear").replace("mlp.down_proj",
                                                                                      "shared_mlp.output_linear"),
                   name.replace("mlp.up_proj", "mlp.c_fc").replace("mlp.down_proj", "mlp.c_proj")]
        return params[next(n for n in [name, *renamed] if n in params)]
    e, role = int(m.group(2)), m.group(3)
    layer = next(f"{m.group(1)}.{block}" for block in ("mlp", "block_sparse_moe")
                 if f"{m.group(1)}.{block}.experts.down_proj" in params)
    if f"{layer}.experts.gate_up_proj_bias" in params:
        if role == "down_proj":
            return params[f"{layer}.experts.down_proj"][e].T
        first = 0 if role == "gate_proj" else 1
        return params[f"{layer}.experts.gate_up_proj"][e][:, first::2].T
    if role in ("down_proj", "w2"):
        return params[f"{layer}.experts.down_proj"][e]
    gate_up = params[f"{layer}.experts.gate_up_proj"][e]
    half = gate_up.shape[0] // 2
    return gate_up[:half] if role in ("gate_proj", "w1") else gate_up[half:]


def low_precision_error(tmp_path, tiny_checkpoint, name, mode, stored_weights=False):
    """The relative RMS logits error per step of the model serialized as LOW_PRECISION[mode] says.
    stored_weights: a bf16 model is held to transformers on its bf16-rounded weights (and K/V), as a
    quantized one always is to its dequantized weights: where rounding may flip a router's choice of
    experts, the fp32 checkpoint's logits are another model's."""
    options, kv_mode, kv_format, _ = LOW_PRECISION[mode]
    hf_dir = tiny_checkpoint(name)
    serialize(hf_dir, tmp_path, **options)
    model = DashInferModel(str(tmp_path), "tiny")
    hf = load_hf_model(hf_dir)
    hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
    if model.quantization:
        dequantized_into(hf, model)
    elif stored_weights and model.dtype == "bfloat16":
        import torch
        with torch.no_grad():
            for p in hf.parameters():
                p.copy_(p.bfloat16().float())
        kv_format = "bf16"  # a bf16 model's cache (model.kv_format)
    prompt = prompt_of(model, 30, seed=2)
    forced, _, rounded = reference(hf, prompt, kv_format)
    got, _ = engine_logits(make_loop(model, kv_mode), prompt, forced)
    return np.sqrt(((got - rounded) ** 2).mean(axis=1) / (rounded ** 2).mean(axis=1))


@pytest.mark.parametrize("mode", LOW_PRECISION)
@pytest.mark.parametrize("name", FAMILIES)
def test_low_precision_stays_close_to_transformers(tmp_path, tiny_checkpoint, name, mode):
    rel = low_precision_error(tmp_path, tiny_checkpoint, name, mode)
    assert rel.max() < LOW_PRECISION[mode][3], f"{name} {mode}: relative RMS logits error per step {np.round(rel, 4)}"
