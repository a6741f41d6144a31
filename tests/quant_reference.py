"""InstantQuant by its documented rules (dashinfer_client/model/quant.py), group by group in
float64: what the quantizer and the loader are held to; and numpy_quantize, the same rules
vectorized in numpy, fast enough to hold the C quantizer to on whole models."""
import numpy as np

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import quant


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


# numpy_quantize's elements at once: bounds its float64 temporaries; uint4's 9 candidate passes run from L2
I8_CHUNK_ELEMENTS, U4_CHUNK_ELEMENTS = 1 << 22, 1 << 15


def numpy_quantize(w, weight_format="int8", group_size=64):
    """quant.quantize's parts, vectorized in numpy float64 (the conversion's quantizer before it
    moved to C): quant.quantize must equal it bit for bit."""
    settings = quant.InstantQuantSettings.from_config({"weight_format": weight_format, "group_size": group_size})
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ModelSerializerException(f"InstantQuant: expects a 2-D weight [N, K], got shape {list(w.shape)}")
    n, k = w.shape
    shapes = settings.packed_shapes(n, k)
    parts = tuple(np.empty(shape, dtype=np.float32 if code == "F32" else np.uint8)
                  for shape, (_, code) in zip(shapes, quant.PARTS[weight_format]))
    # bounds the float64 temporaries; uint4's 9 candidate passes run faster from L2
    rows = max(1, (I8_CHUNK_ELEMENTS if weight_format == "int8" else U4_CHUNK_ELEMENTS) // max(k, 1))
    for r in range(0, n, rows):
        for part, value in zip(parts, _quantize_rows(w[r:r + rows], quant.BITS[settings.weight_format],
                                                     settings.group_of(k))):
            part[r:r + rows] = value
    return parts


def _quantize_rows(w, bits, g):
    n, k = w.shape
    whole = k - k % g
    groups = [w[:, :whole].reshape(n, whole // g, g)] if whole else []
    if whole < k:  # the ragged last group
        groups.append(w[:, None, whole:])
    groups = [part.astype(np.float64) for part in groups]
    if bits == 8:
        parts = [_quantize_groups(part, 255) for part in groups]
    else:
        d = _u4_row_scales(groups)
        parts = [_quantize_u4_groups(part, d) for part in groups]
    q = np.concatenate([p[0].reshape(n, -1) for p in parts], axis=1)
    params = tuple(np.concatenate([p[i] for p in parts], axis=1) for i in (1, 2))
    if bits == 8:
        return (q,) + params
    return (q[:, 0::2] | (q[:, 1::2] << 4),) + params + (d,)


def _quantize_groups(groups, levels):
    """groups float64 [n, count, g] -> (codes uint8 [n, count, g], scale, zero float32 [n, count])."""
    lo, hi = groups.min(axis=2), groups.max(axis=2)
    scale = ((hi - lo) / levels).astype(np.float32)
    scale[~(scale >= np.finfo(np.float32).tiny)] = 1.0  # constant (or denormal-range) groups
    zero = (-lo / scale).astype(np.float32)
    # Codes from the stored float32 scale/zero, so dequantization (in float32) is what was rounded to.
    codes = np.rint(groups / scale[..., None] + zero[..., None])
    return np.clip(codes, 0, levels).astype(np.uint8), scale, zero


def _u4_ranges(groups):
    """(min, max) of each group [n, count], widened to hold 0."""
    return np.minimum(groups.min(axis=2), 0), np.maximum(groups.max(axis=2), 0)


def _u4_row_scales(groups):
    """float32 [n]: the largest group step of each row over 255 (1 for a row of zeros)."""
    steps = [(hi - lo) / 15 for lo, hi in map(_u4_ranges, groups)]
    d = (np.max(np.concatenate(steps, axis=1), axis=1) / quant.U4_SCALE_CODES).astype(np.float32)
    d[~(d >= np.finfo(np.float32).tiny)] = 1.0
    return d


def _u4_codes(groups, scale, zero):
    return np.clip(np.rint(groups / scale[..., None] + zero[..., None]), 0, 15)


def _quantize_u4_groups(groups, d):
    """groups float64 [n, count, g], row scales d float32 [n] -> (codes uint8 [n, count, g],
    scale codes, zero codes uint8 [n, count]): the candidate pair of least squared error, summed
    in k order (as native/linear_quantize.c sums it, so both pick the same pair)."""
    lo, hi = _u4_ranges(groups)
    c0 = np.rint((hi - lo) / 15 / d.astype(np.float64)[:, None])
    best = np.full(lo.shape, np.inf)
    best_sc, best_zc = np.ones(lo.shape), np.zeros(lo.shape)
    for dc in (-1, 0, 1):
        sc = np.clip(c0 + dc, 1, quant.U4_SCALE_CODES)
        scale = (d[:, None] * sc.astype(np.float32)).astype(np.float64)  # the float32 product
        z0 = np.rint(-lo / scale * quant.U4_ZERO_STEPS)
        steps = groups / scale[..., None]
        for dz in (-1, 0, 1):
            zc = np.clip(z0 + dz, 0, 15 * quant.U4_ZERO_STEPS)
            zero = zc / quant.U4_ZERO_STEPS
            e = np.add(steps, zero[..., None])  # what _u4_codes rounds, in place from here
            np.clip(np.rint(e, out=e), 0, 15, out=e)
            e -= zero[..., None]
            e *= scale[..., None]
            e -= groups
            e *= e
            err = np.add.accumulate(e, axis=2)[..., -1]
            better = err < best
            best = np.where(better, err, best)
            best_sc, best_zc = np.where(better, sc, best_sc), np.where(better, zc, best_zc)
    scale = (d[:, None] * best_sc.astype(np.float32)).astype(np.float64)
    codes = _u4_codes(groups, scale, best_zc / quant.U4_ZERO_STEPS)
    return codes.astype(np.uint8), best_sc.astype(np.uint8), best_zc.astype(np.uint8)
