"""What a model family is, as the runtime sees it: how its config.json maps onto ModelConfig, where
its tensors are, and which pieces its decoder layer uses.

Every family here is a pre-trained decoder of RMSNorm + RoPE attention + a gated MLP; they differ in
which of four norms a layer has, q/k norms, biases, fused projections, the activation, soft-caps,
sliding windows and scalar multipliers. A family module declares those as a Family; the decoder
(dashinfer_server/model.py, native/decoder.c) runs any combination, so a new family of this shape is
one module here and nothing else.

The four norms of a layer, by role (the HF tensor name differs by family):
    attn_in   before attention (LLaMA's input_layernorm)
    attn_out  on attention's output, before the residual add (Gemma, OLMo2)
    mlp_in    before the MLP (LLaMA's post_attention_layernorm, Gemma's pre_feedforward_layernorm)
    mlp_out   on the MLP's output, before the residual add (Gemma, OLMo2)
"""
import dataclasses
from typing import Callable, Optional

from ...errors import ModelSerializerException
from .experts import ExpertLayout

NORM_ROLES = ("attn_in", "attn_out", "mlp_in", "mlp_out")
LLAMA_NORMS = {"attn_in": "input_layernorm", "mlp_in": "post_attention_layernorm"}
QK_NORMS = (None, "head", "whole")  # none | one [head_dim] weight for every head | [heads * head_dim]


XIELU_PARAMS = {"alpha_p": (1,), "alpha_n": (1,), "beta": (), "eps": ()}  # transformers' XIELUActivation's


@dataclasses.dataclass(frozen=True)
class Family:
    name: str                      # our architecture name, stored in the serialized model
    hf_classes: tuple              # config.json "architectures" entries
    model_types: tuple             # config.json "model_type" values
    read_config: Callable          # (hf dict, ConfigReader) -> dict of ModelConfig fields it sets
    gguf_arch: Optional[str] = None  # GGUF general.architecture written by llama.cpp's converter
    norms: dict = dataclasses.field(default_factory=lambda: dict(LLAMA_NORMS))  # role -> HF name
    qk_norm: Optional[str] = None
    qk_norm_after_rope: bool = False  # the q/k norms follow RoPE (Hunyuan) instead of preceding it
    own_rope: bool = False         # read_config sets rope_theta / rope_scaling (a RoPE the shared reader refuses)
    norm_offset: float = 0.0       # Gemma stores RMSNorm weights as w - 1: the layer uses 1 + w
    fused_qkv: bool = False        # Phi-3: self_attn.qkv_proj holds q, k, v rows
    fused_gate_up: bool = False    # Phi-3: mlp.gate_up_proj holds gate, then up rows
    gguf_names: dict = dataclasses.field(default_factory=dict)  # GGUF block tensor -> HF name, beyond LLaMA's
    experts: Optional[ExpertLayout] = None  # where a sparse layer's experts are (experts.py)
    sinks: bool = False            # self_attn.sinks: a learned logit per head in attention's softmax (gpt-oss)
    # a checkpoint's tensors under the names and in the layout weight_shapes and the decoder take,
    # when the family stores them otherwise: views, each (tensors, ModelConfig) -> the same interface
    # (keys, in, shape, fetch), applied in order (gpt-oss's fused experts, GLM-4's interleaved RoPE dims)
    checkpoint_views: tuple = ()
    layer_norm: bool = False       # the norms are LayerNorms (Cohere's without a bias), not RMSNorms
    norm_bias: bool = False        # the LayerNorms carry biases (StarCoder2, Nemotron)
    norm_eps_key: str = "rms_norm_eps"  # config.json's name of the norms' eps
    parallel_block: bool = False   # attention and MLP read the layer's one norm, their sum joins the residual
    gated_mlp: bool = True         # False: a plain MLP, down(act(up(x))) (Arcee's)
    stored_quant: Optional[str] = None  # a config.json quantization_config quant_method the family serves
    # transformers' config class defaults that differ from what a missing key means here (LLaMA's:
    # rope_theta 10000, no scaling, no window): read in place of a key config.json leaves out
    config_defaults: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        assert set(self.norms) <= set(NORM_ROLES) and self.qk_norm in QK_NORMS, self.name
        assert not (self.experts and (self.fused_gate_up or self.fused_qkv)), self.name

    def checkpoint_view(self, tensors, config):
        """A checkpoint's tensors through the family's checkpoint_views."""
        for view in self.checkpoint_views:
            tensors = view(tensors, config)
        return tensors

    # -- where the tensors are ------------------------------------------------------------------
    def linear(self, role, config):
        """(HF base name under the layer, first row) of a projection role: q k v o gate up down."""
        q, kv, inter = (config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim,
                        config.intermediate_size)
        if self.fused_qkv and role in ("q", "k", "v"):
            return "self_attn.qkv_proj", {"q": 0, "k": q, "v": q + kv}[role]
        if self.fused_gate_up and role in ("gate", "up"):
            return "mlp.gate_up_proj", {"gate": 0, "up": inter}[role]
        attn = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
        if role in attn:
            return f"self_attn.{attn[role]}", 0
        return f"mlp.{role}_proj", 0

    def weight_shapes(self, config):
        """{HF tensor name: shape} of an unquantized checkpoint of this family, in layer order."""
        c = config
        H, D, inter = c.hidden_size, c.head_dim, c.intermediate_size
        q_out, kv_out = c.num_attention_heads * D, c.num_key_value_heads * D
        shapes = {"model.embed_tokens.weight": (c.vocab_size, H)}
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            for role in NORM_ROLES:
                if role in self.norms:
                    shapes[p + self.norms[role] + ".weight"] = (H,)
                    if self.norm_bias:
                        shapes[p + self.norms[role] + ".bias"] = (H,)
            if self.sinks:
                shapes[p + "self_attn.sinks"] = (c.num_attention_heads,)
            if self.qk_norm and c.use_qk_norm:
                whole = self.qk_norm == "whole"
                shapes[p + "self_attn.q_norm.weight"] = (q_out if whole else D,)
                shapes[p + "self_attn.k_norm.weight"] = (kv_out if whole else D,)
            attn = ({"self_attn.qkv_proj": q_out + 2 * kv_out} if self.fused_qkv else
                    {"self_attn.q_proj": q_out, "self_attn.k_proj": kv_out, "self_attn.v_proj": kv_out})
            mlp = {"mlp.gate_up_proj": 2 * inter} if self.fused_gate_up else {"mlp.gate_proj": inter,
                                                                               "mlp.up_proj": inter}
            if not self.gated_mlp:
                mlp = {"mlp.up_proj": inter}
            linears = [(attn, H, c.attention_bias), ({"self_attn.o_proj": H}, q_out, c.attention_out_bias)]
            if not c.is_moe_layer(i):
                linears += [(mlp, H, c.mlp_bias), ({"mlp.down_proj": H}, inter, c.mlp_bias)]
            for names, inputs, bias in linears:
                for name, rows in names.items():
                    shapes[p + name + ".weight"] = (rows, inputs)
                    if bias:
                        shapes[p + name + ".bias"] = (rows,)
            if c.is_moe_layer(i):
                shapes.update(self.experts.shapes(p, c))
            if c.hidden_act == "xielu":  # its learned scalars (Apertus): two parameters, two constants
                shapes.update({f"{p}mlp.act_fn.{n}": s for n, s in XIELU_PARAMS.items()})
        shapes["model.norm.weight"] = (H,)
        if self.norm_bias:
            shapes["model.norm.bias"] = (H,)
        if not c.tie_word_embeddings:
            shapes["lm_head.weight"] = (c.vocab_size, H)
        return shapes

    def held_in_fp32(self, names):
        """The tensors of `names` stored in fp32 whatever the model's dtype (experts.py's choice biases)."""
        return self.experts.held_in_fp32(names) if self.experts else set()

    def is_norm(self, name):
        """Whether an HF tensor name is one of this family's RMSNorm weights (Gemma's w - 1 ones)."""
        return name.endswith("norm.weight")


