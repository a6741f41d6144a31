"""Rotary-embedding tables, computed in numpy exactly as transformers computes them.

Every step follows transformers' float32 arithmetic, including torch's quirks: `scalar / tensor`
is `tensor.reciprocal() * scalar`, and a Python float meeting a float32 tensor is rounded to
float32 first. A cos/sin at position 8191 multiplies the frequency by 8191, so one ulp of
difference in inv_freq shows at the 1e-5 level. The one step not reproduced bit for bit is
torch's vectorized float32 pow (Sleef, within one ulp); here the pow is correctly rounded, which
equals torch's for almost every entry. cos and sin are evaluated in float64 and rounded once.

Rope types (transformers' ROPE_INIT_FUNCTIONS): default, linear, llama3, yarn and longrope ("su"
is longrope's old name). "dynamic" is refused: see _REFUSED. yarn and longrope carry an
attention factor that multiplies cos and sin, as transformers' rotary modules do.

longrope picks its short or long factors once per table, by the context the table serves
(max_pos rows): long when max_pos > original_max_position_embeddings. transformers switches the
whole sequence to the long factors once it grows past original_max_position_embeddings, which
rotates the same position differently depending on how long its sequence became. Here keys are
rotated once, when they are written to the paged KV cache, and a cached prefix is shared by
every request that starts with it: a position must have one rotation for the server's life.
Deciding by the served context (as llama.cpp does by its context size) gives exactly
transformers' rotation for every sequence when the served context is within the original one,
and for sequences longer than it otherwise; the lead's caller should pass the served context
length (not a 128k max_position_embeddings) as max_pos so that short-context servers keep the
short factors.

Partial rotary (Phi-4-mini, partial_rotary_factor 0.75): only the first rotary_dim dims of each
head rotate; the table is [max_pos, rotary_dim], cos then sin of rotary_dim / 2 frequencies.
"""
import math
from numbers import Real

import numpy as np

SUPPORTED_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
_ALIASES = {"su": "longrope"}
_REFUSED = {
    "dynamic": "dynamic NTK scaling recomputes the frequencies from each sequence's current "
               "length, so a key would need another rotation as its sequence grows; this runtime "
               "rotates keys once into a paged KV cache shared between requests",
}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


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
        resolved = {"rope_type": kind, **{k: get.number(k) for k in _LLAMA3_KEYS[:3]},
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


def _rtruediv(scalar: float, x: np.ndarray) -> np.ndarray:
    """torch's `scalar / tensor` on float32: reciprocal first, then a float32 multiply."""
    return (np.float32(1.0) / x) * np.float32(scalar)


def rope_frequencies(rotary_dim: int, theta: float, scaling: dict | None,
                     max_pos: int) -> tuple[np.ndarray, float]:
    """(inv_freq float32 [rotary_dim / 2], attention factor), as transformers' rope init
    functions give them; max_pos (the served context) picks longrope's factors (module doc)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rope rotary_dim must be a positive even number, got {rotary_dim}")
    if not theta > 0:
        raise ValueError(f"rope theta must be positive, got {theta}")
    params = resolve_rope_scaling(scaling, rotary_dim)
    kind = params["rope_type"] if params else "default"
    exponent = np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)
    powered = (np.float64(theta) ** exponent.astype(np.float64)).astype(np.float32)
    if kind == "longrope":
        long = max_pos > params["original_max_position_embeddings"]
        ext = np.array(params["long_factor" if long else "short_factor"], np.float32)
        return _rtruediv(1.0, ext * powered), params["attention_factor"]
    inv_freq = _rtruediv(1.0, powered)
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / np.float32(params["factor"]), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, params), 1.0
    return _yarn(inv_freq, powered, rotary_dim, theta, params), params["attention_factor"]


def _llama3(inv_freq: np.ndarray, params: dict) -> np.ndarray:
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_freq_wavelen = np.float32(old_context / low)
    high_freq_wavelen = np.float32(old_context / high)
    wavelen = _rtruediv(2 * math.pi, inv_freq)
    llama = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq)
    smooth = (_rtruediv(old_context, wavelen) - np.float32(low)) / np.float32(high - low)
    smoothed = (np.float32(1.0) - smooth) * llama / np.float32(factor) + smooth * llama
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, llama).astype(np.float32)


def _yarn(extrapolation: np.ndarray, powered: np.ndarray, dim: int, theta: float,
          params: dict) -> np.ndarray:
    """Blend of the interpolated (divided by factor) and the original frequencies over a linear
    ramp between the dims that turn beta_fast and beta_slow times in the original context."""
    original = params["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(params["beta_fast"]), correction_dim(params["beta_slow"])
    if params["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = (np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low)
    keep = np.float32(1.0) - np.clip(ramp, np.float32(0.0), np.float32(1.0))
    interpolation = _rtruediv(1.0, np.float32(params["factor"]) * powered)
    return (interpolation * (np.float32(1.0) - keep) + extrapolation * keep).astype(np.float32)


def rope_table(head_dim: int, rotary_dim: int, theta: float, scaling: dict | None,
               max_pos: int) -> np.ndarray:
    """float32 [max_pos, rotary_dim]: row p holds cos(p * inv_freq) then sin(p * inv_freq),
    times the attention factor, the layout K.rope reads (it rotates the first rotary_dim dims
    of each head and leaves the rest). The angle is the float32 product transformers forms."""
    if not 0 < rotary_dim <= head_dim:
        raise ValueError(f"rope rotary_dim must be in (0, head_dim={head_dim}], got {rotary_dim}")
    if max_pos <= 0:
        raise ValueError(f"rope max_pos must be positive, got {max_pos}")
    inv_freq, attention = rope_frequencies(rotary_dim, theta, scaling, max_pos)
    angle = (np.arange(max_pos, dtype=np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)
    table = np.concatenate([np.cos(angle), np.sin(angle)], axis=1).astype(np.float32)
    if attention != 1.0:
        table *= np.float32(attention)
    return table
