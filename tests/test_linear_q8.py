"""i8q / u4q linear weights (int8 activations, vpdpbusd where the CPU has AVX512-VNNI) against numpy.

The kernels quantize each row of x per block of 32 k: d = max|x| / 127, xq = rint(x / d). Two
references: (1) numpy doing the same quantization, xhat = d * xq, times the dequantized weights
in float64: the kernels must agree to fp32 rounding of their sums; (2) the exact x: there the
error is that of xhat, at most d / 2 per element, so |y - x.W^T| <= sum_k |w_k| d_k / 2.
"""
import numpy as np
import pytest

from dashinfer_client.model.quant import quantize, unpack_codes
from dashinfer_server import kernels as K
from tests.helpers import kernel_threads

BLOCK = 32


@pytest.fixture(autouse=True)
def int8_kernels():
    """These are the int8 kernels' tests: AMX off, whose tiles take i8q/u4q from 32 rows up
    (tests/test_linear_amx.py checks them there)."""
    before = K.amx()
    K.set_amx("off")
    yield
    K.set_amx(before)


def pack(wtype, n, k, group, rng, w=None):
    """-> (packed, the weight [N,K] float64 the kernels compute with) of a random weight (or w)."""
    fmt = "int8" if wtype == "i8q" else "uint4"
    parts = quantize(rng.standard_normal((n, k)).astype(np.float32) if w is None else w, fmt, group)
    return K.pack_linear(parts[0], wtype, group, *parts[1:]), weight(parts, fmt, group)


def stored_scales(scale, zero):
    """i8q's (scale, scale*zero) as the packed weight keeps them (native/linear.h): both times 2^e
    in fp16 (numpy's rounding), e putting the largest of them all in [2^14, 2^15)."""
    sz = (scale * zero).astype(np.float32)
    top = max(np.abs(scale).max(), np.abs(sz).max())
    e = 15 - int(np.frexp(top)[1])  # frexp: top = f * 2^x, f in [0.5, 1)
    return tuple(np.ldexp(np.ldexp(v.astype(np.float64), e).astype(np.float16).astype(np.float64), -e)
                 for v in (scale, sz))


def weight(parts, fmt, group):
    """The weight the kernels compute with: q * scale - scale*zero. i8q: both as stored in fp16;
    u4q: scale = row scale * scale code and scale * (zero code / 16), each a float32 product."""
    if fmt == "int8":
        s, sz = stored_scales(parts[1], parts[2])
    else:
        _, sc, zc, rows = parts
        s = rows[:, None] * sc.astype(np.float32)
        sz = s * (zc.astype(np.float32) / np.float32(16))
    s, sz = (np.repeat(v.astype(np.float64), group, axis=1) for v in (s, sz))
    return unpack_codes(parts[0], fmt).astype(np.float64) * s - sz


def quantize_x(x):
    """-> (xhat float64, d per element): the activations as the kernels see them."""
    m, k = x.shape
    blocks = x.reshape(m, k // BLOCK, BLOCK)
    amax = np.abs(blocks).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    xq = np.rint(blocks * inv).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float32)
    xhat = (xq.astype(np.float64) * d).reshape(m, k)
    return xhat, np.broadcast_to(d, blocks.shape).reshape(m, k).astype(np.float64)


def check(y, x, w, bias):
    xhat, d = quantize_x(x)
    b = 0 if bias is None else bias.astype(np.float64)
    same = xhat @ w.T + b
    mag = np.abs(xhat) @ np.abs(w).T + np.abs(b)
    err = np.abs(y - same)
    assert np.all(err <= 2e-5 * mag + 1e-30), f"vs quantized-x reference: max excess {np.max(err - 2e-5 * mag)}"
    exact = x.astype(np.float64) @ w.T + b
    bound = (d / 2) @ np.abs(w).T + 2e-5 * mag
    assert np.all(np.abs(y - exact) <= bound), "vs exact x: beyond the activation quantization bound"
    if y.size >= 64:  # int8 activations: ~0.6% rms (d / sqrt(12) per element of unit x)
        rms = np.sqrt(np.mean((y - exact) ** 2) / np.mean(exact**2))
        assert rms < 0.02, f"relative rms error {rms}"


