"""The output head of a quantized model is quantized in memory, int8 under int8 layers and 4-bit under
uint4 ones in groups of 32 (dashinfer_server/weights.py head_bits); the embedding, tied or not, stays exact."""
import numpy as np
import pytest

from dashinfer_client.dtypes import from_bf16, to_bf16
from dashinfer_client.model import DashInferModel
from dashinfer_client.model.quant import dequantize, quantize, unpack_codes
from dashinfer_server import kernels as K
from dashinfer_server.shard import Shard
from dashinfer_server.weights import WeightLoader, head_bits
from tests.helpers import TINY, serialize


@pytest.mark.parametrize("fmt,bits", [("int8", 8), ("uint4", 4)])
def test_native_quantize_is_instant_quant_bit_for_bit(fmt, bits):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((37, 192)) * rng.uniform(0.01, 3, (37, 1))).astype(np.float32)
    w[2, :64] = 0.25  # a constant group: scale 1
    for source, ref_w, group in ((w, w, 64), (to_bf16(w), from_bf16(to_bf16(w)), 192), (w, w, 32)):
        codes, scales, zeros = K.quantize(source, group, bits)
        for got, want in zip((codes, scales, zeros), quantize(ref_w, fmt, group)):
            assert got.dtype == want.dtype and np.array_equal(got, want)
    with pytest.raises(ValueError, match="does not divide"):
        K.quantize(w, 100, bits)


def test_head_bits_follow_the_quality_figures():
    """4-bit only under uint4 layers in groups of 32 (bench.quality: +1.3% NLL); in bigger groups,
    where uint4 layers already miss the 3% target, and under int8 layers the head is int8."""
    assert [head_bits("u4", g) for g in (32, 64, 128, 1536)] == [4, 8, 8, 8]
    assert [head_bits("i8", g) for g in (32, 64, 1536)] == [8, 8, 8]


def q8_error_bound(x, w):
    """|x . w - xhat . w| for xhat quantized per 32 k (d = max|x| / 127, error <= d / 2)."""
    m, k = x.shape
    d = np.abs(x.reshape(m, k // 32, 32)).max(axis=2) / 127 / 2  # [m, blocks]
    wsum = np.abs(w).reshape(w.shape[0], k // 32, 32).sum(axis=2)  # [n, blocks]
    return d @ wsum.T


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("fmt,group", [("uint4", 32), ("int8", -1)])
def test_head_is_quantized_when_weights_are(isa, tiny_checkpoint, tmp_path, tied, fmt, group):
    src = tiny_checkpoint("llama", tie_word_embeddings=tied)
    cfg = {"quant_method": "instant_quant", "weight_format": fmt, "group_size": group}
    serialize(src, tmp_path, dtype="bfloat16", enable_quant=True, customized_quant_config=cfg)
    model = DashInferModel(str(tmp_path), "tiny")
    shard = Shard(0, 1, TINY["num_attention_heads"], TINY["num_key_value_heads"], TINY["intermediate_size"],
                  TINY["vocab_size"])
    weights = WeightLoader(model, shard).load()
    hidden, g = TINY["hidden_size"], TINY["hidden_size"] if group == -1 else group
    wtype, n, k, packed_group = K.unpack_linear(weights.lm_head)
    base = "u4" if fmt == "uint4" else "i8"
    assert wtype == (base + "q" if K.linear_vnni() else base) and (n, k, packed_group) == (TINY["vocab_size"], hidden, g)
    table = model.tensor("model.embed_tokens.weight")
    assert np.array_equal(weights.embedding, table)  # the lookup reads the exact bf16 rows
    head = from_bf16(model.tensor("model.embed_tokens.weight" if tied else "lm_head.weight"))
    stored, scales, zeros = quantize(head, fmt, g)
    ref_w = dequantize(stored, scales, zeros, fmt, g)
    x = np.random.default_rng(2).standard_normal((3, hidden)).astype(np.float32)
    y, ref = K.linear(x, weights.lm_head), x.astype(np.float64) @ ref_w.T
    slack = 0
    if wtype.endswith("q"):  # int8 activations, and scale, scale*zero rounded to fp16 (2^-11 of each)
        parts = np.abs(unpack_codes(stored, fmt) * np.repeat(scales, g, 1)) + np.repeat(np.abs(scales * zeros), g, 1)
        slack = q8_error_bound(x, ref_w) + 2.0**-11 * (np.abs(x) @ parts.T)
    assert (np.abs(y - ref) <= slack + 1e-4 * (1 + np.abs(ref))).all()
