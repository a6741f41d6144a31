"""Qwen1.5 / Qwen2 / Qwen2.5 (and DeepSeek-R1-Distill-Qwen): LLaMA with q/k/v biases (o has none);
with use_sliding_window, the layers from max_window_layers on attend through a window."""
from .base import Family


def qwen_window(hf, r):
    """layer_types and sliding_window as Qwen2/Qwen3 configs give them (transformers' rule: sliding
    from max_window_layers on, only with use_sliding_window)."""
    if not r.get("use_sliding_window", False):
        return dict(layer_types=None, sliding_window=None)
    layers, first = r.need("num_hidden_layers"), r.get("max_window_layers", 0)
    types, window = r.window(r.layer_types(layers, lambda i: "sliding_attention" if i >= first else "full_attention"))
    return dict(layer_types=types, sliding_window=window)


def _qwen2(hf, r):
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=True,
                **qwen_window(hf, r))


# the language models of Qwen2-VL and Qwen2.5-VL (multimodal.py) are Qwen2's
QWEN2 = Family("qwen2", ("Qwen2ForCausalLM",), ("qwen2", "qwen2_vl_text", "qwen2_5_vl_text"), _qwen2, gguf_arch="qwen2")