# (M, N, K, group): per channel (group = K), several groups, K spanning many blocks, N not a
# multiple of 16, M on both sides of the 2-row tile; M = 16 over several panels, the last narrower;
# several row tiles over K in chunks of 256 (the last one shorter), u4q unpacked (M >= 8), more
# rows than one block of 32 takes a chunk at a time, the next chunk prefetched across panels
CASES = [(1, 1, 64, 32), (2, 40, 128, 64), (3, 200, 256, 128), (8, 64, 96, 96), (37, 130, 256, 256),
         (1, 1000, 4224, 128), (5, 48, 512, 512), (1, 576, 1536, 64), (16, 200, 256, 32),
         (3, 70, 576, 64), (8, 200, 1536, 32), (40, 130, 640, 64), (71, 80, 1088, 32)]


@pytest.mark.parametrize("wtype", ["i8q", "u4q"])
def test_matches_reference(isa, wtype):
    rng = np.random.default_rng(3)
    for i, (m, n, k, group) in enumerate(CASES):
        packed, w = pack(wtype, n, k, group, rng)
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :BLOCK] = 0  # an all-zero block: d = 0
        bias = rng.standard_normal(n).astype(np.float32) if i % 2 else None
        check(K.linear(x, packed, bias), x, w, bias)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_agree(isa, threads):
    rng = np.random.default_rng(4)
    with kernel_threads(threads):
        for wtype in ("i8q", "u4q"):
            packed, w = pack(wtype, 576, 256, 64, rng)
            for m in (1, 3, 8, 37):
                x = rng.standard_normal((m, 256)).astype(np.float32)
                check(K.linear(x, packed), x, w, None)


def test_paths_agree_on_the_same_buffer():
    """The VNNI kernel and the portable one compute the same sums (to fp32 rounding)."""
    rng = np.random.default_rng(5)
    packed, *_ = pack("u4q", 100, 256, 64, rng)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    best = K.isa()
    y = K.linear(x, packed)
    try:
        K.set_isa("portable")
        y_portable = K.linear(x, packed)
    finally:
        K.set_isa(best)
    np.testing.assert_allclose(y, y_portable, rtol=1e-4, atol=1e-4)


def test_refuses_groups_that_are_not_whole_blocks():
    q = np.zeros((4, 48), np.uint8)
    ones = np.ones((4, 1), np.float32)
    with pytest.raises(ValueError, match="multiple of 32"):
        K.pack_linear(q, "i8q", 48, ones, ones)
    codes = np.ones((4, 1), np.uint8)
    assert K.unpack_linear(K.pack_linear(np.zeros((4, 32), np.uint8), "u4q", 64, codes, codes, ones[:, 0]))[0] == "u4q"


def test_fp16_scales_round_within_half_an_ulp():
    """Every stored scale and scale*zero is within 2^-11 of the fp32 value (a normal fp16 after the
    shift), so a weight moves by at most 2^-11 of its group's range: 1/16 of an int8 code step."""
    rng = np.random.default_rng(6)
    for spread in (1e-3, 1.0, 1e3):  # groups whose ranges differ by up to 10^6 in one weight
        w = rng.standard_normal((64, 256)) * np.exp(rng.uniform(-0.5, 0.5, (64, 1)) * np.log(spread))
        _, scale, zero = quantize(w.astype(np.float32), "int8", 32)
        for stored, want in zip(stored_scales(scale, zero), (scale, (scale * zero).astype(np.float32))):
            assert np.all(np.abs(stored - want) <= 2.0**-11 * np.abs(want))


@pytest.mark.parametrize("magnitude", [1e-30, 1e-6, 1e6, 1e30])
def test_weights_of_any_magnitude(isa, magnitude):
    """i8q's per-weight exponent keeps fp16 scales normal, and u4q's float32 row scales hold
    weights of any fp32 magnitude."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 128)).astype(np.float32)
    for wtype in ("i8q", "u4q"):
        packed, w = pack(wtype, 40, 128, 32, rng, (rng.standard_normal((40, 128)) * magnitude).astype(np.float32))
        check(K.linear(x, packed), x, w, None)


def test_refuses_a_buffer_of_another_layout_version():
    rng = np.random.default_rng(8)
    packed, *_ = pack("i8q", 16, 64, 32, rng)
    stale = packed.copy()
    stale[8:12] = np.frombuffer(np.uint32(2).tobytes(), np.uint8)  # version 2: u4's float32 group pairs
    with pytest.raises(ValueError, match="another version"):
        K.linear(np.ones((1, 64), np.float32), stale)
    bad_exp = packed.copy()
    bad_exp[44:48] = np.frombuffer(np.int32(1000).tobytes(), np.uint8)
    with pytest.raises(ValueError, match="scale exponent"):
        K.unpack_linear(bad_exp)
