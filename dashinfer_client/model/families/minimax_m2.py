"""MiniMax-M2 / M2.1 (MiniMaxM2ForCausalLM): LLaMA's pre-norm layer with RMSNorms over the whole q
and k projections (OLMo 2's), RoPE on the first rotary_dim dims of each head (the released configs'
key; partial_rotary_factor where a config has it), and in every layer a mixture of
num_local_experts experts of intermediate_size stored as Mixtral's (block_sparse_moe, w1 / w3 /
w2), routed as GLM-4.5 (each expert's sigmoid score, chosen with e_score_correction_bias, the
chosen scores renormalised) without a shared expert. A model in memory holds the choice bias under
mlp (transformers 5's name), its checkpoints under block_sparse_moe."""
from .base import Family
from .experts import ExpertLayout, read_experts
from .fused_experts import stacked_experts
from .renamed import Renamed

_LAYOUT = ExpertLayout(block="block_sparse_moe", gate="w1", up="w3", down="w2", shared_gate=None,
                       choice_bias="e_score_correction_bias")
_IN_MEMORY = {r"(model\.layers\.\d+\.)mlp\.e_score_correction_bias": r"\1block_sparse_moe.e_score_correction_bias"}


def _minimax_m2(hf, r):
    kinds = r.get("attn_type_list")
    if kinds is not None and set(kinds) - {1}:
        r.refuse(f"attn_type_list with {sorted(set(kinds) - {1})} (MiniMax's linear attention layers)")
    fields = dict(hidden_act=r.activation("hidden_act", {"silu": "silu"}), attention_bias=False,
                  expert_scoring="sigmoid", **read_experts(r, inter_key="intermediate_size", norm_topk=True))
    params = hf.get("rope_parameters") or {}
    rotary = r.get("rotary_dim")
    if rotary is not None and "partial_rotary_factor" not in params and "partial_rotary_factor" not in hf:
        head_dim = hf.get("head_dim") or r.need("hidden_size") // r.need("num_attention_heads")
        fields["rotary_dim"] = rotary if rotary != head_dim else None  # transformers: its factor
    return fields


MINIMAX_M2 = Family("minimax_m2", ("MiniMaxM2ForCausalLM",), ("minimax_m2",), _minimax_m2, qk_norm="whole",
                    experts=_LAYOUT, gguf_arch="minimax-m2", checkpoint_views=(lambda tensors, config: Renamed(tensors, _IN_MEMORY),
                                                       stacked_experts(_LAYOUT)),
                    config_defaults={"rope_theta": 5000000.0, "head_dim": 128})
