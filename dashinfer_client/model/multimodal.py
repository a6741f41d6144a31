"""Checkpoints of vision-language models served as their text models: Gemma 3 from 4B up, Mistral
Small 3.1 / 3.2 and Magistral, Qwen2-VL, Qwen2.5-VL, Qwen3-VL (and its MoE: its releases' experts
stacked [E, in, out], which fused_experts.py reads by their shape), LLaVA (1.5, NeXT, OneVision),
InternVL (transformers' own format: InternVLForConditionalGeneration), GLM-4.1V / 4.6V-Flash and
GLM-4.5V / 4.6V ship as *ForConditionalGeneration with the language model's config in text_config
(Qwen2(.5)-VL's older releases: flat, beside vision_config) and its tensors under
language_model.model / model.language_model (Qwen2(.5)-VL: model.*). For text prompts that language model is all transformers runs: the vision tower and
projector are left unread, and the text family converts as it would its own checkpoint.

M-RoPE (the Qwen-VL models' positions per time / height / width section) gives every section the
same position for text tokens, so it is plain RoPE there: mrope_section and mrope_interleaved are
dropped, and 4.x's rope type "mrope" reads as the default."""
import re

from .families.renamed import Renamed, Without

# wrapper architecture -> the text config's model_type where its text_config may not say it
WRAPPERS = {"Gemma3ForConditionalGeneration": "gemma3_text", "Mistral3ForConditionalGeneration": "mistral",
            "Qwen2VLForConditionalGeneration": "qwen2_vl_text", "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl_text",
            "Qwen3VLForConditionalGeneration": "qwen3_vl_text", "LlavaForConditionalGeneration": "llama",
            "LlavaNextForConditionalGeneration": "llama", "LlavaOnevisionForConditionalGeneration": "qwen2",
            "InternVLForConditionalGeneration": "qwen2", "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe_text",
            "Glm4vForConditionalGeneration": "glm4v_text", "Glm4vMoeForConditionalGeneration": "glm4v_moe_text"}
# what a wrapper's language model computes whatever its text_config says (Qwen3-VL-MoE's router always
# renormalises its top k)
FIXED = {"Qwen3VLMoeForConditionalGeneration": {"norm_topk_prob": True}}
# keys a released text_config leaves to the top level of config.json
_TOP_LEVEL = ("tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype")
_TEXT = {r"^(?:language_model\.model|model\.language_model)\.(.*)$": r"model.\1",
         r"^language_model\.lm_head\.(.*)$": r"lm_head.\1"}
_VISION = re.compile(r"^(?:model\.)?(?:vision_tower\.|vision_model\.|visual\.|multi_modal_projector\.|mm_projector\."
                     r"|image_newline$)")  # image_newline: LLaVA-NeXT's separator embedding
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def wrapper_of(hf):
    """The vision-language wrapper class config.json names, or None."""
    return next((a for a in hf.get("architectures") or [] if a in WRAPPERS), None)


def text_config(hf):
    """config.json of a vision-language checkpoint -> its language model's config.json, as its text
    family reads one (named by model_type: the family's own class is not the wrapper)."""
    wrapper = wrapper_of(hf)
    nested = hf.get("text_config")
    text = dict(nested) if isinstance(nested, dict) else {k: v for k, v in hf.items() if k != "vision_config"}
    for key in _TOP_LEVEL:
        if key not in text and key in hf:
            text[key] = hf[key]
    text.pop("architectures", None)
    text["model_type"] = text.get("model_type") if isinstance(nested, dict) and text.get("model_type") \
        else WRAPPERS[wrapper]
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(text.get(key), dict):
            text[key] = _without_mrope(text[key])
    return dict(text, **FIXED.get(wrapper, {}))


def _without_mrope(params):
    params = {k: v for k, v in params.items() if k not in _MROPE_KEYS}
    if params.get("type") == "mrope" or params.get("rope_type") == "mrope":
        params.pop("type", None)
        params["rope_type"] = "default"
    return params


def text_tensors(tensors, config=None):
    """The checkpoint's language-model tensors under a text model's names; the vision ones hidden."""
    return Without(Renamed(tensors, _TEXT), lambda name: bool(_VISION.match(name)))
