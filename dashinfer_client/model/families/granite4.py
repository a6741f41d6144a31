"""IBM Granite 4.0's dense models (granite-4.0-micro; GraniteMoeHybridForCausalLM with attention
layers only and no experts): Granite 3's four scalars over a layer whose MLP is `shared_mlp`
(input_linear: gate rows, then up rows; output_linear), shared_intermediate_size wide, and RoPE
only with position_embedding_type "rope" (else no positional encoding at all). The hybrid models'
Mamba layers and the mixtures of experts are refused by name."""
from .base import Family
from .granite import GRANITE
from .renamed import Renamed

_ATTENTION = {"attention", "full_attention"}
# the shared MLP under the fused MLP's names
_RENAMES = {r"(model\.layers\.\d+\.)shared_mlp\.input_linear\.weight": r"\1mlp.gate_up_proj.weight",
            r"(model\.layers\.\d+\.)shared_mlp\.output_linear\.weight": r"\1mlp.down_proj.weight"}


def _granite4(hf, r):
    layers = r.need("num_hidden_layers")
    # transformers 4's layers_block_type ("attention", "mamba"), 5's layer_types ("full_attention",
    # "linear_attention"); without either, every layer is Mamba
    kinds = r.get("layer_types") or r.get("layers_block_type") or ["linear_attention"] * layers
    if any(k not in _ATTENTION for k in kinds):
        r.refuse(f"layer_types {sorted(set(kinds) - _ATTENTION)} (Mamba layers: only attention ones are served)")
    experts = r.get("num_local_experts", 8)  # GraniteMoeHybridConfig's default
    if experts:
        r.refuse(f"num_local_experts={experts} (a mixture of experts beside the shared MLP)")
    position = r.get("position_embedding_type")
    if position not in (None, "rope", "nope"):
        r.refuse(f"position_embedding_type={position!r}")
    fields = GRANITE.read_config(hf, r)
    fields.update(intermediate_size=r.need("shared_intermediate_size"),
                  nope_layers=list(range(layers)) if position != "rope" else None)
    return fields


GRANITE4 = Family("granite4", ("GraniteMoeHybridForCausalLM",), ("granitemoehybrid",), _granite4,
                  fused_gate_up=True, checkpoint_views=(lambda tensors, config: Renamed(tensors, _RENAMES),))
