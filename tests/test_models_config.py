"""Hugging Face configs as read at conversion: RoPE spellings and scalings, head_dim, architectures,
and the refusals of configs and checkpoints that do not fit."""
import os

import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, HuggingFaceModel
from tests.helpers import serialize, variant

# -- configs written by transformers 4.x and 5.x -------------------------------------------------

LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
ROPE_VARIANTS = {
    "5.x-default": ({"rope_parameters": {"rope_type": "default", "rope_theta": 12345.0}}, 12345.0, None),
    "5.x-linear": ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0}},
                   1e6, {"rope_type": "linear", "factor": 4.0}),
    "5.x-llama3": ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3}},
                   5e5, {"rope_type": "llama3", **LLAMA3}),
    "4.x-plain": ({"rope_theta": 100000.0}, 100000.0, None),
    "4.x-linear-type": ({"rope_theta": 20000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
                        20000.0, {"rope_type": "linear", "factor": 2.0}),
    "4.x-llama3-rope_type": ({"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **LLAMA3}},
                             5e5, {"rope_type": "llama3", **LLAMA3}),
    "4.x-no-theta": ({}, 10000.0, None),
}


def _rope_edit(fields):
    def edit(cfg):
        for key in ("rope_parameters", "rope_theta", "rope_scaling"):
            cfg.pop(key, None)
        cfg.update(fields)
        return cfg
    return edit


@pytest.mark.parametrize("name", list(ROPE_VARIANTS))
def test_rope_spellings(llama_dir, tmp_path, name):
    from transformers import AutoConfig
    fields, theta, scaling = ROPE_VARIANTS[name]
    model_dir = variant(llama_dir, tmp_path, _rope_edit(fields))
    c = HuggingFaceModel(model_dir, "tiny").read_model_config().config
    assert c.rope_theta == theta
    assert c.rope_scaling == scaling
    # transformers reads the same file the same way
    params = AutoConfig.from_pretrained(model_dir).rope_parameters
    assert params["rope_theta"] == theta
    assert params["rope_type"] == (scaling or {"rope_type": "default"})["rope_type"]
    for key, value in (scaling or {}).items():
        assert params[key] == value


def test_rope_scaling_serialized(llama_dir, tmp_path):
    model_dir = variant(llama_dir, tmp_path, _rope_edit(ROPE_VARIANTS["4.x-llama3-rope_type"][0]))
    serialize(model_dir, tmp_path / "out")
    c = DashInferModel(str(tmp_path / "out"), "tiny").config
    assert c.rope_theta == 5e5 and c.rope_scaling == {"rope_type": "llama3", **LLAMA3}


@pytest.mark.parametrize("scaling", [{"type": "dynamic", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0}])
def test_unsupported_rope_scaling_refused(llama_dir, tmp_path, scaling):
    model_dir = variant(llama_dir, tmp_path, _rope_edit({"rope_theta": 1e4, "rope_scaling": scaling}))
    with pytest.raises(ModelSerializerException, match="RoPE scaling type '(dynamic|yarn)' is not supported"):
        HuggingFaceModel(model_dir, "tiny").read_model_config()


def test_llama3_scaling_missing_key_refused(llama_dir, tmp_path):
    broken = {k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}
    model_dir = variant(llama_dir, tmp_path, _rope_edit({"rope_parameters": {"rope_type": "llama3", **broken}}))
    with pytest.raises(ModelSerializerException, match="llama3 RoPE scaling lacks low_freq_factor"):
        HuggingFaceModel(model_dir, "tiny").read_model_config()


def test_head_dim_explicit_or_derived(llama_dir, tmp_path):
    def edit(cfg):
        cfg["head_dim"] = 32
        return cfg
    assert HuggingFaceModel(variant(llama_dir, tmp_path / "a", edit), "t").read_model_config().config.head_dim == 32

    def drop(cfg):
        cfg.pop("head_dim", None)
        return cfg
    assert HuggingFaceModel(variant(llama_dir, tmp_path / "b", drop), "t").read_model_config().config.head_dim == 16


def test_mistral_window(llama_dir, tmp_path):
    def mistral(window):
        def edit(cfg):
            cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=window)
            return cfg
        return edit
    for window in (None, 512, 4096):  # none, or no narrower than the context: no window
        loader = HuggingFaceModel(variant(llama_dir, tmp_path / f"w{window}", mistral(window)), "m").read_model_config()
        assert loader.architecture == "mistral"
        assert (loader.config.layer_types, loader.config.sliding_window) == (None, None)
    with pytest.raises(ModelSerializerException, match="sliding_window is not supported yet"):
        HuggingFaceModel(variant(llama_dir, tmp_path / "bad", mistral(128)), "m").read_model_config()


