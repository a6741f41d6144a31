"""rms_norm, glu_mul, embedding on every ISA path vs numpy (float64), torch and transformers
(rope: test_rope.py)."""
import numpy as np
import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from dashinfer_client.dtypes import from_bf16, to_bf16
from dashinfer_server import kernels as K

TOL = 1e-5
ACTS = ["silu", "gelu_tanh"]


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


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("M,N", [(1, 7), (37, 1000), (5, 4096)])
def test_centered_rms_norm_is_coheres_layer_norm(isa, M, N, residual):
    """centered=True: the row's mean taken out first, as transformers' CohereLayerNorm computes (a
    residual added first, as for rms_norm); rows with a large common offset keep their precision."""
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm
    norm = CohereLayerNorm(N, eps=1e-5)
    x, res = rand(M, N, seed=9, scale=4.0) + np.float32(30.0), rand(M, N, seed=10) if residual else None
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(rand(N, seed=11)))
        want = norm(torch.from_numpy(x + res if residual else x)).numpy()
    out = np.empty_like(x)
    K.rms_norm(x, norm.weight.detach().numpy(), 1e-5, out, residual=res, centered=True)
    assert np.abs(out - want).max() < TOL


@pytest.mark.parametrize("M,N", [(1, 7), (37, 1000)])
def test_centered_rms_norm_with_a_bias_is_torchs_layer_norm(isa, M, N):
    """centered with a bias (StarCoder2's, Nemotron's LayerNorms): torch's layer_norm; a bias without
    centered is refused (an RMSNorm has none)."""
    x, w, b = rand(M, N, seed=12, scale=3.0) + np.float32(-7.0), rand(N, seed=13), rand(N, seed=14)
    want = torch.nn.functional.layer_norm(torch.from_numpy(x), (N,), torch.from_numpy(w), torch.from_numpy(b), 1e-5)
    out = np.empty_like(x)
    K.rms_norm(x, w, 1e-5, out, centered=True, bias=b)
    assert np.abs(out - want.numpy()).max() < TOL
    with pytest.raises(ValueError, match="a bias is a LayerNorm's"):
        K.rms_norm(x, w, 1e-5, out, bias=b)


# --------------------------------------------------------------------------------------------
# glu_mul: act(gate) * up


def glu_mul_ref(gu, act):
    """float64: SiLU from its formula, GELU-tanh from torch's own (approximate="tanh")."""
    g, u = np.split(gu.astype(np.float64), 2, axis=1)
    if act == "silu":
        return g / (1 + np.exp(-g)) * u
    return torch.nn.functional.gelu(torch.from_numpy(g), approximate="tanh").numpy() * u


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("M", [1, 3, 37])
@pytest.mark.parametrize("I", [1, 7, 64, 576, 1000, 11008])
def test_glu_mul(isa, act, M, I):
    gu = rand(M, 2 * I, seed=M + I, scale=2.0)
    out = np.full((M, I), np.nan, np.float32)
    K.glu_mul(gu, out, act=act)
    want = glu_mul_ref(gu, act)
    assert np.abs(out - want).max() < TOL
    assert np.abs(out - want).max() <= 1e-6 * np.abs(want).max()


def test_glu_mul_default_is_silu(isa):
    gu = rand(3, 128, seed=9, scale=2.0)
    out = np.empty((3, 64), np.float32)
    K.glu_mul(gu, out)
    assert np.abs(out - glu_mul_ref(gu, "silu")).max() <= 1e-6 * np.abs(out).max()


def sigmoid_argument(g, act):
    """z with act(g) = g * sigmoid(z), in float64: 0.5 (1 + tanh(y)) = sigmoid(2y) for GELU-tanh."""
    g = g.astype(np.float64)
    return g if act == "silu" else 2 * np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)


def test_gelu_tanh_is_g_times_sigmoid():
    """The identity the kernels and the far-left reference below use, against torch's formula
    (in float64, where 1 + tanh(y) has not yet cancelled)."""
    g = np.linspace(-4.0, 6.0, 1001)
    torch_gelu = torch.nn.functional.gelu(torch.from_numpy(g), approximate="tanh").numpy()
    np.testing.assert_allclose(g / (1 + np.exp(-sigmoid_argument(g, "gelu_tanh"))), torch_gelu, rtol=1e-10)


