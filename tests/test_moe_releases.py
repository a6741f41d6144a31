"""GLM-4.5's and ERNIE 4.5 MoE's variants beyond tests/test_moe.py's tiny models (which every MoE
test runs): GLM without q/k norms or shared experts; each config as released (transformers 4.x's
spelling) with the multi-token-prediction tensors its checkpoints hold; the choice bias held in
fp32 in a bf16 model; the routings they refuse by name."""
import json
import os
import shutil

import numpy as np
import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from tests.helpers import load_hf_model, serialize, write_config_variant
from tests.test_family_configs import served_as_transformers
from tests.test_families import test_logits_match_transformers as logits_match_transformers


@pytest.mark.parametrize("variant", [dict(use_qk_norm=False), dict(n_shared_experts=0)])
def test_variants_match_transformers(serialized_tiny, variant):
    """GLM-4.5's own configs have no q/k norms; without shared experts transformers still saves
    their 0-row projections, which add nothing and are left unread."""
    loader = serialized_tiny("glm4_moe", **variant)
    hf = load_hf_model(loader.model_path)
    hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
    model = DashInferModel(loader.model_output_dir, loader.serialize_model_name)
    assert model.config.use_qk_norm == variant.get("use_qk_norm", True)
    assert model.config.shared_expert_intermediate_size == variant.get("n_shared_experts", 2) * 32
    logits_match_transformers((f"glm4_moe {variant}", model, hf))


def _as_released(config):
    """config.json as zai-org's GLM-4.5 checkpoints ship it (transformers 4.54): RoPE's base and
    partial_rotary_factor at the top level, num_nextn_predict_layers; norm_topk_prob left to the
    class default (true) to check that default too."""
    rope = config.pop("rope_parameters")
    config.pop("norm_topk_prob")
    return dict(config, rope_theta=rope["rope_theta"], partial_rotary_factor=rope["partial_rotary_factor"],
                rope_scaling=None, num_nextn_predict_layers=1)


def _ernie_as_released(config):
    """config.json as Baidu's ERNIE-4.5-21B-A3B-PT ships it: RoPE's base at the top level, its
    training-only keys."""
    rope = config.pop("rope_parameters")
    return dict(config, rope_theta=rope["rope_theta"], moe_use_aux_free=True, moe_gate="topk",
                moe_capacity=[8, 8, 8], num_nextn_predict_layers=1, multi_token_pred_lambda=0.3)


def _minimax_as_released(config):
    """config.json as MiniMax's MiniMax-M2 ships it: partial RoPE only as rotary_dim, RoPE's base at the
    top level, and the keys of its MiniMax-Text lineage that transformers does not read."""
    rope = config.pop("rope_parameters")
    return dict(config, rope_theta=rope["rope_theta"], attn_type_list=[1] * config["num_hidden_layers"],
                qk_norm_type="per_layer", use_qk_norm=True, scoring_func="sigmoid", use_routing_bias=True,
                shared_intermediate_size=0)


def _hunyuan_as_released(config):
    """config.json as Tencent's Hunyuan-A13B ships it: the expert counts per layer, the keys
    transformers does not read (num_shared_expert, moe_intermediate_size: one MLP of
    intermediate_size is what it builds), RoPE as rope_scaling with its NTK alpha."""
    layers, rope = config["num_hidden_layers"], config.pop("rope_parameters")
    return dict(config, moe_topk=[config["moe_topk"]] * layers, num_shared_expert=[1] * layers,
                moe_intermediate_size=[config["intermediate_size"]] * layers, use_mixed_mlp_moe=True,
                use_qk_norm=True, rope_theta=rope["rope_theta"],
                rope_scaling={"type": "dynamic", "alpha": rope["alpha"], "factor": 1.0})


def with_tensors(src, make):
    """src's model.safetensors rewritten with the tensors make(weights) adds."""
    from safetensors.torch import load_file, save_file
    weights = load_file(str(src / "model.safetensors"))
    save_file({**weights, **make(weights)}, str(src / "model.safetensors"), metadata={"format": "pt"})


def _glm_draft_layer(weights):
    """A multi-token-prediction layer after the last, as GLM-4.5's checkpoints hold it: a whole layer
    plus its eh_proj and norms."""
    import torch
    last = max(int(n.split(".")[2]) for n in weights if n.startswith("model.layers."))
    draft = {n.replace(f"layers.{last}.", f"layers.{last + 1}."): t.clone() for n, t in weights.items()
             if n.startswith(f"model.layers.{last}.")}
    return dict(draft, **{f"model.layers.{last + 1}.eh_proj.weight": torch.randn(64, 128),
                          f"model.layers.{last + 1}.enorm.weight": torch.ones(64)})


