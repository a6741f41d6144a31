"""ModelConfig (the hyper-parameters a serialized model carries) and Hugging Face config.json
(transformers 4.x and 5.x) -> ModelConfig through the model's family (families/).

Anything the runtime would compute differently from transformers is refused here, by name, instead
of being converted into a model that silently produces other text.
"""
import dataclasses
import math
from typing import Optional

from ..errors import ModelSerializerException
from .families import FAMILIES, family_for_hf
from .families.base import ConfigReader
from .rope_scaling import config_rotary_dim, resolve_rope_scaling, rope_of


ACTIVATIONS = ("silu", "gelu_tanh", "clamped_swiglu", "relu2", "xielu")  # native/glu.h's (relu2, xielu: a plain MLP's)


@dataclasses.dataclass
class ModelConfig:
    """Hyper-parameters of a serialized model (the "config" object of the .asgraph). The fields
    after pad_token_id have defaults: models serialized before they existed load unchanged."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict]
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool           # q/k/v (or the fused qkv) projections carry biases
    bos_token_id: Optional[int]
    eos_token_id: list
    pad_token_id: Optional[int]
    attention_out_bias: bool = False   # o_proj carries a bias
    mlp_bias: bool = False             # gate/up/down carry biases
    hidden_act: str = "silu"           # the MLP's activation: silu | gelu_tanh | clamped_swiglu (gpt-oss) | relu2 / xielu (a plain MLP's: Arcee, Apertus)
    rotary_dim: Optional[int] = None   # dims of a head RoPE rotates (partial rotary); None: head_dim
    layer_types: Optional[list] = None  # per layer full_attention | sliding_attention; None: all full
    sliding_window: Optional[int] = None  # keys a sliding layer's query sees, itself included
    rope_local_theta: Optional[float] = None  # the sliding layers' RoPE base (Gemma 3); None: rope_theta
    nope_layers: Optional[list] = None  # layers that rotate nothing: no positional encoding (SmolLM3)
    use_qk_norm: bool = True           # False: the family's q/k norms are left out (GLM-4.5's use_qk_norm)
    attention_scale: Optional[float] = None   # the scores' scale; None: head_dim ** -0.5
    # each query times 1 + query_scale_beta * log(1 + floor(position / query_scale_period)) after RoPE
    # (Ministral 3's llama_4_scaling_beta over its original context); None: 1
    query_scale_beta: Optional[float] = None
    query_scale_period: Optional[int] = None
    attn_logit_softcap: Optional[float] = None  # scores -> cap * tanh(scores / cap)
    final_logit_softcap: Optional[float] = None
    embedding_multiplier: float = 1.0  # the embeddings are multiplied by it (Gemma, Granite)
    residual_multiplier: float = 1.0   # attention and MLP outputs before the residual add (Granite)
    logits_multiplier: float = 1.0     # the logits (Granite's 1 / logits_scaling)
    # mixture of experts (families/experts.py); num_experts 0: every layer's MLP is dense
    num_experts: int = 0               # experts of a sparse layer
    num_experts_per_tok: int = 0       # experts a token is routed to (top-k of the router's scores)
    moe_intermediate_size: Optional[int] = None  # one expert's intermediate size
    norm_topk_prob: bool = False       # the top-k routing weights renormalised to sum to 1
    shared_expert_intermediate_size: int = 0  # an expert every token runs (Qwen2-MoE, GLM-4.5); 0: none
    expert_scoring: str = "softmax"    # the router's scores: softmax over all experts | sigmoid of each (GLM-4.5)
    routed_scaling_factor: float = 1.0  # the routing weights' last factor (GLM-4.5's)
    dense_mlp_layers: Optional[list] = None   # layers whose MLP stays dense (Qwen's mlp_only_layers,
    #                                           decoder_sparse_step); None: none
    mxfp4_experts: bool = False        # the experts' weights are stored as the checkpoint's MXFP4 blocks and
    #                                    scales (gpt-oss), served so, never re-quantized

    @classmethod
    def from_dict(cls, d, where="config"):
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in d]
        if missing:
            raise ModelSerializerException(f"{where} lacks {', '.join(missing)}")
        unknown = sorted(set(d) - {f.name for f in fields})
        if unknown:
            raise ModelSerializerException(f"{where} has fields this runtime does not know: {', '.join(unknown)}")
        cfg = cls(**d)
        cfg.validate(where)
        return cfg

    def to_dict(self):
        return dataclasses.asdict(self)

    def validate(self, where="config"):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelSerializerException(f"{where}: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelSerializerException(
                f"{where}: num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 16 or self.head_dim > 512:  # native/py_kv_cache.c: refused there at start, too late
            raise ModelSerializerException(
                f"{where}: head_dim {self.head_dim} is not served: the KV cache and attention kernels take "
                f"multiples of 16 up to 512")
        rot = self.rotary_dim or self.head_dim
        if rot % 2 or not 0 < rot <= self.head_dim:
            raise ModelSerializerException(
                f"{where}: the rotary dims ({rot}) must be even and at most head_dim {self.head_dim}")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ModelSerializerException(f"{where}: rope_theta and rms_norm_eps must be positive")
        if not isinstance(self.eos_token_id, list):
            raise ModelSerializerException(f"{where}: eos_token_id must be a list of ids")
        if self.rope_scaling is not None:
            try:
                resolved = resolve_rope_scaling(self.rope_scaling, rot)
            except ValueError as e:
                raise ModelSerializerException(f"{where}: {e}") from None
            if resolved != self.rope_scaling:
                raise ModelSerializerException(f"{where}: rope_scaling {self.rope_scaling} is not in its resolved form")
        if self.hidden_act not in ACTIVATIONS:
            raise ModelSerializerException(
                f"{where}: hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers or not self.sliding_window or \
                    any(t not in ("full_attention", "sliding_attention") for t in self.layer_types):
                raise ModelSerializerException(
                    f"{where}: layer_types must name full_attention or sliding_attention for each of "
                    f"{self.num_hidden_layers} layers, with a positive sliding_window")
        if self.nope_layers is not None and (not isinstance(self.nope_layers, list) or any(
                not isinstance(i, int) or not 0 <= i < self.num_hidden_layers for i in self.nope_layers)):
            raise ModelSerializerException(f"{where}: nope_layers must list layer indices, got {self.nope_layers!r}")
        self._validate_experts(where)
        if (self.query_scale_beta is None) != (self.query_scale_period is None) or (
                self.query_scale_period is not None and not (isinstance(self.query_scale_period, int)
                                                             and self.query_scale_period > 0)):
            raise ModelSerializerException(f"{where}: query_scale_beta and query_scale_period come together, the "
                                           f"period a positive integer, got {self.query_scale_period!r}")
        for name in ("attention_scale", "attn_logit_softcap", "final_logit_softcap", "rope_local_theta"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ModelSerializerException(f"{where}: {name} must be positive, got {value!r}")

    def _validate_experts(self, where):
        if not self.num_experts:
            return
        ints = (self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size, self.shared_expert_intermediate_size)
        if any(not isinstance(v, int) or isinstance(v, bool) for v in ints) or not 0 < self.num_experts_per_tok \
                <= self.num_experts or not self.moe_intermediate_size or self.moe_intermediate_size < 0 \
                or self.shared_expert_intermediate_size < 0:
            raise ModelSerializerException(
                f"{where}: experts need 1 <= num_experts_per_tok <= num_experts and a positive moe_intermediate_size, "
                f"got {self.num_experts_per_tok} of {self.num_experts}, size {self.moe_intermediate_size!r}")
        if self.mxfp4_experts and (self.moe_intermediate_size % 32 or self.hidden_size % 32):
            raise ModelSerializerException(
                f"{where}: MXFP4 experts need hidden_size and moe_intermediate_size multiples of 32 (its "
                f"blocks), got {self.hidden_size}, {self.moe_intermediate_size}")
        if self.expert_scoring not in ("softmax", "sigmoid") or isinstance(self.routed_scaling_factor, bool) or \
                not isinstance(self.routed_scaling_factor, (int, float)) or not 0 < self.routed_scaling_factor < math.inf:
            raise ModelSerializerException(
                f"{where}: expert_scoring must be softmax or sigmoid and routed_scaling_factor a positive number, "
                f"got {self.expert_scoring!r}, {self.routed_scaling_factor!r}")
        dense = self.dense_mlp_layers or []
        if not isinstance(dense, list) or any(not isinstance(i, int) or not 0 <= i < self.num_hidden_layers
                                               for i in dense):
            raise ModelSerializerException(f"{where}: dense_mlp_layers must list layer indices, got {dense!r}")

    def is_moe_layer(self, i):
        """Whether layer i's MLP is the routed experts (else the dense MLP of intermediate_size)."""
        return self.num_experts > 0 and i not in (self.dense_mlp_layers or ())

    def layer_window(self, i):
        """Keys layer i's query sees at most (0: the whole context)."""
        sliding = self.layer_types is not None and self.layer_types[i] == "sliding_attention"
        return self.sliding_window if sliding else 0


