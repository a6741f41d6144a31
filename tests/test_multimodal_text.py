"""Vision-language checkpoints served as their text models (dashinfer_client/model/multimodal.py):
tiny random *ForConditionalGeneration models that transformers writes (Gemma 3, Mistral 3, Qwen2.5-VL,
Qwen3-VL and its MoE, LLaVA 1.5 and NeXT, InternVL: a language model of the tests' tiny shape beside a one-layer vision tower), converted, give
transformers' own logits and greedy tokens for text prompts (the vision tower unread); their configs
as the releases spell them (Gemma 3's sparse text_config, Qwen2.5-VL's flat 4.x config with its
mrope rope_scaling) read as transformers reads them."""
import json
import os

import pytest

from dashinfer_client.model import DashInferModel
from tests.helpers import TINY, build_tiny_tokenizer, randomized, serialize
from tests.test_family_configs import served_as_transformers
from tests.test_families import test_logits_match_transformers as logits_match_transformers

IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)
QWEN_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=TINY["hidden_size"])
# (config class, its text config beyond TINY, its vision config)
WRAPPERS = {
    "gemma3": ("Gemma3Config", dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=24,
                                    layer_types=["sliding_attention", "full_attention"]), VISION),
    "mistral3": ("Mistral3Config", dict(head_dim=16, sliding_window=None), dict(VISION, model_type="pixtral", head_dim=16)),
    # Ministral 3's releases: Mistral 3's wrapper over a ministral3 text model (queries scaled past 16)
    "ministral3": ("Mistral3Config", dict(model_type="ministral3", head_dim=16, sliding_window=None, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}),
                   dict(VISION, model_type="pixtral", head_dim=16)),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                             "mrope_section": [2, 3, 3]}),
                   dict(QWEN_VISION, fullatt_block_indexes=[0])),
    "qwen3_vl": ("Qwen3VLConfig", dict(head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                     "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
                 dict(QWEN_VISION, deepstack_visual_indexes=[])),
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", dict(head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                               "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
                     dict(QWEN_VISION, deepstack_visual_indexes=[])),
    # GLM-4.1V / 4.6V-Flash (GLM-4's text model) and GLM-4.5V / 4.6V (GLM-4.5's), M-RoPE over their rotary half
    "glm4v": ("Glm4vConfig", dict(head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 2]}),
              dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=TINY["hidden_size"])),
    "glm4v_moe": ("Glm4vMoeConfig", dict(head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                         n_shared_experts=1, first_k_dense_replace=1, num_hidden_layers=3,
                                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 2]}),
                  dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=TINY["hidden_size"])),
    "llava": ("LlavaConfig", dict(model_type="llama"), dict(VISION, model_type="clip_vision_model", projection_dim=32)),
    "llava_next": ("LlavaNextConfig", dict(model_type="mistral", head_dim=16, sliding_window=None),
                   dict(VISION, model_type="clip_vision_model", projection_dim=32)),
    "internvl": ("InternVLConfig", dict(model_type="qwen2"), dict(VISION, image_size=[28, 28], patch_size=[14, 14])),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> the directory of a tiny random vision-language model transformers wrote."""
    built = {}

    def get(name):
        if name not in built:
            import torch
            import transformers
            class_name, text, vision = WRAPPERS[name]
            torch.manual_seed(0)
            config = getattr(transformers, class_name)(text_config=dict(TINY, **IDS, **text), vision_config=vision, **IDS)
            out = str(tmp_path_factory.mktemp(name) / "hf")
            randomized(transformers.AutoModelForImageTextToText.from_config(config)).eval().save_pretrained(out)
            build_tiny_tokenizer(out)
            built[name] = out
        return built[name]
    return get


def transformers_model(path):
    import torch
    from transformers import AutoModelForImageTextToText
    hf = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    hf.set_attn_implementation("eager")  # the attention function cache_rounding wraps
    return hf


@pytest.mark.parametrize("name", WRAPPERS)
def test_the_text_model_gives_transformers_logits(tmp_path, checkpoint, name):
    src = checkpoint(name)
    with open(os.path.join(src, "config.json")) as f:
        assert json.load(f)["architectures"][0].endswith("ForConditionalGeneration")
    serialize(src, tmp_path).free_model()
    model = DashInferModel(str(tmp_path), "tiny")
    assert not [n for n in model.tensor_names() if "vision" in n or "visual" in n or "projector" in n]
    logits_match_transformers((name, model, transformers_model(src)))


def _gemma3_as_released(config):
    """config.json as Google's gemma-3-4b-it ships it: text_config names only what differs from
    Gemma3TextConfig's defaults (the rest, here RMSNorm's eps, the context, the activation, tying,
    come from them); 4.x's rope keys."""
    text = config["text_config"]
    for key in ("rms_norm_eps", "max_position_embeddings", "hidden_activation", "tie_word_embeddings",
                "rope_parameters"):
        text.pop(key, None)
    text.update(rope_theta=1000000.0, rope_local_base_freq=10000.0)
    return config


def _qwen2_5_vl_as_released(config):
    """config.json as Qwen2.5-VL's 4.49-era releases ship it: the language model's keys at the top
    level beside vision_config, RoPE as rope_scaling {"type": "mrope", "mrope_section"}."""
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    text.pop("model_type")
    return dict(config, **text, rope_theta=rope["rope_theta"],
                rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]})


@pytest.mark.parametrize("name,edit", [("gemma3", _gemma3_as_released), ("qwen2_5_vl", _qwen2_5_vl_as_released)])
def test_configs_as_released_read_as_transformers_reads_them(tmp_path, checkpoint, name, edit, monkeypatch):
    import tests.test_family_configs as configs
    monkeypatch.setattr(configs, "load_hf_model", transformers_model)
    served_as_transformers(tmp_path, checkpoint(name), edit, f"{name} as released")


def test_qwen3_vl_moe_experts_as_released_stacked_in_out(tmp_path, checkpoint, monkeypatch):
    """Qwen3-VL-MoE's releases stack each layer's experts [E, hidden, 2 x inter] and [E, inter, hidden]
    (transposed from transformers 5's), which transformers transposes on load where the shape says so:
    read alike, the same logits."""
    import shutil

    from safetensors.torch import load_file, save_file

    import tests.test_family_configs as configs
    src = tmp_path / "released"
    shutil.copytree(checkpoint("qwen3_vl_moe"), src)
    weights = load_file(str(src / "model.safetensors"))
    stacked = [n for n in weights if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert stacked
    save_file({n: w.transpose(1, 2).contiguous() if n in stacked else w for n, w in weights.items()},
              str(src / "model.safetensors"), metadata={"format": "pt"})
    monkeypatch.setattr(configs, "load_hf_model", transformers_model)
    served_as_transformers(tmp_path, str(src), lambda c: c, "qwen3_vl_moe as released")
