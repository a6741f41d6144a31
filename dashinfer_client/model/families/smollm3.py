"""SmolLM3: LLaMA's decoder where every no_rope_layer_interval-th layer (the 4th, 8th, ...) applies
no positional encoding (NoPE: `no_rope_layers`, 1 for a layer that rotates), and with
use_sliding_window a window on those NoPE layers (layer_types). Its config class defaults differ
from LLaMA's: rope_theta 2e6, tied embeddings."""
from .base import Family


def _smollm3(hf, r):
    layers = r.need("num_hidden_layers")
    interval = r.get("no_rope_layer_interval", 4)
    rotates = r.get("no_rope_layers")
    if rotates is None:  # transformers' default: every interval-th layer is NoPE
        rotates = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(rotates, list) or len(rotates) != layers or any(v not in (0, 1) for v in rotates):
        r.refuse(f"no_rope_layers={rotates!r} (0 or 1 for each of {layers} layers)")
    nope = [i for i, v in enumerate(rotates) if not v]
    types = r.layer_types(layers, lambda i: "sliding_attention" if i in nope and r.get("sliding_window") is not None
                          else "full_attention")
    # a layer_types entry only counts with use_sliding_window, as SmolLM3Attention reads it
    types, window = r.window(types) if r.get("use_sliding_window", False) else (None, None)
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias, mlp_bias=bool(r.get("mlp_bias", False)), nope_layers=nope or None,
                layer_types=types, sliding_window=window)


SMOLLM3 = Family("smollm3", ("SmolLM3ForCausalLM",), ("smollm3",), _smollm3, gguf_arch="smollm3",
                 config_defaults={"rope_theta": 2000000.0, "tie_word_embeddings": True})
