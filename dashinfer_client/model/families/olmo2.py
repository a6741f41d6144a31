"""OLMo 2: no norm before attention or MLP; instead an RMSNorm on each one's output before the
residual add, and q/k RMSNorms over the whole projection (all heads at once)."""
from .base import Family


def _olmo2(hf, r):
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias,
                attention_out_bias=bias)


OLMO2 = Family("olmo2", ("Olmo2ForCausalLM",), ("olmo2",), _olmo2, qk_norm="whole",
               norms={"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"})
