"""Supported architectures, and Hugging Face config.json (transformers 4.x and 5.x) -> ModelConfig.

Every family here is the LLaMA decoder (RMSNorm, RoPE, GQA attention, SiLU-gated MLP); they differ
only in q/k/v biases. Anything the runtime would compute differently from transformers is refused
here, by name, instead of being converted into a model that silently produces other text.
"""
import dataclasses
from typing import Optional

from ..errors import ModelSerializerException

# HF "architectures" entry -> (our architecture, attention_bias forced by the family or None = from config).
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", None),      # LLaMA 2/3, SmolLM, TinyLlama, ...
    "MistralForCausalLM": ("llama", False),   # only without sliding window (checked below)
    "Qwen2ForCausalLM": ("qwen2", True),      # Qwen1.5 / Qwen2 / Qwen2.5: q/k/v biases
}
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclasses.dataclass
class ModelConfig:
    """Hyper-parameters of a serialized model (the "config" object of the .asgraph)."""
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
    attention_bias: bool
    bos_token_id: Optional[int]
    eos_token_id: list
    pad_token_id: Optional[int]

    @classmethod
    def from_dict(cls, d, where="config"):
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in d]
        if missing:
            raise ModelSerializerException(f"{where} lacks {', '.join(missing)}")
        cfg = cls(**{n: d[n] for n in names})
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
        if self.head_dim % 2:
            raise ModelSerializerException(f"{where}: head_dim {self.head_dim} must be even for RoPE")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ModelSerializerException(f"{where}: rope_theta and rms_norm_eps must be positive")
        if not isinstance(self.eos_token_id, list):
            raise ModelSerializerException(f"{where}: eos_token_id must be a list of ids")
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling, where)


def architecture_of(hf):
    """Our architecture name and the HF class name for a config.json dict; refuses unknown ones."""
    names = hf.get("architectures") or []
    if not names and hf.get("model_type") in _MODEL_TYPES:
        names = [_MODEL_TYPES[hf["model_type"]]]
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name][0], name
    shown = names or [hf.get("model_type")]
    raise ModelSerializerException(
        f"unsupported architecture {', '.join(map(str, shown))}: supported are {', '.join(ARCHITECTURES)}")


def normalize_hf_config(hf, generation_config=None):
    """config.json dict (+ generation_config.json dict) -> (architecture, ModelConfig)."""
    arch, hf_class = architecture_of(hf)

    def need(key):
        if hf.get(key) is None:
            raise ModelSerializerException(f"config.json of this {hf_class} lacks the required key '{key}'")
        return hf[key]

    _refuse_unsupported(hf, hf_class)
    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    rope_theta, rope_scaling = _rope(hf)
    forced_bias = ARCHITECTURES[hf_class][1]
    gen = generation_config or {}
    eos = gen.get("eos_token_id", hf.get("eos_token_id"))
    cfg = ModelConfig(
        vocab_size=need("vocab_size"),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size"),
        num_hidden_layers=need("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hidden // heads,
        rms_norm_eps=float(need("rms_norm_eps")),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=need("max_position_embeddings"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=forced_bias if forced_bias is not None else bool(hf.get("attention_bias", False)),
        bos_token_id=gen.get("bos_token_id", hf.get("bos_token_id")),
        eos_token_id=eos_list(eos),
        pad_token_id=gen.get("pad_token_id", hf.get("pad_token_id")),
    )
    cfg.validate(f"config.json of this {hf_class}")
    return arch, cfg


def eos_list(eos):
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def _refuse_unsupported(hf, hf_class):
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ModelSerializerException(f"{hf_class} with hidden_act={act!r} is not supported (only silu)")
    if hf.get("mlp_bias"):
        raise ModelSerializerException(f"{hf_class} with mlp_bias=true is not supported")
    if hf.get("pretraining_tp", 1) not in (1, None):
        raise ModelSerializerException(f"{hf_class} with pretraining_tp={hf['pretraining_tp']} is not supported")
    window = hf.get("sliding_window")
    if hf_class == "Qwen2ForCausalLM":
        window = window if hf.get("use_sliding_window") else None
    max_len = hf.get("max_position_embeddings")
    if window is not None and max_len is not None and window < max_len:
        raise ModelSerializerException(
            f"{hf_class} with sliding_window={window} < max_position_embeddings={max_len} is not supported: "
            f"this runtime attends to the whole context, so the model would compute something else past "
            f"{window} tokens")
    if any(t != "full_attention" for t in hf.get("layer_types") or []):
        raise ModelSerializerException(f"{hf_class} with sliding-window layers (layer_types) is not supported")


def _rope(hf):
    """(rope_theta, rope_scaling or None) from either spelling.

    transformers 5.x: rope_parameters = {"rope_type", "rope_theta", scaling keys...};
    transformers 4.x: rope_theta at top level, rope_scaling = {"type" or "rope_type", scaling keys...}.
    """
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:  # per-layer-type form of 5.x
        params = params["full_attention"]
    if params:
        theta = params.get("rope_theta", hf.get("rope_theta"))
        scaling = dict(params)
    else:
        theta = hf.get("rope_theta")
        scaling = dict(hf.get("rope_scaling") or {})
    scaling.pop("rope_theta", None)
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    theta = 10000.0 if theta is None else float(theta)  # the transformers default for these families
    if kind == "default":
        return theta, None
    scaling = {"rope_type": kind, **scaling}
    _check_rope_scaling(scaling, "rope scaling")
    keys = ("factor",) if kind == "linear" else _LLAMA3_KEYS
    return theta, {"rope_type": kind, **{k: float(scaling[k]) if k != "original_max_position_embeddings"
                                         else int(scaling[k]) for k in keys}}


def _check_rope_scaling(scaling, where):
    kind = scaling.get("rope_type")
    if kind not in ("linear", "llama3"):
        raise ModelSerializerException(
            f"{where}: RoPE scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    keys = ("factor",) if kind == "linear" else _LLAMA3_KEYS
    missing = [k for k in keys if scaling.get(k) is None]
    if missing:
        raise ModelSerializerException(f"{where}: {kind} RoPE scaling lacks {', '.join(missing)}")
    if not scaling["factor"] > 0:
        raise ModelSerializerException(f"{where}: RoPE scaling factor must be positive, got {scaling['factor']}")
