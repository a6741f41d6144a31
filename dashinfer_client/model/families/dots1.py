"""dots.llm1 (rednote-hilab's dots.llm1.base / .inst; Dots1ForCausalLM): Qwen3's attention (per-head
q/k norms; attention_bias biasing o too) with Qwen2's windows (sliding from max_window_layers on,
where a sliding_window is set) over GLM-4.5's router (glm4_moe.py: sigmoid scores, the choice
bias, routed_scaling_factor, an ungated shared MLP, the first first_k_dense_replace layers dense)."""
from .base import Family
from .glm4_moe import SIGMOID_LAYOUT, SIGMOID_VIEWS, read_sigmoid_experts


def _dots1(hf, r):
    layers, first = r.need("num_hidden_layers"), r.get("max_window_layers")
    types, window = r.window(r.layer_types(layers, lambda i: "sliding_attention" if i >= first else "full_attention"))
    bias = bool(r.get("attention_bias", False))
    return dict(read_sigmoid_experts(r, shared_default=None), hidden_act=r.activation("hidden_act", {"silu": "silu"}),
                attention_bias=bias, attention_out_bias=bias, layer_types=types, sliding_window=window)


# Dots1Config's defaults where a released config leaves the key out
DOTS1 = Family("dots1", ("Dots1ForCausalLM",), ("dots1",), _dots1, qk_norm="head", experts=SIGMOID_LAYOUT,
               checkpoint_views=SIGMOID_VIEWS,
               config_defaults={"sliding_window": 4096, "max_window_layers": 62, "first_k_dense_replace": 0})
