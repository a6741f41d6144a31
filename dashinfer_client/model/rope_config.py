"""RoPE settings out of a Hugging Face config.json (transformers 4.x and 5.x spellings), per layer
type, checked against what the runtime computes (dashinfer_server/rope.py)."""
from ..errors import ModelSerializerException

# rope types the runtime computes; "default" is stored as no scaling
ROPE_TYPES = ("default", "linear", "llama3")
_ROPE_KEYS = {"linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def _rope_params(hf, layer_type):
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params:  # per-layer-type form of 5.x
        params = params[layer_type]
    elif isinstance(params, dict) and "full_attention" in params:
        return None  # the config names no parameters of its own for this layer type
    return params


def rope_of(hf, layer_type="full_attention", default_theta=10000.0):
    """(rope_theta, rope_scaling or None) of one layer type, from either spelling.

    transformers 5.x: rope_parameters = {"rope_type", "rope_theta", scaling keys...}, or one such
    dict per layer type; 4.x: rope_theta at top level, rope_scaling = {"type" or "rope_type", ...}.
    """
    params = _rope_params(hf, layer_type)
    if params:
        theta = params.get("rope_theta", hf.get("rope_theta"))
        scaling = dict(params)
    else:
        theta = hf.get("rope_theta")
        scaling = dict(hf.get("rope_scaling") or {}) if layer_type == "full_attention" else {}
    for key in ("rope_theta", "partial_rotary_factor"):
        scaling.pop(key, None)
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    theta = default_theta if theta is None else float(theta)
    if kind == "default":
        return theta, None
    scaling = {"rope_type": kind, **scaling}
    check_rope_scaling(scaling, "rope scaling")
    keys = _ROPE_KEYS[kind]
    return theta, {"rope_type": kind, **{k: float(scaling[k]) if k != "original_max_position_embeddings"
                                         else int(scaling[k]) for k in keys}}


def rotary_dim(hf, head_dim):
    """Rotary dims of a head: head_dim times partial_rotary_factor (top level, or inside the rope
    parameters), as transformers computes it."""
    params = _rope_params(hf, "full_attention") or {}
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor is None or factor == 1.0:
        return None
    if not 0 < factor <= 1:
        raise ModelSerializerException(f"partial_rotary_factor {factor!r} must be in (0, 1]")
    return int(head_dim * factor)


def check_rope_scaling(scaling, where):
    kind = scaling.get("rope_type")
    if kind not in _ROPE_KEYS:
        raise ModelSerializerException(
            f"{where}: RoPE scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    missing = [k for k in _ROPE_KEYS[kind] if scaling.get(k) is None]
    if missing:
        raise ModelSerializerException(f"{where}: {kind} RoPE scaling lacks {', '.join(missing)}")
    if not scaling["factor"] > 0:
        raise ModelSerializerException(f"{where}: RoPE scaling factor must be positive, got {scaling['factor']}")
