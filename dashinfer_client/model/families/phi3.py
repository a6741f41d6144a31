"""Phi-3 / Phi-3.5 / Phi-4: LLaMA with q, k, v fused into one qkv_proj and gate, up into one
gate_up_proj (both kept fused on disk; each rank reads its rows of them), a sliding window over
every layer where the config names one, longrope scaling and partial rotary (Phi-4-mini)."""
from .base import Family


def _phi3(hf, r):
    layers = r.need("num_hidden_layers")
    types, window = r.window(r.layer_types(layers, lambda i: "sliding_attention"))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=False,
                layer_types=types, sliding_window=window)


PHI3 = Family("phi3", ("Phi3ForCausalLM",), ("phi3",), _phi3, gguf_arch="phi3", fused_qkv=True,
              fused_gate_up=True, gguf_names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"})
