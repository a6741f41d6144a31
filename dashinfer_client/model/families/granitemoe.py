"""IBM Granite 3.x MoE (granite-3.1-1b-a400m, 3b-a800m; GraniteMoeForCausalLM): Granite 3's four
scalars (granite.py) over a mixture of num_local_experts experts of intermediate_size in every
layer, each token's top num_experts_per_tok logits softmaxed (the softmax's top k renormalised).
Its checkpoints stack a layer's experts as transformers 5 does, under other names
(block_sparse_moe.input_linear: gate rows then up rows, output_linear, router.layer), which a model
in memory holds under transformers 5's (experts.gate_up_proj, router.weight)."""
from .base import Family
from .experts import ExpertLayout, read_experts
from .fused_experts import stacked_experts
from .granite import GRANITE
from .renamed import Renamed

_LAYOUT = ExpertLayout(block="block_sparse_moe", router="router")
_LAYER = r"(model\.layers\.\d+\.)block_sparse_moe\."
# the stacked experts under the names fused_experts.py reads, the router under the layout's
_RENAMES = {_LAYER + r"(?:input_linear\.weight|experts\.gate_up_proj)": r"\1mlp.experts.gate_up_proj",
            _LAYER + r"(?:output_linear\.weight|experts\.down_proj)": r"\1mlp.experts.down_proj",
            _LAYER + r"router\.layer\.weight": r"\1block_sparse_moe.router.weight"}


def _granitemoe(hf, r):
    return dict(GRANITE.read_config(hf, r), **read_experts(r, inter_key="intermediate_size", norm_topk=True))


GRANITEMOE = Family("granitemoe", ("GraniteMoeForCausalLM",), ("granitemoe",), _granitemoe, experts=_LAYOUT,
                    gguf_arch="granitemoe",
                    checkpoint_views=(lambda tensors, config: Renamed(tensors, _RENAMES), stacked_experts(_LAYOUT)))