@pytest.mark.parametrize("act", ACTS)
def test_glu_exp_accuracy(isa, act):
    """Far left, act(g)/g = sigmoid(z): checks the exp polynomial's relative error against
    g * sigmoid(z) in float64 (torch's 0.5 g (1 + tanh(y)) cancels to 0 there even in float64).
    z carries float32 rounding of its own (g^3 for GELU): ~|z| ulps of relative error in exp(-z)."""
    g = np.linspace(-87.0 if act == "silu" else -9.5, -1.0, 40000, dtype=np.float32)
    gu = np.concatenate([g, np.ones_like(g)])[None]
    out = np.empty((1, g.size), np.float32)
    K.glu_mul(gu, out, act=act)
    z = sigmoid_argument(g, act)
    want = g / (1 + np.exp(-z))
    bound = 5e-7 if act == "silu" else 5e-7 + 2 * np.finfo(np.float32).eps * np.abs(z)
    assert np.all(np.abs(out[0] / want - 1) < bound)


@pytest.mark.parametrize("act", ACTS)
def test_glu_large_inputs(isa, act):
    g = np.array([-1e30, -1e4, -200, -89, -88, 88, 89, 200, 1e4, 1e30, 0.0, -0.0], np.float32)
    out = np.empty((1, g.size), np.float32)
    K.glu_mul(np.concatenate([g, np.full_like(g, 2.0)])[None], out, act=act)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0, g > 80], 2 * g[g > 80])
    assert np.all(np.abs(out[0, g < -80]) < 1e-30)
    assert np.all(out[0, g == 0] == 0)
    K.glu_mul(np.array([[np.nan, 1.0]], np.float32), out[:, :1], act=act)
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
    (ValueError, "cos_sin has 5 columns: the rotary dim must be even", lambda: K.rope(f32(2, 3, 5), None, np.zeros(2, np.int32), f32(8, 5))),
    (ValueError, r"positions\[1\] = 8 is outside", lambda: K.rope(f32(2, 3, 4), None, np.array([0, 8], np.int32), f32(8, 4))),
    (ValueError, r"positions\[0\] = -1", lambda: K.rope(f32(2, 3, 4), None, np.array([-1, 0], np.int32), f32(8, 4))),
    (TypeError, "positions must be int32", lambda: K.rope(f32(2, 3, 4), None, np.zeros(2, np.int64), f32(8, 4))),
    (ValueError, "k has size 3 in dimension 0", lambda: K.rope(f32(2, 3, 4), f32(3, 1, 4), np.zeros(2, np.int32), f32(8, 4))),
    (ValueError, "cos_sin has 6 columns.*at most head_dim 4", lambda: K.rope(f32(2, 3, 4), None, np.zeros(2, np.int32), f32(8, 6))),
    (ValueError, "positions has size 3", lambda: K.rope(f32(2, 3, 4), None, np.zeros(3, np.int32), f32(8, 4))),
    (ValueError, "q must be a C-contiguous", lambda: K.rope(f32(2, 4, 3).transpose(0, 2, 1), None, np.zeros(2, np.int32), f32(8, 4))),
    (ValueError, "q and k share memory", lambda: (lambda q: K.rope(q, q, np.zeros(2, np.int32), f32(8, 4)))(f32(2, 3, 4))),
    # glu_mul
    (ValueError, "gate_up has size 6 in dimension 1", lambda: K.glu_mul(f32(2, 6), f32(2, 4))),
    (ValueError, "out has size 3 in dimension 0", lambda: K.glu_mul(f32(2, 8), f32(3, 4))),
    (TypeError, "gate_up must be float32", lambda: K.glu_mul(np.zeros((2, 8), np.float16), f32(2, 4))),
    (ValueError, "gate_up must be a C-contiguous", lambda: K.glu_mul(f32(8, 2).T, f32(2, 4))),
    (ValueError, "act must be 'silu', 'gelu_tanh' or 'clamped_swiglu', got 'gelu'", lambda: K.glu_mul(f32(2, 8), f32(2, 4), act="gelu")),
    # a plain MLP's activation (Arcee's, decoder_new with gated=0) is no gate's
    (ValueError, "got 'relu2'", lambda: K.glu_mul(f32(2, 8), f32(2, 4), act="relu2")),
    (TypeError, "argument 3 must be str", lambda: K.glu_mul(f32(2, 8), f32(2, 4), act=1)),
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
