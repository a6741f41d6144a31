"""Linear kernels (pack_linear / linear) against a float64 numpy reference, on every ISA path.

Tolerance: the reference uses the exactly dequantized weights, (q - zero) * scale in float64.
Paths that stay fp32 (portable, avx2, avx512 with M <= 4, and f32 weights everywhere) must agree
to fp32 rounding. The avx512 path with M > 4 rounds activations to bf16 for vdpbf16ps (relative
error <= 2^-9 per term) and dequantizes i8/u4 weights to bf16 (another 2^-9), so there the bound
is |y - ref| <= (2^-9 per rounded operand) * sum_k |x w|. Each case also checks the relative RMS
error, which catches a dropped or doubled term long before the elementwise bound would.
"""
import threading

import numpy as np
import pytest

from dashinfer_client.dtypes import from_bf16, to_bf16
from dashinfer_server import kernels as K
from tests.helpers import kernel_threads

BF16_EPS = 2.0**-9  # relative rounding error of float32 -> bf16 (round to nearest)
GEMV_MAX_M = 4  # rows the avx512 path keeps in fp32


def quantize(wf, group, bits):
    """DashInstantQuant per-group asymmetric quantization -> (codes [N,K], scales, zeros, exact)."""
    n, k = wf.shape
    g = wf.reshape(n, k // group, group)
    qmax = (1 << bits) - 1
    lo, hi = g.min(-1), g.max(-1)
    scale = ((hi - lo) / qmax).astype(np.float32)
    scale[scale == 0] = 1
    zero = (-lo / scale).astype(np.float32)
    q = np.clip(np.rint(g / scale[..., None] + zero[..., None]), 0, qmax).astype(np.uint8)
    exact = (q.astype(np.float64) - zero[..., None]) * scale[..., None]
    return q.reshape(n, k), scale, zero, exact.reshape(n, k)


def make_weight(wtype, n, k, group, rng):
    """-> (packed, exact float64 weight [N,K])."""
    wf = rng.standard_normal((n, k)).astype(np.float32)
    if wtype == "f32":
        return K.pack_linear(wf, "f32"), wf.astype(np.float64)
    if wtype == "bf16":
        bits = to_bf16(wf)
        return K.pack_linear(bits, "bf16"), from_bf16(bits).astype(np.float64)
    if wtype == "u4":
        return u4_weight(n, k, group, rng)
    q, scale, zero, exact = quantize(wf, group, 8)
    return K.pack_linear(q, wtype, group, scale, zero), exact


def u4_weight(n, k, group, rng):
    """A u4 weight of random codes (native/linear.h): rows of different magnitudes, every scale
    code and zero code -> (packed, (q - zc/16) * (row * sc) in float64, the product in float32)."""
    q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    sc = rng.integers(1, 256, (n, k // group), dtype=np.uint8)
    zc = rng.integers(0, 241, (n, k // group), dtype=np.uint8)
    rows = (np.exp(rng.uniform(-3, 1, n)) / 255).astype(np.float32)
    scale = np.repeat((rows[:, None] * sc.astype(np.float32)).astype(np.float64), group, axis=1)
    exact = (q - np.repeat(zc / 16.0, group, axis=1)) * scale
    packed = K.pack_linear((q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8), "u4", group, sc, zc, rows)
    return packed, exact


def reference(x, wexact, bias):
    """-> (exact result, sum_k |x w| (+ |bias|): the scale of each output's rounding error)."""
    ref = x.astype(np.float64) @ wexact.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(wexact).T
    if bias is not None:
        ref += bias
        mag += np.abs(bias)
    return ref, mag


def check(y, x, wexact, bias, wtype, isa, expected=None):
    m = x.shape[0]
    ref, mag = expected or reference(x, wexact, bias)
    rounded = 0
    if isa == "avx512" and m > GEMV_MAX_M and wtype != "f32":
        rounded = 2 if wtype in ("i8", "u4") else 1
    rel = rounded * BF16_EPS * 1.001 + 2e-5
    err = np.abs(y.astype(np.float64) - ref)
    assert y.shape == ref.shape and y.dtype == np.float32
    assert np.all(err <= rel * mag + 1e-30), f"max excess {np.max(err - rel * mag)}"
    rms = np.sqrt(np.mean(err**2) / max(np.mean(ref**2), 1e-30))
    # one bf16 rounding of each term: ~1.6e-3 expected; two (i8/u4 weights too): sqrt(2) times
    # that, and 3.1e-3 on the 9 x 48 case here, as numpy's own double rounding gives
    assert rms < {0: 1e-4, 1: 3e-3, 2: 4.5e-3}[rounded], f"relative rms error {rms}"


# (M, N, K, group): every awkward M, N and K (not a multiple of 16/32) appears at least once;
# K = 4201 / 4224 spans several k blocks of the blocked loops.
DENSE_CASES = [(1, 1, 33, 0), (3, 7, 77, 0), (16, 33, 64, 0), (37, 1000, 33, 0), (64, 7, 576, 0),
               (200, 33, 77, 0), (513, 1000, 64, 0), (1, 1000, 576, 0), (5, 64, 128, 0),
               (4, 130, 96, 0), (2, 1536, 64, 0), (13, 200, 1000, 0), (7, 40, 4201, 0)]
QUANT_CASES = [(1, 1, 64, 32), (3, 7, 128, 64), (16, 33, 256, 128), (37, 1000, 256, 256),
               (64, 7, 96, 96), (200, 33, 64, 32), (513, 1000, 128, 64), (1, 1000, 512, 128),
               (4, 130, 256, 32), (2, 1536, 128, 128), (13, 200, 1024, 256), (9, 48, 64, 64),
               (7, 40, 4224, 128)]  # K past one k block of the microkernel loop


_cases = {}


def cases(wtype):
    """Packed weights, inputs and references, built once and shared by every ISA path."""
    if wtype not in _cases:
        rng = np.random.default_rng(1)
        _cases[wtype] = []
        for i, (m, n, k, group) in enumerate(DENSE_CASES if wtype in ("f32", "bf16") else QUANT_CASES):
            packed, wexact = make_weight(wtype, n, k, group, rng)
            x = rng.standard_normal((m, k)).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32) if i % 2 == 0 else None
            _cases[wtype].append((packed, x, bias, reference(x, wexact, bias)))
    return _cases[wtype]


@pytest.mark.parametrize("wtype", ["f32", "bf16", "i8", "u4"])
def test_linear_matches_reference(isa, wtype):
    for i, (packed, x, bias, expected) in enumerate(cases(wtype)):
        m, n = x.shape[0], expected[0].shape[1]
        if i % 3 == 0:
            out = np.full((m, n), np.nan, np.float32)
            y = K.linear(x, packed, bias, out)
            assert y is out
        else:
            y = K.linear(x, packed, bias=bias)
        check(y, x, None, bias, wtype, isa, expected)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("wtype", ["bf16", "i8", "u4", "f32"])
def test_threads_agree(isa, wtype, threads):
    """Threads share the (panel, row block) grid, cutting inside a panel when the panels do not
    divide evenly (576 columns = 9 panels)."""
    rng = np.random.default_rng(2)
    with kernel_threads(threads):
        for n in (200, 576):
            packed, wexact = make_weight(wtype, n, 256, 64 if wtype in ("i8", "u4") else 0, rng)
            for m in (1, 3, 8, 37):
                x = rng.standard_normal((m, 256)).astype(np.float32)
                check(K.linear(x, packed), x, wexact, None, wtype, isa)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("wtype", ["bf16", "i8", "u4", "f32"])
def test_batched_decode_rows(isa, wtype, threads):
    """Every M of a batched decode step (row blocks of 6 and the rest, 1 to 6 blocks; AVX2's
    GEMV up to 8 rows, 4 at a time, for bf16/i8/u4), with a narrow last panel (200 = 3 x 64 + 8
    columns), bias, K within one k block and past it (bf16), several groups (i8, u4), odd (f32)."""
    rng = np.random.default_rng(8)
    for k in {"f32": (77,), "bf16": (1030, 4210), "i8": (640,), "u4": (256, 640)}[wtype]:
        packed, wexact = make_weight(wtype, 200, k, {"u4": 32, "i8": 64}.get(wtype, 0), rng)
        bias = rng.standard_normal(200).astype(np.float32)
        with kernel_threads(threads):
            for m in (5, 6, 7, 8, 10, 11, 12, 13, 16, 17, 23, 24, 31, 32, 33):
                x = rng.standard_normal((m, k)).astype(np.float32)
                check(K.linear(x, packed, bias), x, wexact, bias, wtype, isa)


@pytest.mark.parametrize("wtype", ["bf16", "i8", "u4"])
def test_decode_rows_and_long_groups(isa, wtype):
    """M = 1..4 (the GEMV rows: its column blocks, its k blocks of 128 with a ragged last one,
    prefetches of the next block), then M = 19 (the GEMM): N = 1000 ends in a 48-column panel,
    200 in a 16-column one; per-channel groups (group = K = 600, 330) straddle the GEMM's k slices
    of 256 and, with i8, K = 331 is odd."""
    rng = np.random.default_rng(9)
    ks = {"bf16": ((600, 0), (331, 0)), "i8": ((600, 600), (331, 331), (640, 64)),
          "u4": ((600, 600), (330, 330), (640, 32))}[wtype]
    for n in (1000, 200):
        for k, group in ks:
            packed, wexact = make_weight(wtype, n, k, group, rng)
            bias = rng.standard_normal(n).astype(np.float32)
            for m in (1, 2, 3, 4, 19):
                x = rng.standard_normal((m, k)).astype(np.float32)
                check(K.linear(x, packed, bias if m % 2 else None), x, wexact, bias if m % 2 else None,
                      wtype, isa)


def test_i8_odd_k_single_group(isa):
    """group_size = K allows an odd K for i8; the padded k must not leak into the result."""
    rng = np.random.default_rng(3)
    packed, wexact = make_weight("i8", 21, 45, 45, rng)
    for m in (1, 2, 7):
        x = rng.standard_normal((m, 45)).astype(np.float32)
        check(K.linear(x, packed), x, wexact, None, "i8", isa)


def test_misaligned_copy_of_packed_buffer(isa):
    rng = np.random.default_rng(4)
    packed, wexact = make_weight("bf16", 70, 96, 0, rng)
    moved = np.empty(packed.size + 3, np.uint8)[3:]
    moved[:] = packed
    x = rng.standard_normal((6, 96)).astype(np.float32)
    np.testing.assert_array_equal(K.linear(x, moved), K.linear(x, packed))


def test_unpack_linear_reports_the_header():
    rng = np.random.default_rng(5)
    for wtype, group in (("f32", 0), ("bf16", 0), ("i8", 32), ("u4", 64)):
        packed, _ = make_weight(wtype, 10, 128, group, rng)
        assert K.unpack_linear(packed) == (wtype, 10, 128, group)
        assert packed.dtype == np.uint8 and packed.ndim == 1


def test_two_python_threads_at_once(isa):
    rng = np.random.default_rng(6)
    work = []
    for m in (1, 9, 40, 3):
        packed, wexact = make_weight("u4", 300, 256, 32, rng)
        work.append((rng.standard_normal((m, 256)).astype(np.float32), packed, wexact))
    results = {}

    def run(i):
        x, packed, _ = work[i]
        results[i] = [K.linear(x, packed) for _ in range(5)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (x, _, wexact) in enumerate(work):
        for y in results[i]:
            check(y, x, wexact, None, "u4", isa)


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(7)
    packed, _ = make_weight("bf16", 8, 32, 0, rng)
    return packed, rng.standard_normal((3, 32)).astype(np.float32)


def test_linear_rejects_bad_arguments(small):
    packed, x = small
    cases = [
        (TypeError, "x must be float32", lambda: K.linear(x.astype(np.float64), packed)),
        (TypeError, "packed must be uint8", lambda: K.linear(x, packed.view(np.float32))),
        (ValueError, "x has size 16", lambda: K.linear(x[:, :16].copy(), packed)),
        (ValueError, "x must have 2 dimensions", lambda: K.linear(x[0], packed)),
        (ValueError, "C-contiguous", lambda: K.linear(np.ones((3, 64), np.float32)[:, ::2], packed)),
        (ValueError, "bias has size 7", lambda: K.linear(x, packed, np.ones(7, np.float32))),
        (TypeError, "bias must be float32", lambda: K.linear(x, packed, np.ones(8, np.int32))),
        (ValueError, "out has size 4", lambda: K.linear(x, packed, None, np.empty((4, 8), np.float32))),
        (ValueError, "out has size 9", lambda: K.linear(x, packed, None, np.empty((3, 9), np.float32))),
        (TypeError, "out must be float32", lambda: K.linear(x, packed, None, np.empty((3, 8)))),
        (ValueError, "writable", lambda: K.linear(x, packed, None, np.frombuffer(bytes(96), np.float32).reshape(3, 8))),
        (ValueError, "bad magic", lambda: K.linear(x, np.zeros(4096, np.uint8))),
        (ValueError, "too short", lambda: K.linear(x, np.zeros(10, np.uint8))),
        (ValueError, "truncated", lambda: K.linear(x, packed[:-1].copy())),
        (TypeError, "required", lambda: K.linear(x, None)),
    ]
    for exc, text, call in cases:
        with pytest.raises(exc, match=text):
            call()
    corrupt = packed.copy()
    corrupt[16:24] = np.frombuffer(np.int64(1000).tobytes(), np.uint8)  # N no longer matches the sizes
    with pytest.raises(ValueError, match="corrupt header"):
        K.linear(x, corrupt)
    big = np.zeros((3, 32), np.float32)
    with pytest.raises(ValueError, match="share memory"):
        K.linear(big, K.pack_linear(np.zeros((32, 32), np.float32), "f32"), None, big)


def test_pack_rejects_bad_arguments():
    w8 = np.zeros((4, 64), np.uint8)
    sz, c8 = np.ones((4, 2), np.float32), np.ones((4, 2), np.uint8)
    cases = [
        (ValueError, "unknown wtype 'fp8'", lambda: K.pack_linear(np.zeros((4, 64), np.float32), "fp8")),
        (TypeError, "w must be float32", lambda: K.pack_linear(np.zeros((4, 64)), "f32")),
        (TypeError, r"w must be uint16 \(bf16 bits\)", lambda: K.pack_linear(np.zeros((4, 64), np.float32), "bf16")),
        (ValueError, "multiple of group_size", lambda: K.pack_linear(np.zeros((4, 48), np.uint8), "i8", 32, np.ones((4, 1), np.float32), np.ones((4, 1), np.float32))),
        (ValueError, "must be 32, 64, 128, 256 or K", lambda: K.pack_linear(w8, "i8", 16, np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))),
        (ValueError, "needs group_size", lambda: K.pack_linear(w8, "i8")),
        (TypeError, "scales is required", lambda: K.pack_linear(w8, "i8", 32)),
        (ValueError, "scales has size 3", lambda: K.pack_linear(w8, "i8", 32, np.ones((4, 3), np.float32), sz)),
        (ValueError, "zeros has size 5", lambda: K.pack_linear(w8, "i8", 32, sz, np.ones((5, 2), np.float32))),
        (ValueError, "apply to i8/u4 only", lambda: K.pack_linear(np.zeros((4, 64), np.float32), "f32", 0, sz)),
        (ValueError, "group_size applies to i8/u4 only", lambda: K.pack_linear(np.zeros((4, 64), np.float32), "f32", 32)),
        (ValueError, "at least 1", lambda: K.pack_linear(np.zeros((0, 64), np.float32), "f32")),
        (TypeError, "scales must be uint8", lambda: K.pack_linear(np.zeros((4, 32), np.uint8), "u4", 32, sz, sz)),
        (TypeError, "row_scales is required", lambda: K.pack_linear(np.zeros((4, 32), np.uint8), "u4", 32, c8, c8)),
        (ValueError, "row_scales has size 3",
         lambda: K.pack_linear(np.zeros((4, 32), np.uint8), "u4", 32, c8, c8, np.ones(3, np.float32))),
        (ValueError, "row_scales apply to u4/u4q only", lambda: K.pack_linear(w8, "i8", 32, sz, sz, np.ones(4, np.float32))),
    ]
    for exc, text, call in cases:
        with pytest.raises(exc, match=text):
            call()
