"""The AMX driver of bf16, i8q and u4q linears (native/linear_amx.c) against a float64 numpy reference.

On a CPU without AMX the driver runs with its tile multiply emulated in plain C (DASHINFER_AMX=
emulated, K.set_amx): the same activation rounding, packing strides, k-pair tails, column tiles,
row blocks and thread shares as on AMX tiles, only the tile instructions differ (and, on a CPU
without AVX-512, the rounding and stores run in their portable form). Where the CPU has AMX, the
same cases run on the tiles too. The bound is test_linear's for the avx512 path:
activations rounded to bf16 once (2^-9 relative per term), weights exact, fp32 sums.
"""
import numpy as np
import pytest

from dashinfer_server import kernels as K
from tests.helpers import kernel_threads
from tests.test_linear import check, make_weight
from tests.test_linear_glu import check as check_glu
from tests.test_linear_q8 import check as check_int8_activations
from tests.test_linear_q8 import pack as pack_q8

MODES = ["emulated"] + (["tiles"] if K.amx_available() else [])


@pytest.fixture(params=MODES)
def amx(request):
    """bf16 GEMMs on the AMX driver in this mode, then back to the default."""
    before = K.amx()
    K.set_amx(request.param)
    assert K.amx() == request.param
    yield request.param
    K.set_amx(before)


# (M, N, K): row blocks of 32 and a 16-row tail (5, 16, 17, 33, 200), a last panel of 48 columns
# (N = 1000: one column tile of 16 after a pair) and of 16 (N = 7, 33), K not a whole tile step
# of 32 (77, 4201), K of exact steps (64, 576), bias on every other case; K past one k chunk of
# 1024 (4201, 1536, 1100) and rows past one pass of 256 (300); passes of one row block over full
# panels run a row tile across 64 columns (5, 16, and 29 rows: two row tiles, a k tail, two chunks)
SHAPES = [(5, 64, 64), (16, 1000, 77), (17, 7, 576), (33, 33, 4201), (200, 130, 96), (37, 256, 1536),
          (300, 80, 1100), (29, 128, 1100)]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_amx_bf16_matches_reference(amx, threads):
    rng = np.random.default_rng(11)
    with kernel_threads(threads):
        for i, (m, n, k) in enumerate(SHAPES):
            packed, wexact = make_weight("bf16", n, k, 0, rng)
            x = rng.standard_normal((m, k)).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32) if i % 2 == 0 else None
            check(K.linear(x, packed, bias), x, wexact, bias, "bf16", "avx512")


def test_amx_rounds_activations_like_the_tiles(amx):
    """Products of bf16-exact inputs are exact: with x already bf16 and small integer weights,
    every output is an exact integer, so any lost or doubled k pair, row or column shows."""
    rng = np.random.default_rng(12)
    # the second sums three k chunks; the third runs row tiles across whole panels, with a k tail,
    # the fourth only a k tail
    for m, n, k in [(40, 96, 200), (37, 64, 2100), (29, 128, 2100), (12, 64, 20)]:
        w = rng.integers(-4, 5, (n, k)).astype(np.float32)
        x = rng.integers(-8, 9, (m, k)).astype(np.float32)
        packed = K.pack_linear((w.view(np.uint32) >> 16).astype(np.uint16), "bf16")
        y = K.linear(x, packed)
        assert np.array_equal(y.astype(np.float64), x.astype(np.float64) @ w.T.astype(np.float64))


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_amx_linear_glu(amx, act):
    """gate_up under AMX: where I is a multiple of 64 the driver stores act(g) * u from its sums of
    the gate and the up panel (the gate_up scratch untouched), else linear then glu_mul; either
    way bit for bit what linear then glu_mul give."""
    rng = np.random.default_rng(13)
    for m, inter, k in [(5, 64, 128), (37, 128, 576), (7, 40, 77), (260, 192, 1100)]:
        packed, wexact = make_weight("bf16", 2 * inter, k, 0, rng)
        x = rng.standard_normal((m, k)).astype(np.float32)
        out, gate_up = np.empty((m, inter), np.float32), np.full((m, 2 * inter), np.nan, np.float32)
        K.linear_glu(x, packed, gate_up, out, act=act)
        check_glu(out, x, wexact, "bf16", "avx512", act)
        assert np.isnan(gate_up).all() == (inter % 64 == 0)
        separate = np.empty((m, inter), np.float32)
        K.glu_mul(K.linear(x, packed), separate, act=act)
        np.testing.assert_array_equal(out, separate)


