"""MXFP4 weights (pack_linear(..., "mxfp4")): gpt-oss's e2m1 codes and e8m0 block scales, packed as
the checkpoint stores them.

The ground truth is transformers' own dequantization of the same blocks and scales
(`convert_moe_packed_tensors`, what it runs to load gpt-oss without the triton kernels): the packed
buffer must dequantize to it bit for bit, every scale 0..255 included (255, NaN in the OCP spec, is
2^128 there: ldexp). The kernels are then checked against numpy float64 over that weight, and with
identity rows of x, which read each weight back exactly through the kernel's own decoding.

The `isa` fixture runs every path this CPU has: portable and avx2 here (an AVX2-only host); the
avx512 kernel (linear_mxfp4_avx512.c) is compiled on every host but runs only where
K.supported_isa() is "avx512".
"""
import numpy as np
import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from dashinfer_server import kernels as K
from tests.helpers import kernel_threads
from tests.test_linear import check


def random_mxfp4(n, k, rng, scales=(118, 131)):
    """-> (blocks uint8 [N, K/32, 16], scales uint8 [N, K/32]) as a checkpoint holds them."""
    blocks = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
    return blocks, rng.integers(scales[0], scales[1] + 1, (n, k // 32), dtype=np.uint8)


def transformers_weight(blocks, scales, dtype=torch.float32):
    """transformers' dequantization, [N, K] float32 (it returns the experts' [E, K, N])."""
    out = convert_moe_packed_tensors(torch.from_numpy(blocks)[None], torch.from_numpy(scales)[None], dtype=dtype)
    return out[0].T.to(torch.float32).numpy()


def pack(blocks, scales):
    return K.pack_linear(blocks.reshape(blocks.shape[0], -1), "mxfp4", 32, scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", [(1, 256), (200, 256), (70, 2880)])
def test_dequantizes_bit_for_bit_as_transformers(n, k, dtype):
    rng = np.random.default_rng(n + k)
    blocks, scales = random_mxfp4(n, k, rng, scales=(0, 255))
    scales.flat[:6] = [0, 1, 2, 127, 254, 255]  # the subnormal scales, 1.0, the largest ones
    packed = pack(blocks, scales)
    assert K.unpack_linear(packed) == ("mxfp4", n, k, 32)
    assert packed.nbytes == 64 + 17 * k // 32 * (-(-n // 16) * 16)  # 4.25 bits a weight
    got, want = K.dequantize_linear(packed), transformers_weight(blocks, scales, dtype)
    assert np.isinf(want).any() and (np.abs(want[want != 0]) < 2.0**-126).any()  # the range's ends ran
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # -0.0 and inf included


# (M, N, K): decode rows 1-8 (one row block), batches past it, N not a multiple of the 64-column
# panel or of the 16-column vectors' pairs, gpt-oss's K = 2880
CASES = [(1, 64, 32), (2, 33, 64), (3, 200, 256), (4, 1, 96), (5, 130, 2880), (6, 16, 64), (7, 48, 128),
         (8, 576, 256), (9, 200, 256), (13, 70, 160), (37, 257, 64), (100, 64, 2880)]


@pytest.mark.parametrize("threads", [1, 3])
def test_linear_matches_float64(isa, threads):
    rng = np.random.default_rng(7)
    with kernel_threads(threads):
        for i, (m, n, k) in enumerate(CASES):
            blocks, scales = random_mxfp4(n, k, rng)
            w = transformers_weight(blocks, scales).astype(np.float64)
            x = rng.standard_normal((m, k)).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32) if i % 2 else None
            check(K.linear(x, pack(blocks, scales), bias), x, w, bias, "mxfp4", isa)


@pytest.mark.parametrize("m", [1, 3, 8, 11])
def test_identity_rows_read_every_weight_exactly(isa, m):
    """x = rows of the identity: y[i][n] = W[n][i], exactly (one product by 1, the rest by 0), for
    every scale whose weights are all finite (0..252; 6 * 2^126 is the largest)."""
    rng = np.random.default_rng(m)
    n, k = 200, 256
    blocks, scales = random_mxfp4(n, k, rng, scales=(0, 252))
    scales.flat[:4] = [0, 1, 2, 252]
    w = transformers_weight(blocks, scales)
    packed = pack(blocks, scales)
    for first in range(0, k, m * 7 + 1):
        rows = np.arange(first, min(first + m, k))
        x = np.eye(k, dtype=np.float32)[rows]
        np.testing.assert_array_equal(K.linear(x, packed), w[:, rows].T)


def test_linear_glu_takes_mxfp4():
    """The gate_up of gpt-oss's experts: linear_glu over an mxfp4 weight is linear then glu_mul."""
    rng = np.random.default_rng(3)
    blocks, scales = random_mxfp4(128, 64, rng)
    packed = pack(blocks, scales)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    out, gate_up = np.empty((5, 64), np.float32), np.empty((5, 128), np.float32)
    K.linear_glu(x, packed, gate_up, out, act="clamped_swiglu")
    separate = np.empty_like(out)
    K.glu_mul(K.linear(x, packed), separate, act="clamped_swiglu")
    np.testing.assert_array_equal(out, separate)


def test_bad_arguments_are_refused():
    rng = np.random.default_rng(4)
    blocks, scales = random_mxfp4(8, 64, rng)
    codes = blocks.reshape(8, -1)
    with pytest.raises(ValueError, match="mxfp4 has group_size 32"):
        K.pack_linear(codes, "mxfp4", 64, scales)
    with pytest.raises(ValueError, match="K a multiple of 32"):
        K.pack_linear(np.ascontiguousarray(codes[:, :20]), "mxfp4", 32, scales[:, :1].copy())
    with pytest.raises(ValueError, match="scales has size 1 in dimension 1"):
        K.pack_linear(codes, "mxfp4", 32, scales[:, :1].copy())
    with pytest.raises(TypeError, match="scales must be uint8"):
        K.pack_linear(codes, "mxfp4", 32, scales.astype(np.float32))
    with pytest.raises(ValueError, match="no zeros"):
        K.pack_linear(codes, "mxfp4", 32, scales, scales)
    assert K.unpack_linear(K.pack_linear(codes, "mxfp4", 0, scales))[3] == 32  # the one group size
