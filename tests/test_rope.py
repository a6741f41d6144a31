"""RoPE: dashinfer_server.rope's tables against transformers' own ROPE_INIT_FUNCTIONS and rotary
modules (every rope type the supported families use, partial rotary included), the checks of
dashinfer_client.model.rope_scaling, and
the K.rope kernel on every ISA path against float64 numpy and transformers' apply_rotary_pos_emb."""
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

from dashinfer_client.model.rope_scaling import resolve_rope_scaling, rotary_dim
from dashinfer_server import kernels as K
from dashinfer_server.rope import rope_frequencies, rope_table

TOL = 1e-5
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
YARN_QWEN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
YARN_MSCALE = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
               "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
YARN_OPTIONS = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048,
                "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False, "attention_factor": 1.2}
# (scaling, theta, head_dim, max_position_embeddings) for LlamaConfig / LlamaRotaryEmbedding
LLAMA_CASES = {
    "default": (None, 10000.0, 64, 8192),
    "linear": ({"rope_type": "linear", "factor": 4.0}, 100000.0, 128, 8192),
    "linear-4.x-type": ({"type": "linear", "factor": 2.0}, 500000.0, 64, 8192),
    "llama3": (LLAMA3, 500000.0, 128, 131072),
    "yarn-qwen2.5": (YARN_QWEN, 1e6, 128, 131072),
    "yarn-mscale": (YARN_MSCALE, 10000.0, 64, 163840),
    "yarn-options": (YARN_OPTIONS, 10000.0, 64, 16384),
}


def longrope(n: int, seed: int) -> dict:
    """Phi-3.5 / Phi-4-mini shaped longrope parameters for n frequencies (factors from 1 to ~60)."""
    rng = np.random.default_rng(seed)
    return {"rope_type": "longrope", "short_factor": list(1 + rng.random(n) * 0.2),
            "long_factor": list(np.sort(1 + rng.random(n) * 60))}


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def llama_config(scaling, theta, head_dim, max_pos):
    params = dict(scaling or {"rope_type": "default"}, rope_theta=theta)
    return LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                       rope_parameters=params, max_position_embeddings=max_pos)


def phi3_config(scaling, theta, head_dim, partial, max_pos, original=4096):
    params = dict(scaling or {"rope_type": "default"}, rope_theta=theta)
    return Phi3Config(hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2,
                      partial_rotary_factor=partial, rope_parameters=params,
                      original_max_position_embeddings=original, max_position_embeddings=max_pos)


def check_table(emb, table, positions, attention_factor):
    """Rows of our table against the module's cos/sin at positions (one forward over them all)."""
    cos, sin = emb(torch.zeros(1), torch.tensor(positions)[None])
    half = table.shape[1] // 2
    assert cos.shape[-1] == table.shape[1]
    tol = TOL * max(1.0, attention_factor)
    assert np.abs(table[positions, :half] - cos[0].numpy()[:, :half]).max() < tol
    assert np.abs(table[positions, half:] - sin[0].numpy()[:, :half]).max() < tol


# --------------------------------------------------------------------------------------------
# tables


