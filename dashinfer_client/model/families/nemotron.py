"""NVIDIA Nemotron (Nemotron-Mini-4B, Minitron 4B / 8B; NemotronForCausalLM): LLaMA's layer with
LayerNorm1P norms (a LayerNorm of weight 1 + w, with a bias), RoPE on part of each head
(partial_rotary_factor), and a plain MLP, down(relu(up(x))^2)."""
from .base import Family
from .llama import llama_fields


def _nemotron(hf, r):
    return llama_fields(r, {"relu2": "relu2"})


NEMOTRON = Family("nemotron", ("NemotronForCausalLM",), ("nemotron",), _nemotron, gguf_arch="nemotron", gated_mlp=False,
                  layer_norm=True, norm_bias=True, norm_offset=1.0, norm_eps_key="norm_eps",
                  config_defaults={"partial_rotary_factor": 0.5})  # NemotronConfig's