# -- bad inputs -----------------------------------------------------------------------------------

def test_missing_config_json(llama_dir, tmp_path):
    model_dir = variant(llama_dir, tmp_path, lambda c: c)
    os.remove(os.path.join(model_dir, "config.json"))
    with pytest.raises(ModelSerializerException, match=r"config.json is missing: .*variant/config.json"):
        HuggingFaceModel(model_dir, "tiny").load_model()


def test_missing_model_dir(tmp_path):
    with pytest.raises(ModelSerializerException, match="model directory .*nowhere does not exist"):
        HuggingFaceModel(str(tmp_path / "nowhere"), "tiny").load_model()


def test_unknown_architecture(llama_dir, tmp_path):
    def edit(cfg):
        cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
        return cfg
    with pytest.raises(ModelSerializerException, match="unsupported architecture GPT2LMHeadModel"):
        HuggingFaceModel(variant(llama_dir, tmp_path, edit), "tiny").read_model_config()


def test_missing_config_key(llama_dir, tmp_path):
    def edit(cfg):
        del cfg["intermediate_size"]
        return cfg
    with pytest.raises(ModelSerializerException, match="lacks the required key 'intermediate_size'"):
        HuggingFaceModel(variant(llama_dir, tmp_path, edit), "tiny").read_model_config()


def test_checkpoint_shape_mismatch_with_config(llama_dir, tmp_path):
    def edit(cfg):
        cfg["intermediate_size"] = 96
        return cfg
    with pytest.raises(ModelSerializerException,
                       match=r"tensor 'model.layers.0.mlp.gate_proj.weight' in .* has shape \[128, 64\], "
                             r"the config implies \[96, 64\]"):
        HuggingFaceModel(variant(llama_dir, tmp_path, edit), "tiny").load_model()


def test_checkpoint_missing_tensor(llama_dir, tmp_path):
    def edit(cfg):
        cfg["num_hidden_layers"] = 3
        return cfg
    with pytest.raises(ModelSerializerException, match=r"lacks tensor\(s\) model.layers.2.input_layernorm.weight"):
        HuggingFaceModel(variant(llama_dir, tmp_path, edit), "tiny").load_model()


def test_no_weights(llama_dir, tmp_path):
    model_dir = variant(llama_dir, tmp_path, lambda c: c)
    os.remove(os.path.join(model_dir, "model.safetensors"))
    with pytest.raises(ModelSerializerException, match="no weights in .*expected model.safetensors"):
        HuggingFaceModel(model_dir, "tiny").load_model()


def test_bad_data_type_and_quant_options(llama_dir):
    with pytest.raises(ModelSerializerException, match="user_set_data_type 'int8' is not supported"):
        HuggingFaceModel(llama_dir, "tiny", user_set_data_type="int8")
    loader = HuggingFaceModel(llama_dir, "tiny", progress=False).load_model()
    with pytest.raises(ModelSerializerException, match="activation quantization"):
        loader.serialize_to_path(None, "/nonexistent-never-written", enable_quant=True)
    with pytest.raises(ModelSerializerException, match="weight_format 'fp8_e4m3' is not supported"):
        loader.serialize_to_path(None, "/nonexistent-never-written", enable_quant=True,
                                 customized_quant_config={"quant_method": "instant_quant", "weight_format": "fp8_e4m3"})
    with pytest.raises(ModelSerializerException, match="not supported by this runtime: lora_cfg"):
        loader.serialize_to_path(None, "/nonexistent-never-written", lora_cfg={"x": 1})
    with pytest.raises(ModelSerializerException, match="load_format='pt': expected pytorch_model.bin"):
        HuggingFaceModel(llama_dir, "tiny").load_model(load_format="pt")  # a safetensors checkpoint
