"""A sparse mixture-of-experts MLP as the families that have one store it, and the config keys they
share. The runtime computes every such layer alike (native/moe.h): a router linear, its scores in
fp32 (a softmax over all experts, or each expert's sigmoid: GLM-4.5), the top num_experts_per_tok
of them (chosen by score + a choice bias where the router has one; renormalised to sum to 1 when
norm_topk_prob, then times routed_scaling_factor), each chosen expert's gated MLP weighted by its
score and summed, plus an optional shared expert, scaled by sigmoid(x . shared_gate) (Qwen2-MoE)
or added as it is (GLM-4.5's, which has no gate).

The tensors of layer i's block, under `model.layers.{i}.{block}.`:
    {router}.weight                      [num_experts, hidden]
    experts.{e}.{gate|up}.weight         [moe_intermediate, hidden]
    experts.{e}.{down}.weight            [hidden, moe_intermediate]
    {shared}.{gate|up|down}_proj.weight  the shared expert, a dense MLP of shared_expert_intermediate
    {shared_gate}.weight                 [1, hidden] (where the shared expert has a gate)
    {choice_bias}                        [num_experts] (where the router has one), held in fp32
and, with biases (gpt-oss), {router}.bias [num_experts] and each expert projection's .bias.
"""
import dataclasses
import math

from .renamed import Without


@dataclasses.dataclass(frozen=True)
class ExpertLayout:
    block: str = "mlp"           # the sparse block under the layer (Mixtral: block_sparse_moe)
    router: str = "gate"
    gate: str = "gate_proj"      # one expert's projections (Mixtral: w1, w3, w2)
    up: str = "up_proj"
    down: str = "down_proj"
    shared: str = "shared_expert"
    shared_gate: str | None = "shared_expert_gate"  # None: the shared expert is added ungated (GLM-4.5)
    choice_bias: str | None = None  # a router's bias that picks experts but weighs none (GLM-4.5's)
    choice_bias_row: bool = False   # it is stored [1, num_experts] (ERNIE 4.5's), not [num_experts]
    biases: bool = False         # the router and every expert projection carry a bias (gpt-oss)

    # HF base names (the tensor is {base}.weight) under a layer's prefix "model.layers.{i}."
    def expert(self, layer_prefix, e, role):
        """Expert e's gate / up / down projection."""
        return f"{layer_prefix}{self.block}.experts.{e}.{getattr(self, role)}"

    def router_name(self, layer_prefix):
        return f"{layer_prefix}{self.block}.{self.router}"

    def choice_bias_name(self, layer_prefix):
        return f"{layer_prefix}{self.block}.{self.choice_bias}"

    def shared_name(self, layer_prefix, role):
        """The shared expert's gate / up / down projection, or its sigmoid gate (role "gate_weight")."""
        if role == "gate_weight":
            return f"{layer_prefix}{self.block}.{self.shared_gate}"
        return f"{layer_prefix}{self.block}.{self.shared}.{role}_proj"

    def shapes(self, layer_prefix, config):
        """{HF name: shape} of one sparse layer's MLP tensors."""
        H, inter, shared = config.hidden_size, config.moe_intermediate_size, config.shared_expert_intermediate_size
        out = {self.router_name(layer_prefix): (config.num_experts, H)}
        for e in range(config.num_experts):
            out[self.expert(layer_prefix, e, "gate")] = (inter, H)
            out[self.expert(layer_prefix, e, "up")] = (inter, H)
            out[self.expert(layer_prefix, e, "down")] = (H, inter)
        if shared:
            out[self.shared_name(layer_prefix, "gate")] = (shared, H)
            out[self.shared_name(layer_prefix, "up")] = (shared, H)
            out[self.shared_name(layer_prefix, "down")] = (H, shared)
            if self.shared_gate:
                out[self.shared_name(layer_prefix, "gate_weight")] = (1, H)
        shapes = {f"{base}.weight": shape for base, shape in out.items()}
        if self.biases:
            for base, shape in out.items():
                shapes[f"{base}.bias"] = shape[:1]
        if self.choice_bias:
            shapes[self.choice_bias_name(layer_prefix)] = (1,) * self.choice_bias_row + (config.num_experts,)
        return shapes

    def held_in_fp32(self, names):
        """The tensors of `names` stored in fp32 whatever the model's dtype: the choice biases, whose
        small differences pick the experts (transformers keeps them fp32 too)."""
        suffix = f".{self.block}.{self.choice_bias}"
        return {n for n in names if self.choice_bias and n.endswith(suffix)}


def _empty_shared_experts(tensors, layout):
    """The names of each layer's shared expert of 0 rows and of its sigmoid gate."""
    gate = f"{layout.shared_name('', 'gate')}.weight"
    layers = [n.removesuffix(gate) for n in tensors.keys() if n.endswith("." + gate)]
    empty = set()
    for p in layers:
        names = [f"{layout.shared_name(p, role)}.weight" for role in ("gate", "up", "down")]
        if all(n in tensors and math.prod(tensors.shape(n)) == 0 for n in names):
            empty.update(names)
            if layout.shared_gate:
                empty.add(f"{layout.shared_name(p, 'gate_weight')}.weight")
    return empty


def without_empty_shared(layout):
    """The checkpoint view (families/base.py) that hides each layer's shared expert of 0 rows and its
    sigmoid gate: transformers builds and saves one when shared_expert_intermediate_size (GLM-4.5:
    n_shared_experts) is 0, and its down projection, of 0 inputs, adds zeros to every token."""
    return lambda tensors, config: Without(tensors, _empty_shared_experts(tensors, layout).__contains__)


def read_experts(r, *, inter_key="moe_intermediate_size", norm_topk=None, shared=False, sparse_steps=False,
                 count_key="num_experts", top_k_key="num_experts_per_tok"):
    """The ModelConfig expert fields from config.json. norm_topk: the family's fixed choice (Mixtral
    always renormalises), else the config's norm_topk_prob. sparse_steps: the config may leave some
    layers dense (Qwen's decoder_sparse_step and mlp_only_layers). count_key, top_k_key: the
    family's names of the expert count and of the experts a token takes (GLM-4.5's n_routed_experts,
    ERNIE 4.5's moe_num_experts and moe_k)."""
    layers = r.need("num_hidden_layers")
    # the expert count under either name: each family's own, or the other that transformers 5 writes
    counts = {k: r.get(k) for k in (count_key, "num_local_experts") if r.get(k) is not None}
    if len(set(counts.values())) != 1:
        r.refuse(f"{count_key} / num_local_experts {counts or 'missing'} (one count of experts)")
    fields = dict(num_experts=next(iter(counts.values())), num_experts_per_tok=r.need(top_k_key),
                  moe_intermediate_size=r.need(inter_key),
                  norm_topk_prob=bool(r.get("norm_topk_prob", False)) if norm_topk is None else norm_topk)
    if shared:
        fields["shared_expert_intermediate_size"] = r.get("shared_expert_intermediate_size", 0)
    if sparse_steps:
        step, only = r.get("decoder_sparse_step", 1), r.get("mlp_only_layers", [])
        if not isinstance(step, int) or step < 1 or not isinstance(only, list):
            r.refuse(f"decoder_sparse_step={step!r} / mlp_only_layers={only!r}")
        dense = [i for i in range(layers) if i in only or (i + 1) % step]
        fields["dense_mlp_layers"] = dense or None
    return fields
