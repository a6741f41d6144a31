"""gpt-oss's clamped SwiGLU (act="clamped_swiglu": gate clamped to <= 7, up to [-7, 7],
out = (up + 1) * gate * sigmoid(1.702 gate)) in glu_mul and linear_glu, on every ISA path this CPU
has, against numpy float64 of transformers' GptOssExperts._apply_gate; and gpt-oss's interleaved
gate_up rows split by fused_experts.split_interleaved_gate_up, packed as MXFP4 with their bias, against
transformers' own dequantization and gate in float64."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

from dashinfer_server import kernels as K
from dashinfer_client.model.families.fused_experts import split_interleaved_gate_up
from tests.helpers import kernel_threads
from tests.test_linear_mxfp4 import random_mxfp4, transformers_weight

GPT_OSS = SimpleNamespace(limit=7.0, alpha=1.702)  # GptOssConfig's swiglu_limit, swiglu_alpha


def transformers_gate(gate_up_interleaved):
    """transformers' _apply_gate in float64 on [M, 2I] with gate and up in alternate columns."""
    return GptOssExperts._apply_gate(GPT_OSS, torch.from_numpy(gate_up_interleaved.astype(np.float64))).numpy()


def numpy_gate(gate_up):
    """The formula in float64 on [M, 2I] gate columns then up columns."""
    g, u = np.split(gate_up.astype(np.float64), 2, axis=1)
    g = np.minimum(g, 7.0)
    u = np.clip(u, -7.0, 7.0)
    return (u + 1) * g / (1 + np.exp(-1.702 * g))


def rtol(gate_up):
    """float32's rounding of z = 1.702 g carries into exp(-z): |z| ulps of relative error, on top
    of the exp polynomial's and the products' few ulps (test_elementwise's bound)."""
    z = 1.702 * np.minimum(np.split(gate_up.astype(np.float64), 2, axis=1)[0], 7.0)
    return 1e-6 + 2 * np.finfo(np.float32).eps * np.abs(z)


def interleave(gate_up):
    g, u = np.split(gate_up, 2, axis=1)
    return np.stack([g, u], axis=2).reshape(gate_up.shape)


@pytest.mark.parametrize("M, I", [(1, 7), (3, 64), (37, 1000), (2, 2880)])
def test_glu_mul_matches_transformers(isa, M, I):
    """Gates and ups spread over [-20, 20]: both clamps, sigmoid's saturated ends, and exactly +-7."""
    rng = np.random.default_rng(M * I)
    gu = rng.uniform(-20, 20, (M, 2 * I)).astype(np.float32)
    gu[0, :3], gu[0, I:I + 3] = [7.0, -7.0, 0.0], [7.0, -7.0, -1.0]
    out = np.full((M, I), np.nan, np.float32)
    K.glu_mul(gu, out, act="clamped_swiglu")
    want = transformers_gate(interleave(gu))
    np.testing.assert_allclose(numpy_gate(gu), want, rtol=1e-15, atol=0)  # the formula is theirs
    assert np.all(np.abs(out - want) <= rtol(gu) * np.abs(want) + 1e-30)


def test_glu_mul_lets_nan_through(isa):
    """torch.clamp keeps NaN; so must the clamps (vminps returns its second operand on NaN)."""
    gu = np.array([[np.nan, 1.0, 50.0, 1.0, 1.0, np.nan, 1.0, -50.0]], np.float32)
    out = np.empty((1, 4), np.float32)
    K.glu_mul(gu, out, act="clamped_swiglu")
    assert np.isnan(out[0, :2]).all()
    np.testing.assert_allclose(out[0, 2:], transformers_gate(interleave(gu))[0, 2:], rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 3])
def test_interleaved_mxfp4_gate_up_matches_transformers(isa, threads):
    """One gpt-oss expert's gate_up (2I = 256 interleaved rows, K = 128) with its bias: split into
    gate then up rows (blocks, scales and bias alike), packed as MXFP4, run through linear (with the
    bias) and glu_mul, and through linear_glu (without one), against transformers."""
    rng = np.random.default_rng(threads)
    inter, k = 128, 128
    blocks, scales = random_mxfp4(2 * inter, k, rng, scales=(122, 126))
    bias = rng.uniform(-2, 2, 2 * inter).astype(np.float32)
    packed = K.pack_linear(np.concatenate(split_interleaved_gate_up(blocks.reshape(2 * inter, -1))), "mxfp4", 32,
                           np.concatenate(split_interleaved_gate_up(scales)))
    w = transformers_weight(blocks, scales).astype(np.float64)  # [2I, K], rows interleaved
    with kernel_threads(threads):
        for m in (1, 5, 40):
            x = rng.standard_normal((m, k)).astype(np.float32)
            ref_gu = x.astype(np.float64) @ w.T
            mag = np.abs(x.astype(np.float64)) @ np.abs(w).T
            tol = 1e-5 * (np.split(interleave(mag), 2, axis=1)[0] * 8 + 1)  # |d out / d gate|, |d out / d up| < 8
            out = np.empty((m, inter), np.float32)
            K.glu_mul(K.linear(x, packed, np.concatenate(split_interleaved_gate_up(bias))), out, act="clamped_swiglu")
            want = transformers_gate(ref_gu + bias)
            assert np.all(np.abs(out - want) <= tol + 2e-6 * np.abs(want))
            fused = np.empty((m, inter), np.float32)
            K.linear_glu(x, packed, np.empty((m, 2 * inter), np.float32), fused, act="clamped_swiglu")
            want = transformers_gate(ref_gu)
            assert np.all(np.abs(fused - want) <= tol + 2e-6 * np.abs(want))


def test_split_interleaved_gate_up():
    rows = np.arange(12).reshape(6, 2)
    gate, up = split_interleaved_gate_up(rows)
    np.testing.assert_array_equal(gate, rows[[0, 2, 4]])
    np.testing.assert_array_equal(up, rows[[1, 3, 5]])
    experts = np.arange(24).reshape(2, 6, 2)  # [E, 2I, ...]: the rows along axis 1
    np.testing.assert_array_equal(split_interleaved_gate_up(experts, axis=1)[1], experts[:, 1::2])
    with pytest.raises(ValueError, match="not gate and up pairs"):
        split_interleaved_gate_up(np.zeros((5, 2)))
