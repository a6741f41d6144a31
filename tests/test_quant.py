"""InstantQuant: per-group asymmetric int8 / uint4, the error bound, packing, and refusals."""
import numpy as np
import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model.quant import InstantQuantSettings, dequantize, quantize, unpack_codes
from tests.quant_reference import ragged_reference, u4_reference

LEVELS = {"int8": 255, "uint4": 15}


def weight(n, k, seed=0):
    rng = np.random.default_rng(seed)
    # rows of very different magnitudes and a shifted mean, so groups are not symmetric around 0
    return (rng.standard_normal((n, k)) * rng.uniform(0.01, 3.0, (n, 1)) + rng.uniform(-1, 1, (n, 1))).astype(np.float32)


def check_bound(w, fmt, group):
    parts = quantize(w, fmt, group)
    q, scales, zeros = parts[:3]
    n, k = w.shape
    g = k if group == -1 else group
    assert scales.shape == zeros.shape == (n, -(-k // g)) and q.dtype == np.uint8
    assert q.shape == (n, k if fmt == "int8" else k // 2)
    deq = dequantize(parts, fmt, group)
    if fmt == "int8":
        assert scales.dtype == zeros.dtype == np.float32
        bound = np.repeat(scales, g, axis=1) / 2
        slack = 4 * np.finfo(np.float32).eps * (np.abs(w) + np.repeat(np.abs(zeros * scales), g, axis=1))
        assert (np.abs(deq - w) <= bound + slack).all()
    else:  # the rule, group by group in float64 (tests/helpers.py)
        codes, sc, zc, rows, ref = u4_reference(w, g)
        assert np.array_equal(unpack_codes(q, fmt), codes) and np.array_equal(scales, sc)
        assert np.array_equal(zeros, zc) and np.array_equal(parts[3], rows)
        np.testing.assert_allclose(deq, ref, rtol=1e-6, atol=1e-6 * np.abs(w).max())
    return parts


@pytest.mark.parametrize("fmt", ["int8", "uint4"])
@pytest.mark.parametrize("shape,group", [((7, 128), 32), ((5, 192), 64), ((3, 96), -1), ((1, 64), 64), ((9, 24), 8)])
def test_error_within_half_a_step(fmt, shape, group):
    check_bound(weight(*shape), fmt, group)


def test_formula_and_full_code_range():
    w = weight(4, 64, seed=3)
    q, scales, zeros = quantize(w, "int8", 16)
    groups = w.reshape(4, 4, 16).astype(np.float64)
    lo, hi = groups.min(axis=2), groups.max(axis=2)
    np.testing.assert_allclose(scales, (hi - lo) / 255, rtol=1e-6)
    np.testing.assert_allclose(zeros, -lo / scales, rtol=1e-5)
    codes = unpack_codes(q, "int8").reshape(4, 4, 16)
    assert (codes.min(axis=2) == 0).all() and (codes.max(axis=2) == 255).all()


def test_uint4_in_4_5_bits_no_worse_than_float32_pairs():
    """Heavy-tailed weights with rows and columns of different magnitudes: the codes' error is
    at most that of per-group float32 (min, max) scales (6 bits a weight), numpy float64."""
    rng = np.random.default_rng(7)
    w = (rng.standard_t(5, (96, 512)) * np.exp(rng.normal(0, 0.5, (96, 1))) * np.exp(rng.normal(0, 0.5, (1, 512))))
    w = w.astype(np.float32)
    groups = w.reshape(96, 16, 32).astype(np.float64)
    lo, hi = groups.min(axis=2, keepdims=True), groups.max(axis=2, keepdims=True)
    step = (hi - lo) / 15
    pairs = (np.clip(np.rint((groups - lo) / step), 0, 15) * step + lo).reshape(96, 512)
    err = dequantize(quantize(w, "uint4", 32), "uint4", 32) - w
    assert np.sqrt(np.mean(err.astype(np.float64) ** 2)) <= np.sqrt(np.mean((pairs - w) ** 2))


def test_uint4_nibble_order():
    # one group 0..15 in order: codes equal the values; even k in the low nibble
    w = np.arange(16, dtype=np.float32)[None, :]
    q, scales, zeros, rows = quantize(w, "uint4", 16)
    assert rows[0] * scales[0, 0] == 1.0 and zeros[0, 0] == 0
    assert q[0].tolist() == [(2 * i) | ((2 * i + 1) << 4) for i in range(8)]


@pytest.mark.parametrize("fmt", ["int8", "uint4"])
def test_constant_groups(fmt):
    """int8 gives constant groups back exactly; uint4 a constant row to float32 rounding, and a
    constant group within half its step (its scale is a code of its row's)."""
    w = weight(4, 64)
    w[0, :32] = 0.75      # a constant group
    w[1, :] = -2.5        # a constant row
    w[2, 32:] = 0.0       # a zero group
    w[3, :32] = 1e-40     # denormal-range group
    parts = check_bound(w, fmt, 32)
    assert all(np.isfinite(p).all() for p in parts)
    deq = dequantize(parts, fmt, 32)
    rtol = 0 if fmt == "int8" else 2 * np.finfo(np.float32).eps
    half_step = 0 if fmt == "int8" else parts[3][0] * parts[1][0, 0] / 2
    assert (np.abs(deq[0, :32] - w[0, :32]) <= half_step).all()
    np.testing.assert_allclose(deq[1], w[1], rtol=rtol)
    np.testing.assert_array_equal(deq[2, 32:], w[2, 32:])


def test_per_channel_group():
    w = weight(6, 80)
    q, scales, zeros = check_bound(w, "int8", -1)
    assert scales.shape == (6, 1)
    np.testing.assert_allclose(scales[:, 0], (w.max(axis=1) - w.min(axis=1)) / 255, rtol=1e-6)


@pytest.mark.parametrize("fmt", ["int8", "uint4"])
@pytest.mark.parametrize("k,group", [(576, 128), (192, 128), (96, 64), (64, 96)])
def test_ragged_last_group_is_exact(fmt, k, group):
    """A group that does not divide K (upstream's group 128 on a 576-wide model) leaves a ragged last group."""
    w = weight(5, k, seed=k)
    parts = quantize(w, fmt, group)
    q, scales, zeros = parts[:3]
    codes, ref_scales, ref_zeros, ref_deq = ragged_reference(w, fmt, group)
    assert scales.shape == zeros.shape == (5, -(-k // group))
    assert np.array_equal(unpack_codes(q, fmt), codes) and np.array_equal(scales, ref_scales)
    assert np.array_equal(zeros, ref_zeros)
    np.testing.assert_allclose(dequantize(parts, fmt, group), ref_deq, rtol=1e-6, atol=1e-6)


def test_ragged_groups_the_kernels_cannot_serve_are_refused():
    with pytest.raises(ModelSerializerException, match=r"group_size 64 leaves a ragged last group on input size 100.*gcd\(64, 100\) = 4"):
        quantize(weight(2, 100), "int8", 64)


def test_odd_widths_for_uint4():
    with pytest.raises(ModelSerializerException, match="uint4: input size 9 must be even"):
        quantize(weight(2, 9), "uint4", -1)


def test_bad_arguments():
    with pytest.raises(ModelSerializerException, match="weight_format 'int4' is not supported"):
        quantize(weight(2, 64), "int4", 32)
    with pytest.raises(ModelSerializerException, match="group_size must be a positive integer or -1"):
        quantize(weight(2, 64), "int8", 0)
    with pytest.raises(ModelSerializerException, match=r"expects a 2-D weight \[N, K\], got shape \[64\]"):
        quantize(np.zeros(64, np.float32), "int8", 32)


def test_customized_quant_config():
    s = InstantQuantSettings.from_config({"quant_method": "instant_quant", "weight_format": "uint4", "group_size": 128})
    assert (s.weight_format, s.group_size, s.quantize_lm_head) == ("uint4", 128, False)
    assert InstantQuantSettings.from_config(None) == InstantQuantSettings("int8", 64, False)
    with pytest.raises(ModelSerializerException, match=r"unsupported key\(s\) \['group_settings'\]"):
        InstantQuantSettings.from_config({"quant_method": "instant_quant", "group_settings": {}})
    with pytest.raises(ModelSerializerException, match="quant_method 'gptq' is not supported"):
        InstantQuantSettings.from_config({"quant_method": "gptq"})
    a8w8 = InstantQuantSettings.from_config({"quant_method": "instant_quant", "compute_method": "activate_quant"})
    assert (a8w8.weight_format, a8w8.group_size, a8w8.compute_method) == ("int8", -1, "activate_quant")
    with pytest.raises(ModelSerializerException, match="compute_method 'activate_quant' needs weight_format 'int8'"):
        InstantQuantSettings.from_config({"quant_method": "instant_quant", "compute_method": "activate_quant",
                                          "weight_format": "uint4"})
    with pytest.raises(ModelSerializerException, match="compute_method 'fp8' is not supported"):
        InstantQuantSettings.from_config({"quant_method": "instant_quant", "compute_method": "fp8"})
