"""RoPE out of a Hugging Face config.json (transformers 4.x and 5.x spellings, per layer type): the
scaling dict (rope_scaling / rope_parameters) checked and completed as transformers reads it, and
the rotary dim of a partial rotary embedding. Pure Python, so the conversion side
(dashinfer_client) checks a config without the server; dashinfer_server/rope.py builds the cos/sin
tables from what this returns.

Rope types (transformers' ROPE_INIT_FUNCTIONS): default, linear, llama3, yarn and longrope ("su"
is longrope's old name). "dynamic" is refused: see _REFUSED.
"""
import math
from numbers import Real

SUPPORTED_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
_ALIASES = {"su": "longrope"}
_REFUSED = {
    "dynamic": "dynamic NTK scaling recomputes the frequencies from each sequence's current "
               "length, so a key would need another rotation as its sequence grows; this runtime "
               "rotates keys once into a paged KV cache shared between requests",
}
_LLAMA3_FACTORS = ("factor", "low_freq_factor", "high_freq_factor")


def rope_type(scaling: dict | None) -> str:
    """The rope type named by a config's rope_scaling / rope_parameters (4.x or 5.x spelling)."""
    if not scaling:
        return "default"
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    return _ALIASES.get(kind, kind)


def rotary_dim(head_dim: int, partial_rotary_factor: float = 1.0) -> int:
    """The dims of a head that rotate: int(head_dim * partial_rotary_factor), truncated as
    transformers does. An odd result is refused (transformers rounds its table up to the next
    even width for some rope types and fails for others; no released checkpoint has one)."""
    if not (isinstance(partial_rotary_factor, Real) and 0 < partial_rotary_factor <= 1):
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial_rotary_factor!r}")
    dim = int(head_dim * partial_rotary_factor)
    if dim <= 0 or dim % 2:
        raise ValueError(f"head_dim {head_dim} * partial_rotary_factor {partial_rotary_factor} gives "
                         f"rotary dim {dim}: it must be a positive even number")
    return dim


def resolve_rope_scaling(scaling: dict | None, rotary_dim: int,
                         max_position_embeddings: int | None = None) -> dict | None:
    """A config's rope_scaling / rope_parameters checked and completed as transformers reads it:
    None for plain RoPE, else {"rope_type", and every parameter the table needs}. Raises
    ValueError naming the unsupported rope type or the missing or bad parameter.

    Defaults that transformers derives from max_position_embeddings (original_max_position_
    embeddings of llama3/yarn/longrope, a yarn or longrope factor left out or None) need it here;
    without it those keys must be present. A top-level original_max_position_embeddings (Phi-3's
    config) takes precedence in transformers: put it in the dict before calling. The result
    resolves to itself, so it can be stored in a serialized model's config.
    """
    kind = rope_type(scaling)
    if kind in _REFUSED:
        raise ValueError(f"rope type {kind!r} is not supported: {_REFUSED[kind]}")
    if kind not in SUPPORTED_TYPES:
        raise ValueError(f"rope type {kind!r} is not supported (supported: {', '.join(SUPPORTED_TYPES)})")
    if kind == "default":
        return None
    get = _Params(scaling, kind)
    if kind == "linear":
        return {"rope_type": kind, "factor": get.number("factor")}
    if get.missing("original_max_position_embeddings") and max_position_embeddings is not None:
        original = int(max_position_embeddings)
    else:
        original = get.integer("original_max_position_embeddings")
    if kind == "llama3":
        resolved = {"rope_type": kind, **{k: get.number(k) for k in _LLAMA3_FACTORS},
                    "original_max_position_embeddings": original}
        if not resolved["high_freq_factor"] > resolved["low_freq_factor"]:
            raise ValueError("rope type 'llama3' needs high_freq_factor > low_freq_factor")
        return resolved
    implied = None if max_position_embeddings is None else max_position_embeddings / original
    if kind == "yarn":
        return _resolve_yarn(get, original, implied)
    return _resolve_longrope(get, original, implied, rotary_dim)


