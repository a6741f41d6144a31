"""linear_glu (the gate_up linear with act(gate) * up as its store, act SiLU, GELU-tanh or gpt-oss's
clamped SwiGLU) against a float64 reference (numpy's SiLU and clamped SwiGLU, torch's
gelu(approximate="tanh")), and bit for bit against linear then glu_mul, on every ISA path and
weight type.

Where the path fuses (AVX-512, M > 4, I a multiple of 64) the GEMM stores act(g) * u from the
very floats linear would have stored, so the two must agree exactly; elsewhere linear_glu is
linear then glu_mul. The reference bound is test_linear's on g and u, carried through act
(|silu'(g)| < 1.1, |gelu_tanh'(g)| < 1.13, and so for g sigmoid(1.702 g)).
"""
import numpy as np
import pytest
import torch

from dashinfer_server import kernels as K
from tests.helpers import kernel_threads
from tests.test_linear import BF16_EPS, GEMV_MAX_M, make_weight

KC = 2048  # k per block of the AVX-512 GEMM: past it, gate_up holds the up half's partial sums

# (M, I, K): fused shapes (I a multiple of 64, M > 4), one with K past one k block of the
# microkernel loop, and shapes that take the unfused way (M <= 4, I = 40 or 100)
SHAPES = [(5, 64, 128), (37, 128, 576), (200, 192, 256), (7, 64, 4224), (1, 64, 64), (3, 40, 128),
          (13, 100, 128)]


def activation(g, act):
    if act == "silu":
        return g / (1 + np.exp(-g))
    if act == "clamped_swiglu":  # gpt-oss (test_glu_clamped_swiglu.py holds it to transformers)
        g = np.minimum(g, 7.0)
        return g / (1 + np.exp(-1.702 * g))
    return torch.nn.functional.gelu(torch.from_numpy(g), approximate="tanh").numpy()


def check(out, x, wexact, wtype, isa, act):
    m, inter = out.shape
    ref_gu = x.astype(np.float64) @ wexact.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(wexact).T
    g, u, mag_g, mag_u = ref_gu[:, :inter], ref_gu[:, inter:], mag[:, :inter], mag[:, inter:]
    rounded = 0
    if isa == "avx512" and m > GEMV_MAX_M and wtype != "f32":
        rounded = 2 if wtype in ("i8", "u4") else 1
    rel = rounded * BF16_EPS * 1.001 + 2e-5
    a = activation(g, act)
    if act == "clamped_swiglu":
        u = np.clip(u, -7.0, 7.0) + 1
    ref = a * u
    tol = rel * (1.13 * mag_g * (np.abs(u) + rel * mag_u) + np.abs(a) * mag_u) + 1e-6 * np.abs(ref)
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= tol + 1e-30), f"max excess {np.max(err - tol)}"


@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "clamped_swiglu"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("wtype", ["f32", "bf16", "i8", "u4"])
def test_linear_glu_matches_reference_and_linear_then_glu(isa, wtype, threads, act):
    rng = np.random.default_rng(4)
    with kernel_threads(threads):
        for m, inter, k in SHAPES:
            if wtype in ("f32", "bf16") and k == 4224:
                k = 4201  # odd K: the padded pair of the bf16 layout
            packed, wexact = make_weight(wtype, 2 * inter, k, 0 if wtype in ("f32", "bf16") else 64, rng)
            x = rng.standard_normal((m, k)).astype(np.float32)
            gate_up = np.full((m, 2 * inter), np.nan, np.float32)
            out = np.full((m, inter), np.nan, np.float32)
            assert K.linear_glu(x, packed, gate_up, out, act=act) is out
            check(out, x, wexact, wtype, isa, act)
            # AMX tiles (bf16 on an AMX CPU) fuse at any K
            amx = wtype == "bf16" and K.amx() == "tiles"
            if isa == "avx512" and m > GEMV_MAX_M and inter % 64 == 0 and (k <= KC or amx):
                assert np.isnan(gate_up).all()  # fused: nothing went through the scratch
            separate = np.empty((m, inter), np.float32)
            K.glu_mul(K.linear(x, packed), separate, act=act)
            np.testing.assert_array_equal(out, separate)


def test_linear_glu_rejects_bad_arguments():
    rng = np.random.default_rng(5)
    packed, _ = make_weight("bf16", 128, 64, 0, rng)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    gate_up, out = np.zeros((8, 128), np.float32), np.zeros((8, 64), np.float32)
    with pytest.raises(ValueError, match="out"):
        K.linear_glu(x, packed, gate_up, np.zeros((8, 65), np.float32))
    with pytest.raises(ValueError, match="gate_up"):
        K.linear_glu(x, packed, np.zeros((7, 128), np.float32), out)
    with pytest.raises(ValueError, match="share memory"):
        K.linear_glu(x, packed, gate_up, gate_up.reshape(16, 64)[:8])
    odd, _ = make_weight("bf16", 127, 64, 0, rng)
    with pytest.raises(ValueError, match="gate and up"):
        K.linear_glu(x, odd, np.zeros((8, 127), np.float32), out)
    with pytest.raises(ValueError, match="act must be 'silu', 'gelu_tanh' or 'clamped_swiglu', got 'gelu_erf'"):
        K.linear_glu(x, packed, gate_up, out, act="gelu_erf")
    assert not out.any()  # nothing written
