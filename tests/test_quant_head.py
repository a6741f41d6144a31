"""The output head of a quantized model is int8 in memory (the embedding, tied or not, stays exact)."""
import numpy as np
import pytest

from dashinfer_client.dtypes import from_bf16, to_bf16
from dashinfer_client.model import DashInferModel
from dashinfer_client.model.quant import dequantize, quantize
from dashinfer_server import kernels as K
from dashinfer_server.shard import Shard
from dashinfer_server.weights import WeightLoader
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


def q8_error_bound(x, w):
    """|x . w - xhat . w| for xhat quantized per 32 k (d = max|x| / 127, error <= d / 2)."""
    m, k = x.shape
    d = np.abs(x.reshape(m, k // 32, 32)).max(axis=2) / 127 / 2  # [m, blocks]
    wsum = np.abs(w).reshape(w.shape[0], k // 32, 32).sum(axis=2)  # [n, blocks]
    return d @ wsum.T


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("fmt,group", [("uint4", 32), ("int8", -1)])
def test_head_is_int8_when_weights_are_quantized(isa, tiny_checkpoint, tmp_path, tied, fmt, group):
    src = tiny_checkpoint("llama", tie_word_embeddings=tied)
    cfg = {"quant_method": "instant_quant", "weight_format": fmt, "group_size": group}
    serialize(src, tmp_path, dtype="bfloat16", enable_quant=True, customized_quant_config=cfg)
    model = DashInferModel(str(tmp_path), "tiny")
    shard = Shard(0, 1, TINY["num_attention_heads"], TINY["num_key_value_heads"], TINY["intermediate_size"],
                  TINY["vocab_size"])
    weights = WeightLoader(model, shard).load()
    hidden, g = TINY["hidden_size"], TINY["hidden_size"] if group == -1 else group
    wtype, n, k, packed_group = K.unpack_linear(weights.lm_head)
    assert wtype == ("i8q" if K.linear_vnni() else "i8") and (n, k, packed_group) == (TINY["vocab_size"], hidden, g)
    table = model.tensor("model.embed_tokens.weight")
    assert np.array_equal(weights.embedding, table)  # the lookup reads the exact bf16 rows
    head = from_bf16(model.tensor("model.embed_tokens.weight" if tied else "lm_head.weight"))
    ref_w = dequantize(*quantize(head, "int8", g), "int8", g)
    x = np.random.default_rng(2).standard_normal((3, hidden)).astype(np.float32)
    y, ref = K.linear(x, weights.lm_head), x.astype(np.float64) @ ref_w.T
    slack = q8_error_bound(x, ref_w) if wtype == "i8q" else 0
    assert (np.abs(y - ref) <= slack + 1e-4 * (1 + np.abs(ref))).all()
