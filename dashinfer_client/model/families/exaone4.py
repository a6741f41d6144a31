"""EXAONE 4.0: OLMo 2's norms (after attention and MLP, none before) with Qwen3's per-head q/k norms;
the hybrid models (a sliding_window set) window their sliding layers (`layer_types`, or the
`sliding_window_pattern`: an int n, every n-th layer full; or a string such as "LLLG") and give
their full layers no positional encoding (NoPE), as Exaone4Attention rotates the sliding layers
alone."""
from .base import Family


def _exaone4(hf, r):
    layers = r.need("num_hidden_layers")
    if r.get("sliding_window") is None:  # every layer full, with RoPE
        return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=False)
    pattern = r.get("sliding_window_pattern", 4)
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        default = lambda i: "sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention"  # noqa: E731
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        default = lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention"  # noqa: E731
    else:
        r.refuse(f"sliding_window_pattern={pattern!r}")
    types = r.layer_types(layers, default)
    nope = [i for i, t in enumerate(types) if t == "full_attention"]
    types, window = r.window(types)
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=False,
                nope_layers=nope or None, layer_types=types, sliding_window=window)


EXAONE4 = Family("exaone4", ("Exaone4ForCausalLM",), ("exaone4",), _exaone4, qk_norm="head",
                 norms={"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"},
                 config_defaults={"sliding_window": 4096, "sliding_window_pattern": 4})  # Exaone4Config's
