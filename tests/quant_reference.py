"""InstantQuant by its documented rules (dashinfer_client/model/quant.py), group by group in
float64: what the quantizer and the loader are held to."""
import numpy as np


def u4_reference(w, group):
    """uint4 InstantQuant by its documented rule (dashinfer_client/model/quant.py), one row and
    group at a time in float64, the last group of a row ragged when G does not divide K.
    -> (codes [N, K], scale codes, zero codes [N, ceil(K/G)], row scales [N], dequantized [N, K])."""
    n, k = w.shape
    starts = list(range(0, k, group))
    codes, deq = np.zeros((n, k)), np.zeros((n, k))
    sc, zc, rows = np.zeros((n, len(starts))), np.zeros((n, len(starts))), np.zeros(n, np.float32)
    for r in range(n):
        parts = [w[r, c0:c0 + group].astype(np.float64) for c0 in starts]
        ranges = [(min(p.min(), 0.0), max(p.max(), 0.0)) for p in parts]
        d = np.float32(max((hi - lo) / 15 for lo, hi in ranges) / 255)
        d = d if d >= np.finfo(np.float32).tiny else np.float32(1)
        rows[r] = d
        for j, (p, (lo, hi)) in enumerate(zip(parts, ranges)):
            best = None
            for dc in (-1, 0, 1):
                s = int(min(max(np.rint((hi - lo) / 15 / float(d)) + dc, 1), 255))
                scale = float(d * np.float32(s))
                for dz in (-1, 0, 1):
                    z = int(min(max(np.rint(-lo / scale * 16) + dz, 0), 240))
                    q = np.clip(np.rint(p / scale + z / 16), 0, 15)
                    err = 0.0
                    for e in (q - z / 16) * scale - p:
                        err += e * e
                    if best is None or err < best[0]:
                        best = (err, s, z, q, (q - z / 16) * scale)
            c0 = starts[j]
            _, sc[r, j], zc[r, j], codes[r, c0:c0 + group], deq[r, c0:c0 + group] = best
    return codes, sc, zc, rows, deq


def stored_parts(model, name, fmt):
    """The stored parts (quant.PARTS) of a quantized weight of a serialized model."""
    from dashinfer_client.model.quant import PARTS
    return [model.tensor(f"{name}.{part}") for part, _ in PARTS[fmt]]


def ragged_reference(w, fmt, group):
    """Ragged-group InstantQuant in float64, group by group: the last group of a row holds K mod G
    channels. -> (codes [N, K], scales, zeros [N, ceil(K/G)], dequantized [N, K]); uint4's
    scales and zeros are its codes, and u4_reference gives its row scales too."""
    if fmt == "uint4":
        codes, sc, zc, _, deq = u4_reference(w, group)
        return codes, sc, zc, deq
    levels = 255
    n, k = w.shape
    starts = list(range(0, k, group))
    codes, scales, zeros, deq = np.zeros((n, k)), np.zeros((n, len(starts))), np.zeros((n, len(starts))), np.zeros((n, k))
    for j, c0 in enumerate(starts):
        part = w[:, c0:c0 + group].astype(np.float64)
        scale = ((part.max(1) - part.min(1)) / levels).astype(np.float32)
        scale[scale < np.finfo(np.float32).tiny] = 1.0
        zero = (-part.min(1) / scale).astype(np.float32)
        c = np.clip(np.rint(part / scale[:, None] + zero[:, None]), 0, levels)
        codes[:, c0:c0 + group], scales[:, j], zeros[:, j] = c, scale, zero
        deq[:, c0:c0 + group] = (c - zero[:, None].astype(np.float64)) * scale[:, None]
    return codes, scales, zeros, deq
