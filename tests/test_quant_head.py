"""The output head of a quantized model is quantized in memory to int8 in groups of 128 (64 or 32 where
128 does not divide its width; per channel under a per-channel model), under int8 and uint4 layers alike (dashinfer_server/weights.py HEAD_BITS); the embedding, tied or not, stays exact."""
import numpy as np
import pytest

from dashinfer_client.dtypes import from_bf16, to_bf16
from dashinfer_client.model import DashInferModel
from dashinfer_client.model.quant import dequantize, quantize, unpack_codes
from dashinfer_server import kernels as K
from dashinfer_server.shard import Shard
from dashinfer_server.weights import WeightLoader
from tests.helpers import TINY, serialize
from tests.quant_reference import numpy_quantize


@pytest.mark.parametrize("fmt,bits", [("int8", 8), ("uint4", 4)])
def test_native_quantize_is_instant_quant_bit_for_bit(fmt, bits):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((37, 192)) * rng.uniform(0.01, 3, (37, 1))).astype(np.float32)
    w[2, :64] = 0.25  # a constant group: scale 1
    for source, ref_w, group in ((w, w, 64), (to_bf16(w), from_bf16(to_bf16(w)), 192), (w, w, 32)):
        got = K.quantize(source, group, bits)
        want = numpy_quantize(ref_w, fmt, group)
        assert len(got) == len(want) == (4 if bits == 4 else 3)
        for part, ref in zip(got, want):
            assert part.dtype == ref.dtype and np.array_equal(part, ref)
    with pytest.raises(ValueError, match="does not divide"):
        K.quantize(w, 100, bits)


def q8_error_bound(x, w):
    """|x . w - xhat . w| for xhat quantized per 32 k (d = max|x| / 127, error <= d / 2)."""
    m, k = x.shape
    d = np.abs(x.reshape(m, k // 32, 32)).max(axis=2) / 127 / 2  # [m, blocks]
    wsum = np.abs(w).reshape(w.shape[0], k // 32, 32).sum(axis=2)  # [n, blocks]
    return d @ wsum.T


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("fmt,group,hidden,head_group", [("uint4", 32, 256, 128), ("uint4", 32, 192, 64),
                                                         ("int8", 64, 96, 32), ("int8", -1, 256, 256)])
def test_head_is_quantized_when_weights_are(isa, tiny_checkpoint, tmp_path, tied, fmt, group, hidden, head_group):
    # head_dim 16 whatever the width (96 / 4 heads would be 24, which the KV cache does not take)
    src = tiny_checkpoint("llama", tie_word_embeddings=tied, hidden_size=hidden, head_dim=16)
    cfg = {"quant_method": "instant_quant", "weight_format": fmt, "group_size": group}
    serialize(src, tmp_path, dtype="bfloat16", enable_quant=True, customized_quant_config=cfg)
    model = DashInferModel(str(tmp_path), "tiny")
    shard = Shard(0, 1, TINY["num_attention_heads"], TINY["num_key_value_heads"], TINY["intermediate_size"],
                  TINY["vocab_size"])
    weights = WeightLoader(model, shard).load()
    g = head_group  # the head's group, whatever the layers'
    wtype, n, k, packed_group = K.unpack_linear(weights.lm_head)
    assert wtype == ("i8q" if K.linear_q8_path() == "vnni" else "i8") and (n, k, packed_group) == (TINY["vocab_size"], hidden, g)
    table = model.tensor("model.embed_tokens.weight")
    assert np.array_equal(weights.embedding, table)  # the lookup reads the exact bf16 rows
    head = from_bf16(model.tensor("model.embed_tokens.weight" if tied else "lm_head.weight"))
    stored, scales, zeros = quantize(head, "int8", g)
    ref_w = dequantize((stored, scales, zeros), "int8", g)
    x = np.random.default_rng(2).standard_normal((3, hidden)).astype(np.float32)
    y, ref = K.linear(x, weights.lm_head), x.astype(np.float64) @ ref_w.T
    slack = 0
    if wtype.endswith("q"):
        slack = vnni_slack(x, ref_w, unpack_codes(stored, "int8"), np.repeat(scales, g, 1), np.repeat(zeros, g, 1))
    assert (np.abs(y - ref) <= slack + 1e-4 * (1 + np.abs(ref))).all()


def vnni_slack(x, ref_w, codes, scale_cols, zero_cols):
    """What the VNNI formats may add to x . w: int8 activations, and i8q's scale, scale*zero
    rounded to fp16 (2^-11 of each; scale_cols, zero_cols: each column's group values, None for
    u4q, whose float32 scales are exact)."""
    if scale_cols is None:
        return q8_error_bound(x, ref_w)
    parts = np.abs(codes * scale_cols) + np.abs(scale_cols * zero_cols)
    return q8_error_bound(x, ref_w) + 2.0**-11 * (np.abs(x) @ parts.T)
