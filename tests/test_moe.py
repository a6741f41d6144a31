"""Mixture-of-experts models against transformers, on tiny random fp32 checkpoints that transformers
writes (tests/helpers.py FAMILY_CONFIGS: Qwen3-MoE with a dense middle layer, Qwen2-MoE with its
shared expert, Mixtral with a sliding window, OLMoE, gpt-oss, GLM-4.5 and dots.llm1's sigmoid
routers, ERNIE 4.5 MoE, Granite 3 MoE; gpt-oss's MXFP4 checkpoints are test_gpt_oss.py's, the
releases' configs test_moe_releases.py's): logits of a prompt and 16 decoded tokens
within 1e-3 of transformers', its greedy tokens, the op-by-op path equal to the native decoder,
16 greedy tokens on 2 ranks with either expert split, bf16 / int8 / uint4 experts within
test_families' bounds; and the kernel (native/moe.c) against numpy in float64.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from dashinfer_client.model.arch import ModelConfig
from tests.engine_helpers import DEFAULT_KV_FORMAT, reference
from tests.helpers import load_hf_model, tiny_config, write_config_variant
from tests.test_families import LOW_PRECISION, low_precision_error, prompt_of
from tests.test_families import test_logits_match_transformers as logits_match_transformers
from tests.test_families import test_op_by_op_reference_equals_native as op_by_op_equals_native
from tests.test_parallel import HERE, MPIEXEC, group_env, result_of

MOE_FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "glm4_moe", "ernie4_5_moe", "dots1", "granitemoe", "minimax_m2", "hunyuan_moe"]


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_logits_and_greedy_tokens_match_transformers(serialized_tiny, name):
    loader = serialized_tiny(name)
    hf = load_hf_model(loader.model_path)
    hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
    model = DashInferModel(loader.model_output_dir, loader.serialize_model_name)
    assert model.config.num_experts > 0
    logits_match_transformers((name, model, hf))
    op_by_op_equals_native((name, model, hf))


def test_qwen2_moe_without_a_shared_expert(serialized_tiny):
    """shared_expert_intermediate_size=0: transformers still builds and saves a shared expert (of 0
    rows) and its gate, which add zeros; the model is served without them, as transformers computes."""
    loader = serialized_tiny("qwen2_moe", shared_expert_intermediate_size=0)
    hf = load_hf_model(loader.model_path)
    hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
    model = DashInferModel(loader.model_output_dir, loader.serialize_model_name)
    assert model.config.shared_expert_intermediate_size == 0
    logits_match_transformers(("qwen2_moe without a shared expert", model, hf))


@pytest.fixture(scope="module")
def two_rank_cases(serialized_tiny):
    """(mpi_engine.py's model specs, transformers' 16 greedy tokens of each) of every MoE family
    (transformers' generate: the cache is fp32 as the engine's, so no rounding to mirror)."""
    specs, expected = [], []
    for name in MOE_FAMILIES:
        loader = serialized_tiny(name)
        prompt = prompt_of(DashInferModel(loader.model_output_dir, loader.serialize_model_name), 30, seed=5)
        specs.append({"dir": loader.model_output_dir, "prefix": loader.serialize_model_name,
                      "prompts": [prompt], "max_new": 16})
        expected.append(reference(load_hf_model(loader.model_path), prompt, DEFAULT_KV_FORMAT)[0])
    return specs, expected


@pytest.mark.parametrize("split", ["intermediate", "experts"])
def test_two_ranks_generate_transformers_greedy(two_rank_cases, split):
    """Every MoE family on one mpiexec'd group of 2 ranks, experts split by their intermediate rows
    or dealt out whole (DASHINFER_MOE_SPLIT), gives transformers' 16 greedy tokens."""
    specs, expected = two_rank_cases
    cmd = [MPIEXEC, "-n", "2", sys.executable, os.path.join(HERE, "mpi_engine.py"), json.dumps({"models": specs})]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env=group_env(DASHINFER_MOE_SPLIT=split))
    assert run.returncode == 0, run.stderr[-3000:]
    result = result_of(run.stdout)
    assert (result["world"], result["allreduce"]) == (2, "shm")
    for name, want, got in zip(MOE_FAMILIES, expected, result["models"]):
        assert got[0]["ids"] == want, f"{name} on 2 ranks ({split}): {got[0]} != transformers {want}"


