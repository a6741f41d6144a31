"""GLM-4 (GLM-4-9B-0414, GLM-Z1): Gemma 2's four norms of a layer (before and after attention and
the MLP, plain RMSNorm weights), a fused gate_up_proj, q/k/v biases, and RoPE on the first half of
each head (partial_rotary_factor 0.5) over interleaved pairs of dims (2j, 2j + 1), where the
decoder pairs j with j + rotary_dim / 2: the view below reorders q's and k's rows to match."""
import re

import numpy as np

from .base import Family

QK_ROWS = re.compile(r"^model\.layers\.\d+\.self_attn\.[qk]_proj\.(weight|bias)$")


class HalvedRope:
    """A checkpoint's tensors with each head's rotated rows of q and k (weight and bias) reordered
    from GLM's interleaved pairs to the decoder's halves: the even rows, then the odd ones. q and k
    are reordered alike, so every q.k product, and with it the attention, is what it was."""

    def __init__(self, tensors, config):
        self.tensors, self.head_dim = tensors, config.head_dim
        rot = config.rotary_dim or config.head_dim
        self.order = np.concatenate([np.arange(0, rot, 2), np.arange(1, rot, 2), np.arange(rot, config.head_dim)])

    def keys(self):
        return self.tensors.keys()

    def __contains__(self, name):
        return name in self.tensors

    def shape(self, name):
        return self.tensors.shape(name)

    def fetch(self, name, *codes):
        array, code = self.tensors.fetch(name, *codes)
        if QK_ROWS.match(name):
            heads = array.reshape(-1, self.head_dim, *array.shape[1:])
            array = np.ascontiguousarray(heads[:, self.order]).reshape(array.shape)
        return array, code


def _glm4(hf, r):
    bias = bool(r.get("attention_bias", True))
    return dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=bias, attention_out_bias=False)


GLM4 = Family("glm4", ("Glm4ForCausalLM",), ("glm4", "glm4v_text"), _glm4, fused_gate_up=True, checkpoint_views=(HalvedRope,),
              norms={"attn_in": "input_layernorm", "attn_out": "post_self_attn_layernorm",
                     "mlp_in": "post_attention_layernorm", "mlp_out": "post_mlp_layernorm"},
              config_defaults={"head_dim": 128, "partial_rotary_factor": 0.5})  # Glm4Config's
