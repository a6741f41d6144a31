"""Kyutai's Helium: LLaMA's layer (q/k/v biased where attention_bias says, o never) with RoPE over
interleaved pairs of each head's dims, as GLM's (glm4.py's view reorders q and k)."""
from .base import Family
from .glm4 import HalvedRope


def _helium(hf, r):
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}),
                attention_bias=bool(r.get("attention_bias", False)), attention_out_bias=False,
                mlp_bias=bool(r.get("mlp_bias", False)))


HELIUM = Family("helium", ("HeliumForCausalLM",), ("helium",), _helium, checkpoint_views=(HalvedRope,),
                config_defaults={"head_dim": 128, "rope_theta": 100000.0})  # HeliumConfig's
