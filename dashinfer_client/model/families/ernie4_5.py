"""ERNIE 4.5 (the dense 0.3B): LLaMA's layer, `use_bias` biasing every projection, tied embeddings,
and RoPE over interleaved pairs of each head's dims as GLM's (glm4.py's view reorders q and k)."""
from .base import Family
from .glm4 import HalvedRope


def _ernie4_5(hf, r):
    bias = bool(r.get("use_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias, mlp_bias=bias)


ERNIE4_5 = Family("ernie4_5", ("Ernie4_5ForCausalLM",), ("ernie4_5",), _ernie4_5, checkpoint_views=(HalvedRope,),
                  gguf_arch="ernie4_5",
                  config_defaults={"head_dim": 128, "tie_word_embeddings": True, "rope_theta": 500000.0})
