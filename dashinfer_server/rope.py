"""Rotary-embedding tables, computed in numpy exactly as transformers computes them.

Every step follows transformers' float32 arithmetic, including torch's quirks: `scalar / tensor`
is `tensor.reciprocal() * scalar`, and a Python float meeting a float32 tensor is rounded to
float32 first. A cos/sin at position 8191 multiplies the frequency by 8191, so one ulp of
difference in inv_freq shows at the 1e-5 level. The one step not reproduced bit for bit is
torch's vectorized float32 pow (Sleef, within one ulp); here the pow is correctly rounded, which
equals torch's for almost every entry. cos and sin are evaluated in float64 and rounded once.

Rope types: those dashinfer_client.model.rope_scaling accepts (default, linear, llama3, yarn,
longrope), whose resolve_rope_scaling checks the scaling dict. yarn and longrope carry an
attention factor that multiplies cos and sin, as transformers' rotary modules do.

longrope picks its short or long factors once per table, by the context the table serves
(max_pos rows): long when max_pos > original_max_position_embeddings. transformers switches the
whole sequence to the long factors once it grows past original_max_position_embeddings, which
rotates the same position differently depending on how long its sequence became. Here keys are
rotated once, when they are written to the paged KV cache, and a cached prefix is shared by
every request that starts with it: a position must have one rotation for the server's life.
Deciding by the served context (as llama.cpp does by its context size) gives exactly
transformers' rotation for every sequence when the served context is within the original one,
and for sequences longer than it otherwise. So pass the served context length (the engine's
session length, not a 128k max_position_embeddings) as max_pos: a short-context server then
keeps the short factors.

Partial rotary (Phi-4-mini, partial_rotary_factor 0.75): only the first rotary_dim dims of each
head rotate; the table is [max_pos, rotary_dim], cos then sin of rotary_dim / 2 frequencies.
"""
import math

import numpy as np

from dashinfer_client.model.rope_scaling import resolve_rope_scaling


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


def identity_table(rotary_dim: int, max_pos: int) -> np.ndarray:
    """rope_table's layout with cos 1 and sin 0 everywhere: the rotation that leaves q and k as they
    are, bit for bit (a layer without positional encoding)."""
    table = np.zeros((max_pos, rotary_dim), np.float32)
    table[:, :rotary_dim // 2] = 1.0
    return table


def query_scales(beta: float, period: int, max_pos: int) -> np.ndarray:
    """float32 [max_pos]: 1 + beta * log(1 + floor(p / period)), the factor of a query at position p
    after RoPE (Ministral 3's llama-4 attention scaling), in transformers' float32 arithmetic."""
    steps = np.floor(np.arange(max_pos, dtype=np.float32) / np.float32(period))
    return (np.float32(1.0) + np.float32(beta) * np.log(np.float32(1.0) + steps)).astype(np.float32)
