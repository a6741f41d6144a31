"""Families' config.json spellings and settings that transformers reads its own way (4.x's and
5.x's keys, default layer patterns, per-type RoPE, settings that change nothing), each served with
transformers' logits on the same checkpoint; and the variants a family refuses by name."""
import shutil

import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from tests.helpers import load_hf_model, serialize, write_config_variant
from tests.test_families import test_logits_match_transformers as logits_match_transformers


def served_as_transformers(tmp_path, checkpoint, edit, name):
    """The checkpoint with its config.json edited, converted: its logits and greedy tokens are
    transformers' on the same directory -> (the served model, transformers' model)."""
    src = tmp_path / "hf"
    shutil.copytree(checkpoint, src)
    write_config_variant(str(src), edit)
    serialize(str(src), tmp_path / "out").free_model()
    hf = load_hf_model(str(src))
    hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
    model = DashInferModel(str(tmp_path / "out"), "tiny")
    logits_match_transformers((name, model, hf))
    return model, hf


def _gemma3_4x_spelling(scaling):
    """config.json as Google's Gemma 3 checkpoints ship it (transformers 4.x's spelling): the global
    layers' RoPE base (and from 4B up their scaling) at the top level, the sliding layers' base in
    rope_local_base_freq, the layer pattern in sliding_window_pattern."""
    def edit(config):
        for key in ("rope_parameters", "layer_types"):
            config.pop(key)
        return dict(config, rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=scaling,
                    sliding_window_pattern=6)
    return edit


# config.json edits of a 6-layer Gemma 3 (five sliding layers, then a global one) that transformers
# reads its own way
GEMMA3_CONFIGS = {
    "4.x-rope": _gemma3_4x_spelling(None),
    "4.x-rope-linear": _gemma3_4x_spelling({"rope_type": "linear", "factor": 8.0}),
    # Gemma3Attention never passes it to its attention function: the scores stay uncapped
    "attn_logit_softcapping": lambda config: dict(config, attn_logit_softcapping=2.0),
    # a window wider than the context masks nothing, but the sliding layers keep their RoPE base
    "window-wider-than-context": lambda config: dict(config, sliding_window=1024),
    # Gemma3TextConfig's window (4096, wider than the context): the sliding layers keep their base
    "sliding_window left out": lambda config: {k: v for k, v in config.items() if k != "sliding_window"},
}


@pytest.mark.parametrize("name", GEMMA3_CONFIGS)
def test_gemma3_configs_read_as_transformers_reads_them(tmp_path, tiny_checkpoint, name):
    served_as_transformers(tmp_path, tiny_checkpoint("gemma3", num_hidden_layers=6, layer_types=None),
                           GEMMA3_CONFIGS[name], f"gemma3 {name}")


# config.json edits of a 4-layer OLMo 3 that transformers reads its own way: 4.x's spelling (a
# top-level rope_theta and rope_scaling are the full layers'; the sliding layers keep the class's
# default base, 500000), and the default layer pattern (three sliding layers, then a full one)
OLMO3_CONFIGS = {
    "4.x-rope-yarn": lambda config: dict({k: v for k, v in config.items() if k != "rope_parameters"},
                                         rope_theta=1000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                          "original_max_position_embeddings": 128}),
    "layer_types left out": lambda config: {k: v for k, v in config.items() if k != "layer_types"},
}


@pytest.mark.parametrize("name", OLMO3_CONFIGS)
def test_olmo3_configs_read_as_transformers_reads_them(tmp_path, tiny_checkpoint, name):
    _, hf = served_as_transformers(tmp_path, tiny_checkpoint("olmo3", num_hidden_layers=4, layer_types=None),
                                   OLMO3_CONFIGS[name], f"olmo3 {name}")
    assert hf.config.rope_parameters["sliding_attention"]["rope_theta"] == (500000.0 if "4.x" in name else 100.0)


# EXAONE 4.0 without a window (the 1.2B's config): every layer full and rotated; and a hybrid's
# pattern as a string, which its config writes beside layer_types
EXAONE4_CONFIGS = {
    "no window": lambda config: dict(config, sliding_window=None, sliding_window_pattern=0,
                                     layer_types=["full_attention"] * config["num_hidden_layers"]),
    "pattern LLLG": lambda config: dict(config, sliding_window_pattern="LLLG"),
}


@pytest.mark.parametrize("name", EXAONE4_CONFIGS)
def test_exaone4_configs_read_as_transformers_reads_them(tmp_path, tiny_checkpoint, name):
    hybrid = tiny_checkpoint("exaone4", num_hidden_layers=4, sliding_window_pattern=4)
    model, _ = served_as_transformers(tmp_path, hybrid, EXAONE4_CONFIGS[name], f"exaone4 {name}")
    assert model.config.nope_layers == (None if name == "no window" else [3])


@pytest.mark.parametrize("name", ["llama", "smollm3"])
def test_pretraining_tp_changes_nothing(tmp_path, tiny_checkpoint, name):
    """pretraining_tp 2 (SmolLM3-3B's config.json says it) was refused: transformers 4.x cut the same
    products into slices, 5.x ignores it; the logits are transformers' either way."""
    _, hf = served_as_transformers(tmp_path, tiny_checkpoint(name), lambda config: dict(config, pretraining_tp=2),
                                   f"{name} pretraining_tp 2")
    assert hf.config.pretraining_tp == 2


# Granite 4.0 configs: transformers 4's spelling of the layer kinds, and no position embedding at all
GRANITE4_CONFIGS = {
    "layers_block_type": lambda config: dict({k: v for k, v in config.items() if k != "layer_types"},
                                             layers_block_type=["attention"] * config["num_hidden_layers"]),
    "no position embedding": lambda config: dict(config, position_embedding_type=None),
}


@pytest.mark.parametrize("name", GRANITE4_CONFIGS)
def test_granite4_configs_read_as_transformers_reads_them(tmp_path, tiny_checkpoint, name):
    model, _ = served_as_transformers(tmp_path, tiny_checkpoint("granite4"), GRANITE4_CONFIGS[name], f"granite4 {name}")
    assert model.config.nope_layers == ([0, 1] if name == "no position embedding" else None)


@pytest.mark.parametrize("edit, refused", [
    (lambda c: dict(c, layer_types=["full_attention", "linear_attention"]), "Mamba layers"),
    (lambda c: dict(c, num_local_experts=4), "num_local_experts=4"),
])
def test_granite4_hybrids_and_experts_are_refused_by_name(tmp_path, tiny_checkpoint, edit, refused):
    src = tmp_path / "hf"
    shutil.copytree(tiny_checkpoint("granite4"), src)
    write_config_variant(str(src), edit)
    with pytest.raises(ModelSerializerException, match=f"GraniteMoeHybridForCausalLM with .*{refused}"):
        HuggingFaceModel(str(src), "m").read_model_config()
