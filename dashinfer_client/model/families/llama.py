"""LLaMA 2/3 (SmolLM, TinyLlama, DeepSeek-R1-Distill-Llama, ...) and Mistral: the plain pre-norm
decoder. LLaMA's attention_bias biases q, k, v and o; Mistral has no biases and a sliding window
over every layer when its config names one; Ministral (MinistralForCausalLM) over the layers its
layer_types names; Ministral 3 with its queries scaled past the original context (llama-4's). Seed-OSS is LLaMA with q/k/v biases (attention_bias) apart from o's
(attention_out_bias) and its config class's head_dim, 128."""
from .base import Family


def llama_fields(r, activations=None):
    """LLaMA's layer from config.json: hidden_act of `activations` (SiLU), attention_bias biasing q, k,
    v and o, mlp_bias the MLP (Granite's, Arcee's and Nemotron's layers read alike)."""
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", activations or {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias, mlp_bias=bool(r.get("mlp_bias", False)))


def _llama(hf, r):
    return llama_fields(r)


def _mistral(hf, r):
    layers = r.need("num_hidden_layers")
    types, window = r.window(r.layer_types(layers, lambda i: "sliding_attention"))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=False,
                layer_types=types, sliding_window=window)


def _ministral3(hf, r):
    """Mistral's layer (Ministral 3, Mistral Small's text model since Ministral 3) and, after RoPE, each
    query scaled by llama_4_scaling_beta over the original context: 1 below it."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    beta = params.get("llama_4_scaling_beta")
    fields = _mistral(hf, r)
    if beta:
        fields.update(query_scale_beta=float(beta), query_scale_period=int(params["original_max_position_embeddings"]))
    return fields


def _seed_oss(hf, r):
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}),
                attention_bias=bool(r.get("attention_bias", True)),
                attention_out_bias=bool(r.get("attention_out_bias", False)), mlp_bias=bool(r.get("mlp_bias", False)))


LLAMA = Family("llama", ("LlamaForCausalLM",), ("llama",), _llama, gguf_arch="llama")
MISTRAL = Family("mistral", ("MistralForCausalLM", "MinistralForCausalLM"), ("mistral", "ministral"), _mistral)
# Ministral3Config's RoPE where config.json names none
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 16384,
                   "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}
MINISTRAL3 = Family("ministral3", ("Ministral3ForCausalLM",), ("ministral3",), _ministral3,
                    config_defaults={"rope_parameters": MINISTRAL3_ROPE})
SEED_OSS = Family("seed_oss", ("SeedOssForCausalLM",), ("seed_oss",), _seed_oss,
                  config_defaults={"head_dim": 128})  # SeedOssConfig's