# config keys of features some family has, with the value that leaves the computation unchanged: a
# config whose family does not read one that is set otherwise describes another model (a Granite
# config handed over as LLaMA without its model_type, say) and is refused.
FEATURE_KEYS = {"embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_multiplier": None,
                "logits_scaling": 1.0, "query_pre_attn_scalar": None, "attn_logit_softcapping": None,
                "final_logit_softcapping": None, "num_experts": 0, "num_local_experts": 0}


class ConfigReader:
    """config.json keys with the checks every family shares (a missing key, a refused value)."""

    def __init__(self, hf, hf_class):
        self.hf, self.hf_class = hf, hf_class
        self.read = set()

    def unread_features(self):
        """Feature keys set in the config that the family did not read."""
        return [k for k, neutral in FEATURE_KEYS.items()
                if k not in self.read and self.hf.get(k) is not None and self.hf.get(k) != neutral]

    def need(self, key):
        self.read.add(key)
        if self.hf.get(key) is None:
            raise ModelSerializerException(f"config.json of this {self.hf_class} lacks the required key '{key}'")
        return self.hf[key]

    def get(self, key, default=None):
        self.read.add(key)
        value = self.hf.get(key)
        return default if value is None else value

    def refuse(self, feature):
        raise ModelSerializerException(f"{self.hf_class} with {feature} is not supported")

    def activation(self, key, allowed):
        """The MLP activation under `key`, mapped to ours ({HF name: ours}); others refused by name."""
        act = self.get(key, next(iter(allowed)))
        if act not in allowed:
            self.refuse(f"{key}={act!r} (supported: {', '.join(allowed)})")
        return allowed[act]

    def layer_types(self, num_layers, default):
        """Per layer "full_attention" or "sliding_attention": config.json's list, else default(i)."""
        types = self.hf.get("layer_types")
        if types is None:
            types = [default(i) for i in range(num_layers)]
        if len(types) != num_layers or any(t not in ("full_attention", "sliding_attention") for t in types):
            self.refuse(f"layer_types {types!r} (one of full_attention / sliding_attention per layer)")
        return list(types)

    def window(self, types, keep_wide=False):
        """(layer_types or None, sliding_window or None): windows wider than the context are dropped,
        they change nothing, unless keep_wide (the sliding layers differ otherwise too: Gemma 3's
        RoPE base)."""
        window = self.hf.get("sliding_window")
        if window is None or "sliding_attention" not in types:
            return None, None
        if not isinstance(window, int) or window <= 0:
            self.refuse(f"sliding_window={window!r}")
        if window >= self.need("max_position_embeddings") and not keep_wide:
            return None, None
        return types, window