@pytest.mark.parametrize("mode", ["bf16", "int8", "uint4"])
@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_low_precision_experts_stay_close_to_transformers(tmp_path, tiny_checkpoint, name, mode):
    """Experts in bf16, or InstantQuant int8 / uint4 per expert, within test_families' bounds of
    transformers on the weights the model stores. A rounding may flip a near-tie of the router,
    which moves that step's logits far and, through its keys and values, the later ones some
    (AVX-512, whose GEMMs round activations to bf16: 0.30 at the flip, 0.05-0.11 after it, for
    gpt-oss uint4): the median step keeps the bound, the worst ten times it (a wrong kernel moves
    every step)."""
    rel = low_precision_error(tmp_path, tiny_checkpoint, name, mode, stored_weights=True)
    bound = LOW_PRECISION[mode][3]
    assert np.median(rel) < bound and rel.max() < 10 * bound, \
        f"{name} {mode}: relative RMS logits error per step {np.round(rel, 4)}"


@pytest.mark.parametrize("name", [n for n in MOE_FAMILIES if n != "gpt_oss"])  # test_gpt_oss.py has its own
def test_stacked_experts_convert_as_the_checkpoint_does(tmp_path, serialized_tiny, name):
    """transformers 5 stacks each layer's experts in two 3-D parameters (and Mixtral's block is
    `mlp` there): serialize_model_from_torch of the module, and a checkpoint directory saved in that
    layout, write the model the per-expert checkpoint converts to, tensor for tensor."""
    from safetensors.torch import save_file
    from dashinfer_server.engine import Engine
    loader = serialized_tiny(name)
    hf = load_hf_model(loader.model_path)
    state = hf.state_dict()
    assert any(n.endswith(".experts.gate_up_proj") for n in state)
    want = DashInferModel(loader.model_output_dir, loader.serialize_model_name)
    hf_class = hf.config.architectures[0]
    Engine().serialize_model_from_torch("m", hf_class, hf, hf.config.to_dict(), str(tmp_path / "torch"))
    stacked = tmp_path / "stacked"
    stacked.mkdir()
    hf.config.save_pretrained(stacked)
    save_file({n: t.contiguous() for n, t in state.items() if n != "lm_head.weight" or not hf.config.tie_word_embeddings},
              str(stacked / "model.safetensors"), metadata={"format": "pt"})
    HuggingFaceModel(str(stacked), "m", user_set_data_type="float32", progress=False).load_model() \
        .serialize_to_path(None, str(tmp_path / "dir"))
    for got in (DashInferModel(str(tmp_path / "torch"), "m"), DashInferModel(str(tmp_path / "dir"), "m")):
        assert sorted(got.tensor_names()) == sorted(want.tensor_names())
        for tensor in want.tensor_names():
            np.testing.assert_array_equal(got.tensor(tensor), want.tensor(tensor), err_msg=tensor)


# ---- the kernel against numpy in float64 ------------------------------------------------------

def silu(z):
    return z / (1.0 + np.exp(-z))


def reference_moe(x, router, experts, top_k, norm_topk, shared=None, biases=None, glm=None):
    """float64: softmax of the router's logits, its top_k (renormalised), each chosen expert's
    SiLU-gated MLP weighted and summed; plus the shared expert times sigmoid(x . gate) (a gate of
    None: added as it is). biases: (router [E], per expert (gate [I], up [I], down [H])), gpt-oss's:
    the top_k of the logits then their softmax, as transformers' GptOssTopKRouter computes it. glm:
    (choice bias [E], scale), transformers' Glm4MoeTopkRouter: each logit's sigmoid, the top_k of
    sigmoid + choice bias, their sigmoids renormalised, times scale."""
    router_bias, expert_biases = biases or (np.zeros(len(router)), [(0, 0, 0)] * len(experts))
    logits = x @ router.T + router_bias
    if glm:
        p = 1.0 / (1.0 + np.exp(-logits))
    else:
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(len(x)):
        chosen = np.argsort(-(p[t] + glm[0] if glm else p[t]))[:top_k]
        weights = p[t, chosen] / (p[t, chosen].sum() if norm_topk else 1.0) * (glm[1] if glm else 1.0)
        if biases:
            top = np.exp(logits[t, chosen] - logits[t, chosen].max())
            weights = top / top.sum()
        for e, w in zip(chosen, weights):
            (gate, up, down), (bg, bu, bd) = experts[e], expert_biases[e]
            out[t] += w * ((silu(gate @ x[t] + bg) * (up @ x[t] + bu)) @ down.T + bd)
    if shared is not None:
        gate, up, down, sigmoid_gate = shared
        y = (silu(x @ gate.T) * (x @ up.T)) @ down.T
        out += y if sigmoid_gate is None else y / (1.0 + np.exp(-(x @ sigmoid_gate)))[:, None]
    return out


