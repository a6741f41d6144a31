"""NVIDIA Nemotron (Nemotron-Mini-4B, Minitron 4B / 8B; NemotronForCausalLM): LLaMA's layer with
LayerNorm1P norms (a LayerNorm of weight 1 + w, with a bias), RoPE on part of each head
(partial_rotary_factor), and a plain MLP, down(relu(up(x))^2)."""
from .base import Family


def _nemotron(hf, r):
    bias = bool(r.get("attention_bias", False))
    return dict(hidden_act=r.activation("hidden_act", {"relu2": "relu2"}), attention_bias=bias, attention_out_bias=bias,
                mlp_bias=bool(r.get("mlp_bias", False)))


NEMOTRON = Family("nemotron", ("NemotronForCausalLM",), ("nemotron",), _nemotron, gated_mlp=False, layer_norm=True,
                  gguf_arch="nemotron",
                  norm_bias=True, norm_offset=1.0, norm_eps_key="norm_eps",
                  config_defaults={"partial_rotary_factor": 0.5})  # NemotronConfig's
