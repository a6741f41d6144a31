"""Arcee AFM (AFM-4.5B; ArceeForCausalLM): LLaMA's layer with a plain MLP, down(relu(up(x))^2), no
gate (the decoder's gated=0), biases where attention_bias / mlp_bias say."""
from .base import Family
from .llama import llama_fields


def _arcee(hf, r):
    return llama_fields(r, {"relu2": "relu2"})


ARCEE = Family("arcee", ("ArceeForCausalLM",), ("arcee",), _arcee, gated_mlp=False)
