"""StarCoder2 (3B, 7B, 15B; Starcoder2ForCausalLM): LayerNorms with biases, every projection biased
(use_bias), a plain MLP, c_proj(gelu_tanh(c_fc(x))) (shown under up_proj / down_proj), a window over
every layer when sliding_window is set, tied embeddings."""
from .base import Family
from .renamed import Renamed

_RENAMES = {r"(model\.layers\.\d+\.mlp\.)c_fc\.(weight|bias)": r"\1up_proj.\2",
            r"(model\.layers\.\d+\.mlp\.)c_proj\.(weight|bias)": r"\1down_proj.\2"}


def _starcoder2(hf, r):
    layers = r.need("num_hidden_layers")
    types, window = r.window(r.layer_types(layers, lambda i: "sliding_attention"))
    bias = bool(r.get("use_bias", True))
    return dict(hidden_act=r.activation("hidden_act", {"gelu_pytorch_tanh": "gelu_tanh"}), attention_bias=bias,
                attention_out_bias=bias, mlp_bias=bias, layer_types=types, sliding_window=window)


STARCODER2 = Family("starcoder2", ("Starcoder2ForCausalLM",), ("starcoder2",), _starcoder2, gguf_arch="starcoder2",
                    gated_mlp=False, layer_norm=True, norm_bias=True, norm_eps_key="norm_epsilon",
                    checkpoint_views=(lambda tensors, config: Renamed(tensors, _RENAMES),),
                    config_defaults={"tie_word_embeddings": True, "sliding_window": None})  # Starcoder2Config's