def _ernie_mtp_block(weights):
    """ERNIE 4.5's multi-token-prediction block, beside the layers."""
    import torch
    return {"model.mtp_block.0.self_attn.q_proj.weight": torch.randn(64, 64),
            "model.mtp_emb_norm.0.weight": torch.ones(64), "model.mtp_linear_proj.0.weight": torch.randn(64, 128)}


@pytest.mark.parametrize("name,released,draft", [("glm4_moe", _as_released, _glm_draft_layer),
                                                 ("ernie4_5_moe", _ernie_as_released, _ernie_mtp_block),
                                                 ("minimax_m2", _minimax_as_released, lambda weights: {}),
                                                 ("hunyuan_moe", _hunyuan_as_released, lambda weights: {})])
def test_a_release_with_its_draft_layer_serves_as_transformers(tmp_path, tiny_checkpoint, name, released, draft):
    """The release's checkpoint holds multi-token-prediction tensors (speculative decoding's drafts):
    transformers leaves them unread, and so does the conversion."""
    src = tmp_path / "with-draft"
    shutil.copytree(tiny_checkpoint(name), src)
    with_tensors(src, draft)
    model, _ = served_as_transformers(tmp_path, str(src), released, f"{name} as released")
    assert model.config.norm_topk_prob
    sparse = {"glm4_moe": [False, True, True], "ernie4_5_moe": [True, True, False], "minimax_m2": [True, True],
              "hunyuan_moe": [True, True]}[name]
    assert [model.config.is_moe_layer(i) for i in range(len(sparse))] == sparse
    assert not any(n.startswith("model.mtp_") or n.startswith("model.layers.3.") for n in model.tensor_names())


def test_a_bf16_model_holds_the_choice_bias_in_fp32(tmp_path, tiny_checkpoint):
    """transformers keeps e_score_correction_bias in fp32 whatever the model's dtype (its small
    differences pick the experts), and so does a bf16 conversion: stored F32, bit for bit."""
    from safetensors import safe_open
    src = tiny_checkpoint("glm4_moe")
    serialize(src, tmp_path, dtype="bfloat16").free_model()
    with open(tmp_path / "tiny.asgraph") as f:
        tensors = json.load(f)["tensors"]
    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert tensors[name]["dtype"] == "F32" and tensors["model.layers.1.mlp.gate.weight"]["dtype"] == "BF16"
    with safe_open(os.path.join(src, "model.safetensors"), "np") as f:
        np.testing.assert_array_equal(DashInferModel(str(tmp_path), "tiny").tensor(name), f.get_tensor(name))


@pytest.mark.parametrize("name,edit,feature", [
    ("glm4_moe", dict(n_group=8, topk_group=4), "n_group=8 with topk_group=4"),
    ("glm4_moe", dict(routed_scaling_factor=0), "routed_scaling_factor=0"),
    ("glm4_moe", dict(n_routed_experts=4, num_local_experts=8), "n_routed_experts / num_local_experts"),
    ("ernie4_5_moe", dict(use_bias=True), "use_bias=true with shared experts"),
    ("ernie4_5_moe", dict(moe_layer_interval=0), "moe_layer_interval=0"),
    ("minimax_m2", dict(attn_type_list=[0, 1]), r"attn_type_list with \[0\]"),
    ("hunyuan_moe", dict(moe_topk=[2, 4]), r"moe_topk=\[2, 4\] \(a count that differs between layers\)"),
])
def test_a_routing_this_runtime_lacks_is_refused_by_name(tmp_path, tiny_checkpoint, name, edit, feature):
    """DeepSeek-V3's grouped routing (experts chosen within the best groups only) is not served, nor
    ERNIE's biased shared experts (its releases have no biases)."""
    src = tmp_path / "m"
    shutil.copytree(tiny_checkpoint(name), src)
    write_config_variant(str(src), lambda c: dict(c, **edit))
    with pytest.raises(ModelSerializerException, match=feature):
        HuggingFaceModel(str(src), "m").read_model_config()


def test_ernie_reads_the_last_sparse_layer_as_transformers_does(tmp_path, tiny_checkpoint):
    """moe_layer_end_index -1 means the last layer; with moe_layer_interval 2 the odd layers only."""
    checkpoint = tiny_checkpoint("ernie4_5_moe", moe_layer_end_index=2, moe_layer_interval=2)
    model, _ = served_as_transformers(tmp_path, checkpoint, lambda c: dict(c, moe_layer_end_index=-1),
                                      "ernie4_5_moe to the last layer")
    assert [model.config.is_moe_layer(i) for i in range(3)] == [False, True, False]