def _resolve_yarn(get, original: int, implied: float | None) -> dict:
    factor = get.number("factor", ... if implied is None else implied)
    attention = get.number("attention_factor", None)
    if attention is None:
        mscale, mscale_all_dim = get.number("mscale", 0.0), get.number("mscale_all_dim", 0.0)
        if mscale and mscale_all_dim:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention = _yarn_mscale(factor, 1.0)
    truncate = get.raw("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"rope type 'yarn': truncate must be true or false, got {truncate!r}")
    # transformers reads `beta_fast or 32`: an explicit 0 or None means the default too
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
            "beta_fast": get.number("beta_fast", None) or 32.0,
            "beta_slow": get.number("beta_slow", None) or 1.0,
            "truncate": truncate, "attention_factor": attention}


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _resolve_longrope(get, original: int, implied: float | None, rotary_dim: int) -> dict:
    short, long = get.factors("short_factor", rotary_dim), get.factors("long_factor", rotary_dim)
    attention = get.number("attention_factor", None)
    if attention is None:
        factor = get.number("factor", ... if implied is None else implied)
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {"rope_type": "longrope", "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": original, "attention_factor": attention}


class _Params:
    """Reads one scaling dict, raising ValueError that names the rope type and the key."""

    def __init__(self, scaling: dict, kind: str):
        self.scaling, self.kind = scaling, kind

    def missing(self, key: str) -> bool:
        return self.scaling.get(key) is None

    def raw(self, key: str, default):
        value = self.scaling.get(key)
        return default if value is None else value

    def number(self, key: str, default=...):
        value = self.scaling.get(key)
        if value is None:
            if default is ...:
                raise ValueError(f"rope type {self.kind!r} needs {key!r} in its scaling parameters")
            return default
        if isinstance(value, bool) or not isinstance(value, Real) or not (math.isfinite(value) and value >= 0):
            raise ValueError(f"rope type {self.kind!r}: {key} must be a non-negative number, got {value!r}")
        if key == "factor" and not value > 0:
            raise ValueError(f"rope type {self.kind!r}: factor must be positive, got {value!r}")
        return float(value)

    def integer(self, key: str) -> int:
        value = self.number(key)
        if value != int(value) or value < 1:
            raise ValueError(f"rope type {self.kind!r}: {key} must be a positive integer, got {value!r}")
        return int(value)

    def factors(self, key: str, rotary_dim: int) -> list[float]:
        value = self.scaling.get(key)
        if not isinstance(value, (list, tuple)) or len(value) != rotary_dim // 2:
            raise ValueError(f"rope type {self.kind!r} needs {key!r}: a list of rotary_dim / 2 = "
                             f"{rotary_dim // 2} numbers, got {value!r:.80}")
        if not all(isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in value):
            raise ValueError(f"rope type {self.kind!r}: every {key} entry must be a positive number")
        return [float(v) for v in value]


def _rope_params(hf, layer_type):
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params:  # per-layer-type form of 5.x
        return params[layer_type]
    if isinstance(params, dict) and "full_attention" in params:
        return None  # the config names no parameters of its own for this layer type
    return params


def rope_of(hf, rotary: int, layer_type="full_attention"):
    """(rope_theta, resolved scaling or None) of one layer type of a config.json dict; ValueError
    naming what is unsupported. transformers 5.x: rope_parameters = {"rope_type", "rope_theta",
    scaling keys...}, or one such dict per layer type; 4.x: rope_theta at top level, rope_scaling
    = {"type" or "rope_type", ...}, alike for every layer (a family whose 4.x keys differ by layer
    type converts them to 5.x's first: families/gemma3.py). A top-level
    original_max_position_embeddings (Phi-3) wins."""
    params = _rope_params(hf, layer_type)
    if params:
        theta, scaling = params.get("rope_theta", hf.get("rope_theta")), dict(params)
    else:
        theta, scaling = hf.get("rope_theta"), dict(hf.get("rope_scaling") or {})
    for key in ("rope_theta", "partial_rotary_factor"):
        scaling.pop(key, None)
    if rope_type(scaling) != "default" and hf.get("original_max_position_embeddings"):
        scaling["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
    theta = 10000.0 if theta is None else float(theta)
    return theta, resolve_rope_scaling(scaling or None, rotary, hf.get("max_position_embeddings"))


def config_rotary_dim(hf, head_dim):
    """A config's rotary dims (partial_rotary_factor at top level or in the rope parameters), or
    None when every dim of a head rotates."""
    params = _rope_params(hf, "full_attention") or {}
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor is None or factor == 1.0:
        return None
    return rotary_dim(head_dim, factor)
