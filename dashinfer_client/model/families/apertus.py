"""Apertus (swiss-ai's 8B and 70B; ApertusForCausalLM): LLaMA's layer with per-head q/k RMSNorms, its
norms named attention_layernorm / feedforward_layernorm, and a plain MLP, down(xIELU(up(x))), whose
activation has learned scalars per layer (mlp.act_fn.alpha_p / alpha_n, and beta / eps):
x > 0: alpha_p x^2 + beta x, else (expm1(min(x, eps)) - x) alpha_n + beta x, the alphas softplus'd."""
from .base import Family


def _apertus(hf, r):
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"xielu": "xielu", "relu2": "relu2"}), attention_bias=bias,
                attention_out_bias=bias)


APERTUS = Family("apertus", ("ApertusForCausalLM",), ("apertus",), _apertus, gated_mlp=False, qk_norm="head",
                 norms={"attn_in": "attention_layernorm", "mlp_in": "feedforward_layernorm"},
                 config_defaults={"hidden_act": "xielu"})  # ApertusConfig's