@pytest.mark.parametrize("case", LLAMA_CASES)
def test_tables_match_transformers(case):
    scaling, theta, head_dim, max_pos = LLAMA_CASES[case]
    cfg = llama_config(scaling, theta, head_dim, max_pos)
    emb = LlamaRotaryEmbedding(cfg)
    resolved = resolve_rope_scaling(scaling, head_dim, max_pos)
    inv_freq, attention = rope_frequencies(head_dim, theta, resolved, max_pos)
    assert inv_freq.dtype == np.float32 and inv_freq.shape == (head_dim // 2,)
    # bit-exact but for torch's vectorized pow, which is off by one ulp now and then
    np.testing.assert_allclose(inv_freq, emb.inv_freq.numpy(), rtol=2e-7, atol=0)
    assert attention == pytest.approx(emb.attention_scaling, rel=1e-12)
    if scaling is not None:
        init_inv_freq, init_attention = ROPE_INIT_FUNCTIONS[emb.rope_type](cfg)
        np.testing.assert_allclose(inv_freq, init_inv_freq.numpy(), rtol=2e-7, atol=0)
        assert attention == pytest.approx(init_attention, rel=1e-12)
    table = rope_table(head_dim, head_dim, theta, resolved, 8192)
    assert table.dtype == np.float32 and table.shape == (8192, head_dim)
    check_table(emb, table, list(range(0, 8192, 7)) + [8191], attention)


def test_yarn_attention_factor_and_ramp():
    """The mscale case scales cos/sin by mscale(0.707)/mscale(1.0) != 1; the ramp keeps the
    highest frequencies and divides the lowest by factor."""
    plain, _ = rope_frequencies(64, 10000.0, None, 4096)
    inv, attention = rope_frequencies(64, 10000.0, YARN_MSCALE, 4096)
    want = (0.1 * 0.707 * np.log(40) + 1) / (0.1 * np.log(40) + 1)
    assert attention == pytest.approx(want, rel=1e-12) and attention != 1.0
    assert inv[0] == plain[0] and inv[-1] == pytest.approx(plain[-1] / 40, rel=1e-6)


@pytest.mark.parametrize("served", [4096, 131072])
@pytest.mark.parametrize("head_dim,partial", [(96, 1.0), (128, 0.75)])
def test_longrope_matches_transformers(served, head_dim, partial):
    """Phi-3.5-mini (head 96) and Phi-4-mini (head 128, 0.75 rotary) longrope. A context within
    the original 4096 gets the short factors, as transformers gives any sequence that fits it;
    past it the long ones, as transformers gives a sequence that reaches past 4096."""
    r = rotary_dim(head_dim, partial)
    scaling = longrope(r // 2, seed=head_dim)
    cfg = phi3_config(scaling, 10000.0, head_dim, partial, 131072)
    emb = Phi3RotaryEmbedding(cfg)
    # what the config code does: Phi-3's top-level original_max_position_embeddings goes in first
    resolved = resolve_rope_scaling(dict(scaling, original_max_position_embeddings=4096), r, 131072)
    inv_freq, attention = rope_frequencies(r, 10000.0, resolved, served)
    want, want_attention = ROPE_INIT_FUNCTIONS["longrope"](cfg, seq_len=served)
    np.testing.assert_allclose(inv_freq, want.numpy(), rtol=2e-7, atol=0)
    assert attention == pytest.approx(want_attention, rel=1e-12) and attention == emb.attention_scaling
    assert attention == pytest.approx(np.sqrt(1 + np.log(32) / np.log(4096)), rel=1e-12)
    table = rope_table(head_dim, r, 10000.0, resolved, served)
    assert table.shape == (served, r)
    positions = [0, 1, 1000, 4095] + ([4096, 9000, 65537, 131071] if served > 4096 else [])
    check_table(emb, table, positions, attention)


@pytest.mark.parametrize("head_dim,partial", [(128, 0.75), (64, 0.5), (80, 0.4), (64, 1.0)])
def test_rotary_dim_as_transformers(head_dim, partial):
    cfg = phi3_config(None, 10000.0, head_dim, partial, 4096)
    inv_freq, _ = Phi3RotaryEmbedding.compute_default_rope_parameters(cfg)
    r = rotary_dim(head_dim, partial)
    assert 2 * inv_freq.numel() == r
    np.testing.assert_allclose(rope_frequencies(r, 10000.0, None, 4096)[0], inv_freq.numpy(), rtol=2e-7, atol=0)


def test_llama3_bands():
    """The three llama3 bands: high frequencies kept, low ones divided by factor, smooth between."""
    plain, _ = rope_frequencies(128, 500000.0, None, 8192)
    scaled, _ = rope_frequencies(128, 500000.0, LLAMA3, 8192)
    wavelen = 2 * np.pi / plain
    assert np.array_equal(scaled[wavelen < 2048], plain[wavelen < 2048])
    np.testing.assert_allclose(scaled[wavelen > 8192], plain[wavelen > 8192] / 8, rtol=1e-6)
    mid = (wavelen > 2048) & (wavelen < 8192)
    assert mid.any() and np.all(scaled[mid] < plain[mid]) and np.all(scaled[mid] > plain[mid] / 8)


# --------------------------------------------------------------------------------------------
# checking a scaling dict


def test_defaults_from_max_position_embeddings_as_transformers():
    """A yarn factor of None and a missing original_max_position_embeddings come from
    max_position_embeddings, as transformers' standardization derives them."""
    scaling = {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096}
    cfg = llama_config(scaling, 10000.0, 64, 32768)
    want_inv, want_attention = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    resolved = resolve_rope_scaling(scaling, 64, 32768)
    assert resolved["factor"] == 8.0
    inv_freq, attention = rope_frequencies(64, 10000.0, resolved, 32768)
    np.testing.assert_allclose(inv_freq, want_inv.numpy(), rtol=2e-7, atol=0)
    assert attention == pytest.approx(want_attention, rel=1e-12)
    no_original = resolve_rope_scaling({"rope_type": "yarn", "factor": 4.0}, 64, 32768)
    assert no_original["original_max_position_embeddings"] == \
        llama_config({"rope_type": "yarn", "factor": 4.0}, 1.0, 64, 32768).rope_parameters["original_max_position_embeddings"]
    assert resolve_rope_scaling(resolved, 64) == resolved  # storable in a serialized config
    assert resolve_rope_scaling({"type": "su", **longrope(32, 1), "original_max_position_embeddings": 4096},
                                64, 131072)["rope_type"] == "longrope"


REFUSED = [
    ({"rope_type": "dynamic", "factor": 2.0}, "'dynamic' is not supported: dynamic NTK.*rotates keys once"),
    ({"rope_type": "proportional"}, "'proportional' is not supported \\(supported: default, linear"),
    ({"rope_type": "linear"}, "'linear' needs 'factor'"),
    ({"rope_type": "linear", "factor": 0}, "factor must be positive"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, "needs 'low_freq_factor'"),
    ({"rope_type": "yarn", "factor": 4.0}, "'yarn' needs 'original_max_position_embeddings'"),
    ({"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096}, "'yarn' needs 'factor'"),
    ({**YARN_QWEN, "truncate": "yes"}, "truncate must be true or false"),
    ({**YARN_QWEN, "beta_fast": "32"}, "beta_fast must be a non-negative number"),
    ({**YARN_QWEN, "mscale": float("nan")}, "mscale must be a non-negative number"),
    ({**longrope(31, 2), "original_max_position_embeddings": 4096}, "'short_factor': a list of rotary_dim / 2 = 32"),
    ({**longrope(32, 2), "original_max_position_embeddings": 4096, "long_factor": [0.0] * 32},
     "every long_factor entry must be a positive number"),
    ({**longrope(32, 2), "original_max_position_embeddings": 4096.5}, "must be a positive integer"),
    ({**longrope(32, 2), "original_max_position_embeddings": 4096}, "'longrope' needs 'factor'"),
]


@pytest.mark.parametrize("scaling,message", REFUSED, ids=[m for _, m in REFUSED])
def test_bad_scaling_refused(scaling, message):
    with pytest.raises(ValueError, match=message):
        resolve_rope_scaling(scaling, 64)
    with pytest.raises(ValueError, match=message):
        rope_table(64, 64, 10000.0, scaling, 16)


def test_bad_dims_refused():
    with pytest.raises(ValueError, match="rotary dim 19: it must be a positive even number"):
        rotary_dim(64, 0.3)
    with pytest.raises(ValueError, match="partial_rotary_factor must be in"):
        rotary_dim(64, 1.5)
    with pytest.raises(ValueError, match="rotary_dim must be in"):
        rope_table(64, 96, 10000.0, None, 16)
    with pytest.raises(ValueError, match="positive even"):
        rope_frequencies(63, 10000.0, None, 16)


# --------------------------------------------------------------------------------------------
# the K.rope kernel


def rope_ref(x, pos, cs):
    """float64 half-rotation of the first R = cs.shape[1] dims from the same table: x [T, H, D]."""
    r = cs.shape[1]
    h = r // 2
    c = cs[pos, :h].astype(np.float64)[:, None, :]
    s = cs[pos, h:].astype(np.float64)[:, None, :]
    x1, x2 = x[..., :h].astype(np.float64), x[..., h:r].astype(np.float64)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[..., r:]], axis=-1)


@pytest.mark.parametrize("D,R", [(64, 64), (128, 128), (80, 80), (2, 2), (128, 96), (96, 48), (80, 20)])
@pytest.mark.parametrize("T", [1, 3, 37])
def test_rope(isa, D, R, T):
    cs = rope_table(D, R, 100000.0, None, 8192)
    pos = np.random.default_rng(T).integers(0, 8192, T).astype(np.int32)
    pos[0] = 8191
    q, k = rand(T, 9, D, seed=10), rand(T, 3, D, seed=11)
    want_q, want_k = rope_ref(q, pos, cs), rope_ref(k, pos, cs)
    q0, k0 = q.copy(), k.copy()
    K.rope(q, k, pos, cs)
    assert np.abs(q - want_q).max() < TOL
    assert np.abs(k - want_k).max() < TOL
    np.testing.assert_array_equal(q[..., R:], q0[..., R:])  # the pass-through dims, untouched
    np.testing.assert_array_equal(k[..., R:], k0[..., R:])


def test_rope_without_k(isa):
    cs = rope_table(64, 64, 10000.0, None, 100)
    pos = np.array([0, 5, 99], np.int32)
    q = rand(3, 4, 64, seed=12)
    want = rope_ref(q, pos, cs)
    K.rope(q, None, pos, cs)
    assert np.abs(q - want).max() < TOL
    np.testing.assert_array_equal(q[0], rand(3, 4, 64, seed=12)[0])  # position 0: identity


ROTATED = {  # transformers module and config for q/k rotated by its apply_rotary_pos_emb
    "llama3": lambda: (LlamaRotaryEmbedding, llama_config(LLAMA3, 500000.0, 128, 131072), 128, 1.0),
    "yarn-mscale": lambda: (LlamaRotaryEmbedding, llama_config(YARN_MSCALE, 10000.0, 64, 163840), 64, 1.0),
    "partial-default": lambda: (Phi3RotaryEmbedding, phi3_config(None, 10000.0, 128, 0.75, 4096), 128, 0.75),
    "partial-longrope": lambda: (Phi3RotaryEmbedding, phi3_config(longrope(48, 3), 10000.0, 128, 0.75, 131072),
                                 128, 0.75),
}


@pytest.mark.parametrize("case", ROTATED)
def test_rope_matches_transformers(isa, case):
    """q/k through K.rope and our table against transformers' rotary module and
    apply_rotary_pos_emb (which rotates the table's width and passes the rest), fp32 within 1e-6
    relative. The one allowed difference beyond it: torch's float32 pow (Sleef) is off by one
    ulp in an inv_freq entry now and then, which moves that frequency's angle by position * ulp."""
    module, cfg, head_dim, partial = ROTATED[case]()
    r = rotary_dim(head_dim, partial)
    params = dict(cfg.rope_parameters)
    theta = params.pop("rope_theta")
    resolved = resolve_rope_scaling(params if params["rope_type"] != "default" else None, r,
                                    cfg.max_position_embeddings)
    max_pos = cfg.max_position_embeddings
    T, H, Hk = 37, 9, 3
    pos = np.random.default_rng(head_dim).integers(0, max_pos, T).astype(np.int32)
    pos[-1] = max_pos - 1  # past any original context: longrope's long factors in both
    q, k = rand(T, H, head_dim, seed=13), rand(T, Hk, head_dim, seed=14)
    emb = module(cfg)
    cos, sin = emb(torch.zeros(1), torch.from_numpy(pos).long()[None])
    inv_freq = rope_frequencies(r, theta, resolved, max_pos)[0]
    theirs = emb.inv_freq.numpy()
    assert np.all(np.abs(inv_freq - theirs) <= np.spacing(theirs))
    angle_slack = pos[:, None, None] * np.abs(inv_freq - theirs).astype(np.float64)  # [T, 1, r/2]
    # transformers' layout is [batch, heads, T, D]
    tq, tk = (torch.from_numpy(a).transpose(0, 1)[None] for a in (q, k))
    want_q, want_k = (w[0].transpose(0, 1).numpy() for w in apply_rotary_pos_emb(tq, tk, cos, sin))
    for x, want in ((q, want_q), (k, want_k)):
        pair = np.abs(x[..., : r // 2]) + np.abs(x[..., r // 2: r])
        slack = np.concatenate([angle_slack * pair] * 2 + [np.zeros_like(x[..., r:])], axis=-1)
        K.rope(x, None, pos, rope_table(head_dim, r, theta, resolved, max_pos))
        assert np.all(np.abs(x - want) <= 1e-6 * (np.abs(want) + np.abs(want).max()) + slack)
        np.testing.assert_array_equal(x[..., r:], want[..., r:])