def packed_rows(K, linears, wtype):
    """Packed linears side by side, one a row (native/moe.h's experts): f32 weights, or u4 InstantQuant."""
    packs = []
    for w in linears:
        if wtype == "f32":
            packs.append(K.pack_linear(np.ascontiguousarray(w, np.float32), "f32"))
        else:
            codes, *params = K.quantize(np.ascontiguousarray(w, np.float32), 32, 4)
            packs.append(K.pack_linear(codes, "u4", 32, *params))
    stride = -(-max(p.nbytes for p in packs) // 64) * 64
    out = np.zeros((len(packs), stride), np.uint8)
    for j, p in enumerate(packs):
        out[j, :p.nbytes] = p
    return out


def on_u4_grid(rng, shape):
    """A weight that uint4 InstantQuant gives back exactly, whole or any of its rows or 32-aligned
    columns (how the expert splits cut it): every group of 32 holds codes 0 and 15 around zero
    code 8 (the range [-8 s, 7 s] holds 0), and each row one step s = 255 * 2^-j (its row scale
    2^-j and scale code 255 exact), float64."""
    n, k = shape
    q = rng.integers(0, 16, (n, k // 32, 32))
    q[..., 0], q[..., 1] = 0, 15
    q = rng.permuted(q, axis=2)
    step = 255.0 * 2.0 ** -rng.integers(14, 16, (n, 1, 1)).astype(np.float64)
    return ((q - 8) * step).reshape(n, k)


@pytest.fixture(scope="module")
def K():
    from dashinfer_server import kernels
    return kernels.load()


@pytest.mark.parametrize("tokens", [1, 37, 200])
@pytest.mark.parametrize("wtype", ["f32", "u4"])
@pytest.mark.parametrize("norm_topk,shared,biased,glm", [(True, False, False, False), (False, True, False, False),
                                                        (True, False, True, False), (True, True, False, True)])
def test_moe_kernel_matches_float64(K, tokens, wtype, norm_topk, shared, biased, glm):
    """The whole block (routing, tokens grouped by expert, weighted scatter, shared expert; or
    gpt-oss's router and expert biases; or GLM-4.5's sigmoid scores, choice bias, routed scale and
    ungated shared expert) on every expert split: the whole, two ranks with whole
    experts each, two ranks with half of every expert's rows (rank 0 adding the down biases); the
    parts of a split sum to the float64 reference. Each runs with scratch for the T tokens (a
    prompt's experts as work items, one thread each; at 200 tokens an expert's ~100 rows make two
    items and the outputs several batches) and for all T * top_k slots (every chosen expert
    together, as a decode step runs): the same sums."""
    rng = np.random.default_rng(tokens)
    H, E, I, S, top_k = 64, 6, 128, 64, 3
    x = rng.standard_normal((tokens, H))
    router = rng.standard_normal((E, H)) / 4
    experts = [tuple(rng.standard_normal(s) / np.sqrt(s[1]) for s in ((I, H), (I, H), (H, I))) for _ in range(E)]
    if wtype == "u4":
        experts = [tuple(on_u4_grid(rng, w.shape) for w in ex) for ex in experts]
    shared_w = None
    if shared:
        shared_w = tuple(rng.standard_normal(s) / np.sqrt(s[1]) for s in ((S, H), (S, H), (H, S))) + \
            (rng.standard_normal(H) / 8,)
        if glm:
            shared_w = shared_w[:3] + (None,)
    biases = None
    if biased:
        biases = (rng.standard_normal(E) / 4, [tuple(rng.standard_normal(n) / 4 for n in (I, I, H)) for _ in range(E)])
    glm = (rng.standard_normal(E) / 2, 2.5) if glm else None
    want = reference_moe(x, router, experts, top_k, norm_topk, shared_w, biases, glm)

    def part(expert_ids, rows, s_rows, expert0, step, down_bias=True, max_tokens=0):
        weights = {"router": K.pack_linear(router.astype(np.float32), "f32"),
                   "experts_gate_up": packed_rows(K, [np.concatenate([experts[e][0][rows], experts[e][1][rows]])
                                                      for e in expert_ids], wtype),
                   "experts_down": packed_rows(K, [experts[e][2][:, rows] for e in expert_ids], wtype)}
        if biased:
            b = biases[1]
            weights.update(router_bias=biases[0].astype(np.float32),
                           experts_gate_up_bias=np.stack([np.concatenate([b[e][0][rows], b[e][1][rows]])
                                                          for e in expert_ids]).astype(np.float32))
            if down_bias:
                weights["experts_down_bias"] = np.stack([b[e][2] for e in expert_ids]).astype(np.float32)
        shared_inter = 0
        if shared:
            gate, up, down, sig = shared_w
            shared_inter = s_rows.stop - s_rows.start
            weights.update(shared_gate_up=K.pack_linear(np.concatenate([gate[s_rows], up[s_rows]]).astype(np.float32), "f32"),
                           shared_down=K.pack_linear(np.ascontiguousarray(down[:, s_rows], np.float32), "f32"))
            if sig is not None:
                weights["shared_gate"] = sig.astype(np.float32)
        routing = {}
        if glm:
            weights["router_choice_bias"] = glm[0].astype(np.float32)
            routing = dict(scoring="sigmoid", routed_scale=glm[1])
        out = np.empty((tokens, H), np.float32)
        K.moe(x.astype(np.float32), weights, out, E, top_k, norm_topk=norm_topk, expert0=expert0,
              expert_step=step, shared_inter=shared_inter, max_tokens=max_tokens, **routing)
        return out.astype(np.float64)

    halves = slice(0, S // 2), slice(S // 2, S)  # the shared expert's rows, split either way
    # an expert's 5+ rows of u4 on the avx512 path run its GEMM: activations and dequantized
    # weights rounded to bf16 (test_linear's bound), twice over (gate_up, then down)
    rounded = wtype == "u4" and tokens > 4 and K.isa() == "avx512"
    tol = np.abs(want).max() * (8 * 2.0**-9 if rounded else 1e-5)
    for max_tokens in (tokens, tokens * top_k):
        whole = part(range(E), slice(0, I), slice(0, S), 0, 1, max_tokens=max_tokens)
        by_experts = sum(part(range(r, E, 2), slice(0, I), halves[r], r, 2, max_tokens=max_tokens) for r in (0, 1))
        by_rows = sum(part(range(E), slice(r * I // 2, (r + 1) * I // 2), halves[r], 0, 1, down_bias=r == 0,
                           max_tokens=max_tokens) for r in (0, 1))
        for got in (whole, by_experts, by_rows):
            assert np.abs(got - want).max() < tol, (max_tokens, np.abs(got - want).max() / tol)


def test_moe_kernel_refuses_mismatched_experts(K):
    H = 64
    router = K.pack_linear(np.zeros((4, H), np.float32), "f32")
    one = K.pack_linear(np.zeros((64, H), np.float32), "f32")
    rows = np.stack([one] * 3)  # 3 experts where expert0 0, step 1 of 4 needs 4
    x, out = np.zeros((2, H), np.float32), np.zeros((2, H), np.float32)
    with pytest.raises(ValueError, match="experts_gate_up"):
        K.moe(x, {"router": router, "experts_gate_up": rows, "experts_down": rows}, out, 4, 2)
    with pytest.raises(ValueError, match="top_k"):
        K.moe(x, {"router": router, "experts_gate_up": rows, "experts_down": rows}, out, 4, 5)
    four = np.stack([one] * 4)
    with pytest.raises(ValueError, match="scoring must be 'softmax' or 'sigmoid'"):
        K.moe(x, {"router": router, "experts_gate_up": four, "experts_down": four}, out, 4, 2, scoring="relu")
    with pytest.raises(ValueError, match="routed_scale"):
        K.moe(x, {"router": router, "experts_gate_up": four, "experts_down": four}, out, 4, 2, routed_scale=0.0)
    downs = np.stack([K.pack_linear(np.zeros((H, 32), np.float32), "f32")] * 4)
    with pytest.raises(ValueError, match="router_choice_bias"):
        K.moe(x, {"router": router, "experts_gate_up": four, "experts_down": downs,
                  "router_choice_bias": np.zeros(3, np.float32)}, out, 4, 2)


# ---- configs ------------------------------------------------------------------------------------

def test_sparse_layers_are_transformers_own():
    """decoder_sparse_step and mlp_only_layers leave the layers dense that transformers builds dense."""
    import torch
    from transformers import AutoModelForCausalLM
    from dashinfer_client.model.arch import normalize_hf_config
    config = tiny_config("qwen2_moe", num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
    sparse = [hasattr(layer.mlp, "experts") for layer in hf.model.layers]
    _, cfg = normalize_hf_config(config.to_dict())
    assert [cfg.is_moe_layer(i) for i in range(6)] == sparse == [False, True, False, False, False, True]


# config.json without the RoPE keys (a hand-written or trimmed config): transformers takes the
# config class's own defaults, Mixtral's base 1e6 and gpt-oss's base 150000 with YaRN (factor 32 over
# 4096 positions), not LLaMA's 10000
WITHOUT_ROPE = ("rope_parameters", "rope_scaling", "rope_theta")


@pytest.mark.parametrize("name", ["mixtral", "gpt_oss"])
def test_a_config_without_rope_keys_reads_as_transformers_reads_it(tmp_path, tiny_checkpoint, name):
    import shutil
    from tests.helpers import serialize
    src = tmp_path / "hf"
    shutil.copytree(tiny_checkpoint(name), src)
    write_config_variant(str(src), lambda c: {k: v for k, v in c.items() if k not in WITHOUT_ROPE})
    serialize(str(src), tmp_path / "out").free_model()
    hf = load_hf_model(str(src))
    hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
    logits_match_transformers((f"{name} without RoPE keys", DashInferModel(str(tmp_path / "out"), "tiny"), hf))


@pytest.mark.parametrize("name,edit,feature", [
    ("qwen2_moe", dict(use_sliding_window=True, sliding_window=8), "use_sliding_window"),
    ("olmoe", dict(clip_qkv=8.0), "clip_qkv"),
    ("qwen3_moe", dict(num_local_experts=8, num_experts=4), "num_experts / num_local_experts"),
    ("qwen3_moe", dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3"), "num_local_experts=8"),
])
def test_an_unsupported_moe_feature_is_refused_by_name(tmp_path, tiny_checkpoint, name, edit, feature):
    import shutil
    src = tmp_path / "m"
    shutil.copytree(tiny_checkpoint(name), src)
    write_config_variant(str(src), lambda c: dict(c, **edit))
    with pytest.raises(ModelSerializerException, match=feature):
        HuggingFaceModel(str(src), "m").read_model_config()


def test_a_config_without_expert_fields_is_dense():
    """Models serialized before the expert fields existed load unchanged: every layer dense."""
    fields = dict(vocab_size=272, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                  rope_theta=1e4, rope_scaling=None, max_position_embeddings=512, tie_word_embeddings=False,
                  attention_bias=False, bos_token_id=1, eos_token_id=[2], pad_token_id=0)
    cfg = ModelConfig.from_dict(fields)
    assert cfg.num_experts == 0 and not any(cfg.is_moe_layer(i) for i in range(2))
    with pytest.raises(ModelSerializerException, match="num_experts_per_tok"):
        ModelConfig.from_dict(dict(fields, num_experts=4, num_experts_per_tok=5, moe_intermediate_size=8))
