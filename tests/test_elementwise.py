"""rms_norm, rope, silu_mul, embedding on every ISA path vs numpy (float64) and transformers."""
import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from dashinfer_client.dtypes import from_bf16, to_bf16
from dashinfer_server import kernels as K
from dashinfer_server.rope import rope_cos_sin, rope_inv_freq

TOL = 1e-5
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
SCALINGS = [None, {"rope_type": "linear", "factor": 4.0}, {"type": "linear", "factor": 2.0}, LLAMA3]


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def rms_ref(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


# --------------------------------------------------------------------------------------------
# rms_norm


@pytest.mark.parametrize("M", [1, 3, 37])
@pytest.mark.parametrize("N", [1, 7, 64, 576, 1000])
def test_rms_norm(isa, M, N):
    x, w = rand(M, N, seed=1, scale=3.0), rand(N, seed=2)
    out = np.full((M, N), np.nan, np.float32)
    K.rms_norm(x, w, 1e-5, out)
    assert np.abs(out - rms_ref(x, w, 1e-5)).max() < TOL


@pytest.mark.parametrize("M", [1, 3, 37])
@pytest.mark.parametrize("N", [7, 576, 1000])
def test_rms_norm_fused_residual(isa, M, N):
    x, res, w = rand(M, N, seed=1), rand(M, N, seed=3, scale=5.0), rand(N, seed=2)
    want_res = res.astype(np.float64) + x
    out = np.empty((M, N), np.float32)
    K.rms_norm(x, w, 1e-6, out, residual=res)
    assert np.abs(res - want_res).max() < TOL
    assert np.abs(out - rms_ref(want_res, w, 1e-6)).max() < TOL


@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_out_is_x(isa, residual):
    x, w = rand(37, 1000, seed=4), rand(1000, seed=5)
    res = rand(37, 1000, seed=6) if residual else None
    base = x.astype(np.float64) + (res if residual else 0)
    K.rms_norm(x, w, 1e-5, x, res)
    assert np.abs(x - rms_ref(base, w, 1e-5)).max() < TOL


@pytest.mark.parametrize("M,N", [(1, 576), (37, 1000), (5, 4096)])
def test_rms_norm_matches_transformers(isa, M, N):
    norm = LlamaRMSNorm(N, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(rand(N, seed=7)))
        x = rand(M, N, seed=8, scale=10.0)
        want = norm(torch.from_numpy(x)).numpy()
    out = np.empty_like(x)
    K.rms_norm(x, norm.weight.detach().numpy(), 1e-5, out)
    assert np.abs(out - want).max() < TOL


# --------------------------------------------------------------------------------------------
# rope tables


@pytest.mark.parametrize("theta", [10000.0, 100000.0, 500000.0, 1e6])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_rope_tables_match_transformers(theta, D, scaling):
    params = {"rope_type": "default"} if scaling is None else dict(scaling)
    params["rope_theta"] = theta
    cfg = LlamaConfig(hidden_size=4 * D, num_attention_heads=4, head_dim=D,
                      rope_parameters=params, max_position_embeddings=131072)
    emb = LlamaRotaryEmbedding(cfg)
    assert emb.attention_scaling == 1.0  # so the cos/sin table carries no extra scale
    inv_freq = rope_inv_freq(D, theta, scaling)
    assert inv_freq.dtype == np.float32 and inv_freq.shape == (D // 2,)
    # bit-exact but for torch's vectorized pow, which is off by one ulp now and then
    np.testing.assert_allclose(inv_freq, emb.inv_freq.numpy(), rtol=2e-7, atol=0)
    if scaling is not None:
        init_inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[emb.rope_type](cfg)
        assert attention_factor == 1.0
        np.testing.assert_allclose(inv_freq, init_inv_freq.numpy(), rtol=2e-7, atol=0)
    cos, sin = emb(torch.zeros(1), torch.arange(8192)[None])
    cs = rope_cos_sin(inv_freq, 8192)
    assert cs.dtype == np.float32 and cs.shape == (8192, D)
    assert np.abs(cs[:, : D // 2] - cos[0].numpy()[:, : D // 2]).max() < TOL
    assert np.abs(cs[:, D // 2:] - sin[0].numpy()[:, : D // 2]).max() < TOL


def test_rope_inv_freq_llama3_bands():
    """The three llama3 bands: high frequencies kept, low ones divided by factor, smooth between."""
    plain = rope_inv_freq(128, 500000.0)
    scaled = rope_inv_freq(128, 500000.0, LLAMA3)
    wavelen = 2 * np.pi / plain
    assert np.array_equal(scaled[wavelen < 2048], plain[wavelen < 2048])
    np.testing.assert_allclose(scaled[wavelen > 8192], plain[wavelen > 8192] / 8, rtol=1e-6)
    mid = (wavelen > 2048) & (wavelen < 8192)
    assert mid.any() and np.all(scaled[mid] < plain[mid]) and np.all(scaled[mid] > plain[mid] / 8)


@pytest.mark.parametrize("kind", ["dynamic", "yarn", "longrope", "su"])
def test_rope_unknown_type_refused(kind):
    with pytest.raises(ValueError, match=kind):
        rope_inv_freq(64, 10000.0, {"rope_type": kind, "factor": 2.0})


def test_rope_missing_parameter_refused():
    with pytest.raises(ValueError, match="low_freq_factor"):
        rope_inv_freq(64, 10000.0, {"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ValueError, match="even"):
        rope_inv_freq(63, 10000.0)


# --------------------------------------------------------------------------------------------
# rope kernel


def rope_ref(x, pos, cs):
    """float64 half-rotation from the same cos/sin table: x [T, H, D]."""
    h = x.shape[-1] // 2
    c = cs[pos, :h].astype(np.float64)[:, None, :]
    s = cs[pos, h:].astype(np.float64)[:, None, :]
    x1, x2 = x[..., :h].astype(np.float64), x[..., h:].astype(np.float64)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


@pytest.mark.parametrize("D", [64, 128, 80, 2])
@pytest.mark.parametrize("T", [1, 3, 37])
def test_rope(isa, D, T):
    cs = rope_cos_sin(rope_inv_freq(D, 100000.0), 8192)
    pos = np.random.default_rng(T).integers(0, 8192, T).astype(np.int32)
    pos[0] = 8191
    q, k = rand(T, 9, D, seed=10), rand(T, 3, D, seed=11)
    want_q, want_k = rope_ref(q, pos, cs), rope_ref(k, pos, cs)
    K.rope(q, k, pos, cs)
    assert np.abs(q - want_q).max() < TOL
    assert np.abs(k - want_k).max() < TOL


def test_rope_without_k(isa):
    cs = rope_cos_sin(rope_inv_freq(64, 10000.0), 100)
    pos = np.array([0, 5, 99], np.int32)
    q = rand(3, 4, 64, seed=12)
    want = rope_ref(q, pos, cs)
    K.rope(q, None, pos, cs)
    assert np.abs(q - want).max() < TOL
    np.testing.assert_array_equal(q[0], rand(3, 4, 64, seed=12)[0])  # position 0: identity


@pytest.mark.parametrize("D,theta,scaling", [(64, 100000.0, None), (128, 500000.0, LLAMA3),
                                             (128, 1e6, None)])
def test_rope_matches_transformers(isa, D, theta, scaling):
    params = {"rope_type": "default"} if scaling is None else dict(scaling)
    params["rope_theta"] = theta
    cfg = LlamaConfig(hidden_size=4 * D, num_attention_heads=4, head_dim=D,
                      rope_parameters=params, max_position_embeddings=131072)
    T, H, Hk = 37, 9, 3
    pos = np.random.default_rng(D).integers(0, 8192, T).astype(np.int32)
    pos[-1] = 8191
    q, k = rand(T, H, D, seed=13), rand(T, Hk, D, seed=14)
    cos, sin = LlamaRotaryEmbedding(cfg)(torch.zeros(1), torch.from_numpy(pos).long()[None])
    # transformers' layout is [batch, heads, T, D]
    tq, tk = (torch.from_numpy(a).transpose(0, 1)[None] for a in (q, k))
    want_q, want_k = apply_rotary_pos_emb(tq, tk, cos, sin)
    K.rope(q, k, pos, rope_cos_sin(rope_inv_freq(D, theta, scaling), 8192))
    assert np.abs(q - want_q[0].transpose(0, 1).numpy()).max() < TOL
    assert np.abs(k - want_k[0].transpose(0, 1).numpy()).max() < TOL


# --------------------------------------------------------------------------------------------
# silu_mul


def silu_mul_ref(gu):
    g, u = np.split(gu.astype(np.float64), 2, axis=1)
    return g / (1 + np.exp(-g)) * u


@pytest.mark.parametrize("M", [1, 3, 37])
@pytest.mark.parametrize("I", [1, 7, 64, 576, 1000, 11008])
def test_silu_mul(isa, M, I):
    gu = rand(M, 2 * I, seed=M + I, scale=2.0)
    out = np.full((M, I), np.nan, np.float32)
    K.silu_mul(gu, out)
    want = silu_mul_ref(gu)
    assert np.abs(out - want).max() < TOL
    assert np.abs(out - want).max() <= 1e-6 * np.abs(want).max()


def test_silu_exp_accuracy(isa):
    """Far left, silu(g)/g = exp(g)/(1+exp(g)): checks the exp polynomial's relative error."""
    g = np.linspace(-87.0, -1.0, 40000, dtype=np.float32)
    gu = np.concatenate([g, np.ones_like(g)])[None]
    out = np.empty((1, g.size), np.float32)
    K.silu_mul(gu, out)
    want = silu_mul_ref(gu)[0]
    assert np.max(np.abs(out[0] / want - 1)) < 5e-7


def test_silu_large_inputs(isa):
    g = np.array([-1e30, -1e4, -200, -89, -88, 88, 89, 200, 1e4, 1e30, 0.0, -0.0], np.float32)
    out = np.empty((1, g.size), np.float32)
    K.silu_mul(np.concatenate([g, np.full_like(g, 2.0)])[None], out)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0, g > 80], 2 * g[g > 80])
    assert np.all(np.abs(out[0, g < -80]) < 1e-30)
    assert np.all(out[0, g == 0] == 0)
    K.silu_mul(np.array([[np.nan, 1.0]], np.float32), out[:, :1])
    assert np.isnan(out[0, 0])  # NaN stays visible


# --------------------------------------------------------------------------------------------
# embedding


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("D", [1, 7, 576, 4096])
def test_embedding(isa, dtype, D):
    V = 50
    table = rand(V, D, seed=D)
    if dtype == "bf16":
        table = to_bf16(table)
        ref = from_bf16(table)
    else:
        ref = table
    ids = np.array([0, 49, 3, 3, 17] * 8, np.int32)
    out = np.full((ids.size, D), np.nan, np.float32)
    K.embedding(ids, table, out)
    np.testing.assert_array_equal(out, ref[ids])


@pytest.mark.parametrize("bad", [-1, 50, 2**31 - 1])
def test_embedding_bad_id_writes_nothing(bad):
    table = rand(50, 8)
    ids = np.array([1, 2, bad, 3], np.int32)
    out = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match=rf"ids\[2\] = {bad}.*50"):
        K.embedding(ids, table, out)
    assert not out.any()


# --------------------------------------------------------------------------------------------
# bad arguments: a clear exception and a live process


def f32(*shape):
    return np.zeros(shape, np.float32)


BAD_CALLS = [
    # rms_norm
    (TypeError, "x must be float32", lambda: K.rms_norm(np.zeros((2, 4)), f32(4), 1e-5, f32(2, 4))),
    (ValueError, "weight has size 3", lambda: K.rms_norm(f32(2, 4), f32(3), 1e-5, f32(2, 4))),
    (ValueError, "out has size 5", lambda: K.rms_norm(f32(2, 4), f32(4), 1e-5, f32(2, 5))),
    (ValueError, "residual has size 3", lambda: K.rms_norm(f32(2, 4), f32(4), 1e-5, f32(2, 4), f32(3, 4))),
    (ValueError, "x must have 2 dim", lambda: K.rms_norm(f32(4), f32(4), 1e-5, f32(1, 4))),
    (ValueError, "x must be a C-contiguous", lambda: K.rms_norm(f32(4, 2).T, f32(4), 1e-5, f32(2, 4))),
    (ValueError, "out must be a C-contiguous writable",
     lambda: K.rms_norm(f32(2, 4), f32(4), 1e-5, np.broadcast_to(f32(4), (2, 4)))),
    (ValueError, "eps", lambda: K.rms_norm(f32(2, 4), f32(4), -1.0, f32(2, 4))),
    (ValueError, "eps", lambda: K.rms_norm(f32(2, 4), f32(4), float("nan"), f32(2, 4))),
    (ValueError, "N = 0", lambda: K.rms_norm(f32(2, 0), f32(0), 1e-5, f32(2, 0))),
    (ValueError, "out and residual share memory", lambda: (lambda r: K.rms_norm(f32(2, 4), f32(4), 1e-5, r, r))(f32(2, 4))),
    (ValueError, "out and x share memory", lambda: (lambda b: K.rms_norm(b[:2], f32(4), 1e-5, b[1:]))(f32(3, 4))),
    (TypeError, "required", lambda: K.rms_norm(None, f32(4), 1e-5, f32(2, 4))),
    # rope
    (ValueError, "head_dim must be even", lambda: K.rope(f32(2, 3, 5), None, np.zeros(2, np.int32), f32(8, 5))),
    (ValueError, r"positions\[1\] = 8 is outside", lambda: K.rope(f32(2, 3, 4), None, np.array([0, 8], np.int32), f32(8, 4))),
    (ValueError, r"positions\[0\] = -1", lambda: K.rope(f32(2, 3, 4), None, np.array([-1, 0], np.int32), f32(8, 4))),
    (TypeError, "positions must be int32", lambda: K.rope(f32(2, 3, 4), None, np.zeros(2, np.int64), f32(8, 4))),
    (ValueError, "k has size 3 in dimension 0", lambda: K.rope(f32(2, 3, 4), f32(3, 1, 4), np.zeros(2, np.int32), f32(8, 4))),
    (ValueError, "cos_sin has size 6", lambda: K.rope(f32(2, 3, 4), None, np.zeros(2, np.int32), f32(8, 6))),
    (ValueError, "positions has size 3", lambda: K.rope(f32(2, 3, 4), None, np.zeros(3, np.int32), f32(8, 4))),
    (ValueError, "q must be a C-contiguous", lambda: K.rope(f32(2, 4, 3).transpose(0, 2, 1), None, np.zeros(2, np.int32), f32(8, 4))),
    (ValueError, "q and k share memory", lambda: (lambda q: K.rope(q, q, np.zeros(2, np.int32), f32(8, 4)))(f32(2, 3, 4))),
    # silu_mul
    (ValueError, "gate_up has size 6 in dimension 1", lambda: K.silu_mul(f32(2, 6), f32(2, 4))),
    (ValueError, "out has size 3 in dimension 0", lambda: K.silu_mul(f32(2, 8), f32(3, 4))),
    (TypeError, "gate_up must be float32", lambda: K.silu_mul(np.zeros((2, 8), np.float16), f32(2, 4))),
    (ValueError, "gate_up must be a C-contiguous", lambda: K.silu_mul(f32(8, 2).T, f32(2, 4))),
    # embedding
    (TypeError, "table must be a float32 or uint16", lambda: K.embedding(np.zeros(2, np.int32), np.zeros((5, 4)), f32(2, 4))),
    (TypeError, "ids must be int32", lambda: K.embedding(np.zeros(2, np.int64), f32(5, 4), f32(2, 4))),
    (ValueError, "out has size 3 in dimension 1", lambda: K.embedding(np.zeros(2, np.int32), f32(5, 4), f32(2, 3))),
    (ValueError, "table must be a C-contiguous", lambda: K.embedding(np.zeros(2, np.int32), f32(4, 5).T, f32(2, 4))),
    (ValueError, "table must have 2 dim", lambda: K.embedding(np.zeros(2, np.int32), f32(20), f32(2, 4))),
]


@pytest.mark.parametrize("exc,message,call", BAD_CALLS, ids=[m for _, m, _ in BAD_CALLS])
def test_bad_arguments(exc, message, call):
    with pytest.raises(exc, match=message):
        call()
    out = np.empty((1, 4), np.float32)  # the extension still works afterwards
    K.rms_norm(np.ones((1, 4), np.float32), np.ones(4, np.float32), 0.0, out)
    np.testing.assert_allclose(out, 1.0, rtol=1e-6)
