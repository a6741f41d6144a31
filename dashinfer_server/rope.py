"""Rotary-embedding tables, computed in numpy exactly as transformers computes them.

Every step follows transformers' float32 arithmetic, including torch's quirk that
`scalar / tensor` is `tensor.reciprocal() * scalar`: a cos/sin at position 8191 multiplies
the frequency by 8191, so one ulp of difference in inv_freq shows at the 1e-5 level.
The one step not reproduced bit for bit is torch's vectorized float32 pow (Sleef, within one
ulp); here the pow is correctly rounded, which equals torch's for almost every entry.

Supported rope types: default, linear, llama3. Their attention scaling is 1.0 in transformers,
so the cos/sin tables are unscaled.
"""
import math

import numpy as np

_KNOWN_TYPES = ("default", "linear", "llama3")


def _rtruediv(scalar: float, x: np.ndarray) -> np.ndarray:
    """torch's `scalar / tensor` on float32: reciprocal first, then a float32 multiply."""
    return (np.float32(1.0) / x) * np.float32(scalar)


def rope_type(scaling: dict | None) -> str:
    """The rope type named by a config's rope_scaling / rope_parameters (4.x or 5.x spelling)."""
    if not scaling:
        return "default"
    return scaling.get("rope_type", scaling.get("type", "default")) or "default"


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> np.ndarray:
    """float32 [head_dim/2] inverse frequencies, as transformers' rope init functions.

    scaling is the config's rope_scaling (transformers 4.x) or rope_parameters (5.x) dict, or
    None: "linear" needs factor; "llama3" needs factor, low_freq_factor, high_freq_factor and
    original_max_position_embeddings. Any other rope type raises ValueError.
    """
    kind = rope_type(scaling)
    if kind not in _KNOWN_TYPES:
        raise ValueError(f"rope type {kind!r} is not supported (supported: {', '.join(_KNOWN_TYPES)})")
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope head_dim must be a positive even number, got {head_dim}")
    if not theta > 0:
        raise ValueError(f"rope theta must be positive, got {theta}")

    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    powered = (np.float64(theta) ** exponent.astype(np.float64)).astype(np.float32)
    inv_freq = _rtruediv(1.0, powered)
    if kind == "default":
        return inv_freq

    factor = _param(scaling, kind, "factor")
    if kind == "linear":
        return inv_freq / np.float32(factor)

    low = _param(scaling, kind, "low_freq_factor")
    high = _param(scaling, kind, "high_freq_factor")
    old_context = _param(scaling, kind, "original_max_position_embeddings")
    low_freq_wavelen = np.float32(old_context / low)
    high_freq_wavelen = np.float32(old_context / high)

    wavelen = _rtruediv(2 * math.pi, inv_freq)
    llama = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq)
    smooth = (_rtruediv(old_context, wavelen) - np.float32(low)) / np.float32(high - low)
    smoothed = (np.float32(1.0) - smooth) * llama / np.float32(factor) + smooth * llama
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, llama).astype(np.float32)


def _param(scaling: dict, kind: str, key: str) -> float:
    if key not in scaling:
        raise ValueError(f"rope type {kind!r} needs {key!r} in its scaling parameters")
    return float(scaling[key])


def rope_cos_sin(inv_freq: np.ndarray, max_pos: int) -> np.ndarray:
    """float32 [max_pos, D]: row p holds cos(p * inv_freq) then sin(p * inv_freq), the layout
    K.rope reads. The angle is the float32 product transformers forms; cos/sin of it are
    evaluated in float64 and rounded once."""
    inv_freq = np.asarray(inv_freq, dtype=np.float32)
    if inv_freq.ndim != 1:
        raise ValueError(f"rope inv_freq must be one-dimensional, got shape {inv_freq.shape}")
    if max_pos <= 0:
        raise ValueError(f"rope max_pos must be positive, got {max_pos}")
    angle = (np.arange(max_pos, dtype=np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)
    return np.concatenate([np.cos(angle), np.sin(angle)], axis=1).astype(np.float32)
