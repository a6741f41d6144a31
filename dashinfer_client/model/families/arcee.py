"""Arcee AFM (AFM-4.5B; ArceeForCausalLM): LLaMA's layer with a plain MLP, down(relu(up(x))^2), no
gate (the decoder's gated=0), biases where attention_bias / mlp_bias say."""
from .base import Family


def _arcee(hf, r):
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"relu2": "relu2"}), attention_bias=bias, attention_out_bias=bias,
                mlp_bias=bool(r.get("mlp_bias", False)))


ARCEE = Family("arcee", ("ArceeForCausalLM",), ("arcee",), _arcee, gated_mlp=False)
