"""LLaMA 2/3 (SmolLM, TinyLlama, DeepSeek-R1-Distill-Llama, ...) and Mistral: the plain pre-norm
decoder. LLaMA's attention_bias biases q, k, v and o; Mistral has no biases and a sliding window
over every layer when its config names one; Ministral (MinistralForCausalLM) over the layers its
layer_types names. Seed-OSS is LLaMA with q/k/v biases (attention_bias) apart from o's
(attention_out_bias) and its config class's head_dim, 128."""
from .base import Family


def _llama(hf, r):
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias, mlp_bias=bool(r.get("mlp_bias", False)))


def _mistral(hf, r):
    layers = r.need("num_hidden_layers")
    types, window = r.window(r.layer_types(layers, lambda i: "sliding_attention"))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=False,
                layer_types=types, sliding_window=window)


def _seed_oss(hf, r):
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}),
                attention_bias=bool(r.get("attention_bias", True)),
                attention_out_bias=bool(r.get("attention_out_bias", False)), mlp_bias=bool(r.get("mlp_bias", False)))


LLAMA = Family("llama", ("LlamaForCausalLM",), ("llama",), _llama, gguf_arch="llama")
MISTRAL = Family("mistral", ("MistralForCausalLM", "MinistralForCausalLM"), ("mistral", "ministral"), _mistral)
SEED_OSS = Family("seed_oss", ("SeedOssForCausalLM",), ("seed_oss",), _seed_oss,
                  config_defaults={"head_dim": 128})  # SeedOssConfig's