def architecture_of(hf):
    """Our architecture name and the HF class name for a config.json dict; refuses unknown ones."""
    family, hf_class = family_for_hf(hf)
    return family.name, hf_class


def normalize_hf_config(hf, generation_config=None):
    """config.json dict (+ generation_config.json dict) -> (architecture, ModelConfig)."""
    family, hf_class = family_for_hf(hf)
    hf = {**family.config_defaults, **hf}
    r = ConfigReader(hf, hf_class)
    # pretraining_tp (LLaMA's; released configs may say 2) only split the same matmuls into slices in
    # transformers 4.x, the same function; 5.x reads it no more: nothing to do
    heads, hidden = r.need("num_attention_heads"), r.need("hidden_size")
    gen = generation_config or {}
    fields = dict(
        vocab_size=r.need("vocab_size"),
        hidden_size=hidden,
        intermediate_size=r.need("intermediate_size"),
        num_hidden_layers=r.need("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hidden // heads,
        rms_norm_eps=float(r.need(family.norm_eps_key)),
        max_position_embeddings=r.need("max_position_embeddings"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        bos_token_id=gen.get("bos_token_id", hf.get("bos_token_id")),
        eos_token_id=eos_list(gen.get("eos_token_id", hf.get("eos_token_id"))),
        pad_token_id=gen.get("pad_token_id", hf.get("pad_token_id")),
    )
    try:
        fields["rotary_dim"] = config_rotary_dim(hf, fields["head_dim"])
        if not family.own_rope:
            fields["rope_theta"], fields["rope_scaling"] = rope_of(hf, fields["rotary_dim"] or fields["head_dim"])
        fields.update(family.read_config(hf, r))  # a family may read RoPE its own way (Gemma 3)
    except ValueError as e:
        raise ModelSerializerException(f"config.json of this {hf_class}: {e}") from None
    foreign = r.unread_features()
    if foreign:
        raise ModelSerializerException(
            f"config.json of this {hf_class} sets {', '.join(f'{k}={hf[k]!r}' for k in foreign)}, which a "
            f"{hf_class} does not have: it describes another model family (check architectures / model_type)")
    cfg = ModelConfig(**fields)
    cfg.validate(f"config.json of this {hf_class}")
    return family.name, cfg


def eos_list(eos):
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


__all__ = ["ModelConfig", "FAMILIES", "architecture_of", "normalize_hf_config", "eos_list", "rope_of"]
