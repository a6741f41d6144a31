"""Quantized weights over tensor-parallel ranks.

Each rank's columns of a row-parallel weight (o_proj, down_proj): its partial sum is x . w over
those columns and the rank's own activations, w the whole row's quantization by the documented
rule (tests/quant_reference.py), so the allreduce adds up to the 1-rank product, each column's
zero term counted once, in its own rank's sum. Groups of 96 leave ragged last groups on the tiny
model's widths (64: one group of 64, 128 = 96 + 32), and the ranks cut the down projection
mid-group; per channel (group_size -1, DashInfer's default) a rank's columns are a group of their
own under the row's one scale and zero, on even and uneven head splits, and with int8 activations
(A8W8, compute_method activate_quant). Then whole per-channel models, dense and MoE: 2 ranks give
1 rank's tokens and logprobs, both near transformers' on the dequantized weights."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from dashinfer_client.model import DashInferModel
from dashinfer_server import kernels as K
from dashinfer_server.shard import EXPERT_SPLITS, Shard
from dashinfer_server.weights import WeightLoader
from tests.helpers import load_hf_model, serialize
from tests.quant_reference import ragged_reference
from tests.test_families import dequantized_into, prompt_of
from tests.test_parallel import HERE, group_env, mpirun, result_of
from tests.test_quant_head import vnni_slack

A8W8 = {"weight_format": "int8", "compute_method": "activate_quant"}  # per channel only
# 9 heads of 16 split 5 + 4: o_proj's 144 columns 80 + 64 (1 rank's and rank 0's not whole
# activation blocks of 32: the exact kernel; rank 1's int8 activations where the CPU takes them)
UNEVEN = {"uneven": True, "head_dim": 16}
# (customized_quant_config, tiny_checkpoint options)
CASES = {"int8-g96": ({"weight_format": "int8", "group_size": 96}, {}),
         "uint4-g96": ({"weight_format": "uint4", "group_size": 96}, {}),
         "int8-per-channel": ({"weight_format": "int8"}, {}),
         "uint4-per-channel": ({"weight_format": "uint4"}, {}),
         "a8w8-per-channel": (A8W8, {}),
         "int8-per-channel-uneven": ({"weight_format": "int8"}, UNEVEN),
         "uint4-per-channel-uneven": ({"weight_format": "uint4"}, UNEVEN)}


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("case", CASES)
def test_each_rank_serves_its_columns_of_the_quantized_weights(isa, tiny_checkpoint, tmp_path, case, ranks):
    quant, shape = CASES[case]
    src = tiny_checkpoint("llama", **shape)
    serialize(src, tmp_path, dtype="float32", enable_quant=True, customized_quant_config=quant)
    model = DashInferModel(str(tmp_path), "tiny")
    cfg, fmt, group = model.config, quant["weight_format"], quant.get("group_size", -1)
    source = load_file(os.path.join(src, "model.safetensors"))
    weights = {"mlp.down_proj": cfg.intermediate_size, "self_attn.o_proj": cfg.num_attention_heads * cfg.head_dim}
    x = np.random.default_rng(3).standard_normal((2, max(weights.values()))).astype(np.float32)
    for rank in range(ranks):
        shard = Shard(rank, ranks, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size,
                      cfg.vocab_size)
        layer = WeightLoader(model, shard).load().layers[1]
        (i0, i1), (h0, h1) = shard.intermediate, shard.heads
        for packed, name, cols in ((layer.down, "mlp.down_proj", (i0, i1)),
                                   (layer.o, "self_attn.o_proj", (h0 * cfg.head_dim, h1 * cfg.head_dim))):
            g = weights[name] if group == -1 else group
            codes, scales, zeros, ref_w = ragged_reference(source[f"model.layers.1.{name}.weight"], fmt, g)
            ref_w, owner = ref_w[:, cols[0]:cols[1]], np.arange(cols[0], cols[1]) // g  # each column's group
            xs = np.ascontiguousarray(x[:, cols[0]:cols[1]])
            y, ref = K.linear(xs, packed), xs.astype(np.float64) @ ref_w.T
            slack = 0
            wtype = K.unpack_linear(packed)[0]
            if quant is A8W8 and (cols[1] - cols[0]) % 32 == 0:
                assert wtype == "i8q", (name, rank, wtype)  # int8 activations on every path
            if wtype.endswith("q"):
                slack = vnni_slack(xs, ref_w, codes[:, cols[0]:cols[1]], *((scales[:, owner], zeros[:, owner])
                                                                          if fmt == "int8" else (None, None)))
            assert (np.abs(y - ref) <= slack + 1e-4 * (1 + np.abs(ref))).all(), (name, rank)


@pytest.mark.parametrize("quant,cols,message", [
    ({"weight_format": "int8", "group_size": 64}, (32, 128),
     r"columns 32:128 split a quantization group \(group_size 64\)"),
    ({"weight_format": "int8", "group_size": 96}, (48, 128),
     r"split a quantization group \(group_size 96, served in groups of 32 on input size 128\)"),
    ({"weight_format": "uint4"}, (33, 128), "columns 33:128 split a byte of two uint4 codes")])
def test_a_split_the_quantization_cannot_take_is_refused_by_name(tiny_checkpoint, tmp_path, quant, cols, message):
    serialize(tiny_checkpoint("llama"), tmp_path, dtype="float32", enable_quant=True, customized_quant_config=quant)
    model = DashInferModel(str(tmp_path), "tiny")
    loader = WeightLoader(model, Shard(0, 1, 4, 2, model.config.intermediate_size, model.config.vocab_size))
    with pytest.raises(ValueError, match=message):
        loader.slices("model.layers.0.mlp.down_proj", cols=cols)


# ---- whole models per channel: 2 ranks against 1, and 1 against transformers -------------------

# (tiny_checkpoint's family and options, customized_quant_config without group_size: per channel,
# DashInfer's default). The uneven LLaMA cuts o_proj's columns 80 + 64; the MoE models' experts
# are cut by their rows or dealt out whole (DASHINFER_MOE_SPLIT), Qwen2-MoE's shared expert and
# Qwen3-MoE's dense middle layer by their rows.
PER_CHANNEL = [("llama", UNEVEN, {"weight_format": "int8"}),
               ("llama", UNEVEN, {"weight_format": "uint4"}),
               ("llama", {}, A8W8),
               ("qwen2_moe", {}, {"weight_format": "int8"}),
               ("qwen2_moe", {}, {"weight_format": "uint4"}),
               ("qwen3_moe", {}, {"weight_format": "uint4"}),
               ("qwen3_moe", {}, A8W8)]
# Both runs on the portable kernels, where i8/u4 are exact: on a faster path a rank whose columns
# are not whole activation blocks of 32 (the uneven split's 80) runs the exact kernel where 1 rank
# runs int8 activations, or the other way round, which moves these tiny models' logprobs by ~0.03
# and flips their near-ties (the first test holds every path's shards to the reference).
EXACT_KERNELS = {"DASHINFER_ISA": "portable"}
# Largest |logprob| difference over a first step's 10 most likely tokens: 2 ranks against 1 (the
# partial sums added in another order; measured 2e-6), and 1 rank against transformers on the
# dequantized weights per compute_method (weight_only measured 2e-6; A8W8's int8 activations,
# each within max|x| / 254 of x in its block of 32: 0.035-0.057).
RANKS_TOLERANCE = 1e-4
TRANSFORMERS_TOLERANCE = {"weight_only": 1e-4, "activate_quant": 0.1}


@pytest.fixture(scope="module")
def per_channel_one_rank(tmp_path_factory, tiny_checkpoint):
    """(mpi_engine.py's spec of every PER_CHANNEL model, the 1-rank engine's result of each,
    transformers' log-probabilities of each prompt's next token on the dequantized weights)."""
    import torch
    specs, transformers_first = [], []
    for i, (arch, shape, quant) in enumerate(PER_CHANNEL):
        src, out = tiny_checkpoint(arch, **shape), tmp_path_factory.mktemp(f"per-channel-{i}")
        serialize(src, out, enable_quant=True, customized_quant_config=quant)
        model = DashInferModel(str(out), "tiny")
        prompt = prompt_of(model, 30, seed=5)
        specs.append({"dir": str(out), "prefix": "tiny", "prompts": [prompt], "max_new": 12, "top_logprobs": 10})
        with torch.no_grad():
            logits = dequantized_into(load_hf_model(src), model)(torch.tensor([prompt])).logits[0, -1]
        transformers_first.append(torch.log_softmax(logits.double(), -1).numpy())
    spec = json.dumps({"models": specs})
    one = subprocess.run([sys.executable, os.path.join(HERE, "mpi_engine.py"), spec], capture_output=True,
                         text=True, timeout=300, env=group_env(DASHINFER_NUMA_NODES="", **EXACT_KERNELS))
    assert one.returncode == 0, one.stderr[-3000:]
    return spec, result_of(one.stdout)["models"], transformers_first


@pytest.mark.parametrize("split", EXPERT_SPLITS)
def test_per_channel_models_on_two_ranks_give_one_ranks_tokens(per_channel_one_rank, split):
    """Each PER_CHANNEL model on 2 ranks: 1 rank's 12 greedy tokens and first-step logprobs, and
    both near transformers' on the weights the file holds."""
    spec, one, transformers_first = per_channel_one_rank
    run = mpirun("mpi_engine.py", spec, timeout=300, DASHINFER_MOE_SPLIT=split, **EXACT_KERNELS)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    two = result_of(run.stdout)
    assert two["world"] == 2
    for (arch, shape, quant), [ref], [got], want in zip(PER_CHANNEL, one, two["models"], transformers_first):
        case = f"{arch} {shape} {quant} ({split})"
        assert got["status"] == "GenerateFinished" and got["error"] is None, case
        assert len(ref["ids"]) == 12 and got["ids"] == ref["ids"], case
        ref_first, got_first = dict(ref["top_logprobs"][0]), dict(got["top_logprobs"][0])
        both = ref_first.keys() & got_first.keys()
        assert max(abs(got_first[t] - ref_first[t]) for t in both) < RANKS_TOLERANCE, case
        bound = TRANSFORMERS_TOLERANCE[quant.get("compute_method", "weight_only")]
        for t, logprob in (ref_first | got_first).items():
            assert abs(logprob - want[int(t)]) < bound, (case, t)
