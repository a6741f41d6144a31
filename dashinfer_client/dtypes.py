"""bfloat16 without torch: numpy has no bf16, so bf16 tensors are uint16 arrays of the bits."""
import numpy as np


def to_bf16(x) -> np.ndarray:
    """float32 -> bf16 bits (uint16), rounding to nearest even as torch does; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    # ascontiguousarray gives a 0-d array (Apertus' scalars) one dimension: its shape again
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16).reshape(np.shape(x))


def from_bf16(bits) -> np.ndarray:
    """bf16 bits (uint16) -> float32, exact."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(np.shape(bits))