def test_amx_leaves_small_batches_to_the_isa_path(amx):
    """M <= 4 runs the ISA path's kernels (fp32 activations: the AVX-512 GEMV, or AVX2/portable
    FMAs): within fp32 rounding of the reference, far inside the bf16 bound the tiles would need."""
    rng = np.random.default_rng(14)
    packed, wexact = make_weight("bf16", 200, 256, 0, rng)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    check(K.linear(x, packed), x, wexact, None, "bf16", "avx2")  # the fp32 bound


# (M, N, K, group) of i8q/u4q weights on the tiles (M >= 32): per channel (group = K) and groups
# of 32 to 256, K past one k chunk of 1024 (a chunk dequantized at a time), N not a multiple of
# 64 (a last panel of 16 or 48 columns), rows past one pass of 256
QUANT_SHAPES = [(32, 64, 64, 32), (70, 1000, 1536, 64), (100, 7, 2048, 128), (300, 130, 256, 256),
                (65, 48, 96, 96), (129, 200, 1088, 32)]


@pytest.mark.parametrize("wtype", ["i8q", "u4q"])
@pytest.mark.parametrize("threads", [1, 3])
def test_amx_quantized_weights_match_reference(amx, wtype, threads):
    """i8q/u4q panels dequantized a k chunk at a time into bf16 pairs (native/linear_amx_panels.c):
    two bf16 roundings a term (the weight's float value and the activation), fp32 sums: the bound
    test_linear gives i8/u4 weights on the AVX-512 GEMM, against the weight the int8 kernels use."""
    rng = np.random.default_rng(15)
    with kernel_threads(threads):
        for i, (m, n, k, group) in enumerate(QUANT_SHAPES):
            packed, w = pack_q8(wtype, n, k, group, rng)
            x = rng.standard_normal((m, k)).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32) if i % 2 else None
            check(K.linear(x, packed, bias), x, w, bias, "i8", "avx512")


@pytest.mark.parametrize("wtype", ["i8q", "u4q"])
def test_amx_quantized_gate_up(amx, wtype):
    rng = np.random.default_rng(16)
    for m, inter, k, group in [(64, 64, 128, 32), (80, 192, 1100 // 32 * 32, 32), (90, 40, 256, 64)]:
        packed, w = pack_q8(wtype, 2 * inter, k, group, rng)
        x = rng.standard_normal((m, k)).astype(np.float32)
        out, gate_up = np.empty((m, inter), np.float32), np.empty((m, 2 * inter), np.float32)
        K.linear_glu(x, packed, gate_up, out, act="silu")
        check_glu(out, x, w, "i8", "avx512", "silu")


def test_amx_leaves_small_quantized_batches_to_the_int8_kernels(amx):
    """Under 32 rows i8q/u4q stay on their int8-activation kernels (a quarter to half the bytes of
    bf16 and nothing to dequantize): the int8 reference holds there, and not at 32 rows, where
    the tiles' bf16 activations are far closer to the exact product."""
    rng = np.random.default_rng(17)
    packed, w = pack_q8("u4q", 200, 256, 32, rng)
    x = rng.standard_normal((32, 256)).astype(np.float32)
    check_int8_activations(K.linear(x[:31], packed), x[:31], w, None)
    with pytest.raises(AssertionError, match="quantized-x reference"):
        check_int8_activations(K.linear(x, packed), x, w, None)
    check(K.linear(x, packed), x, w, None, "i8", "avx512")


def test_set_amx_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="unknown mode"):
        K.set_amx("fast")
    if not K.amx_available():
        with pytest.raises(ValueError, match="no AMX tiles here"):
            K.set_amx("tiles")
        assert K.amx() == "off"  # the default where tiles cannot run
