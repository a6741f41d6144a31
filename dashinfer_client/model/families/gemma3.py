"""Gemma 3 (text): Gemma 2's layer with RMSNorms over each head of q and k, five sliding-window
layers to one global, and a RoPE base of their own for the sliding layers (rope_local_base_freq)."""
from ..rope_config import rope_of
from .base import Family
from .gemma2 import GEMMA_NORMS, gemma_common


def _gemma3(hf, r):
    if r.get("use_bidirectional_attention", False):
        r.refuse("use_bidirectional_attention=true (an encoder)")
    pattern = r.get("sliding_window_pattern", 6)
    fields = gemma_common(hf, r, lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention")
    theta, scaling = rope_of(hf, "sliding_attention", default_theta=float(r.get("rope_local_base_freq", 10000.0)))
    if scaling is not None:
        r.refuse(f"RoPE scaling on the sliding layers ({scaling})")
    fields["rope_local_theta"] = theta
    return fields


GEMMA3 = Family("gemma3", ("Gemma3ForCausalLM",), ("gemma3_text",), _gemma3, gguf_arch="gemma3",
                norms=GEMMA_NORMS, norm_offset=1.0, qk_norm="head")
