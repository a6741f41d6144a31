"""Logits of the engine's forward equal transformers' on tiny random LLaMA and Qwen2 models.

The engine's own pieces run one step at a time, exactly as the model loop's thread runs them
(Scheduler.schedule -> build_plan -> DecoderModel.forward -> Scheduler.advance), without its
thread and sampler: every step's logits rows are kept, and the next token is transformers'
greedy choice (teacher forcing), so the two runs see the same tokens. The prompt is prefilled
in chunks (max_prefill_length 16) and 16 tokens are decoded; a second request that shares a
prefix with the first reuses its KV blocks from the prefix cache.
"""
import numpy as np
import pytest

from dashinfer_client import AsCacheMode, AsModelRuntimeConfigBuilder
from dashinfer_client.model import DashInferModel
from dashinfer_server.model_loop import ModelLoop
from dashinfer_server.plan import build_plan
from dashinfer_server.sequence import Sequence
from tests.engine_helpers import BLOCK, DEFAULT_KV_FORMAT, engine_logits, make_loop, reference
from tests.helpers import load_hf_model

# Per KV cache format: how the cache rounds K/V (simulated in the transformers reference), and
# the max abs logits error against plain fp32 transformers. AsCacheDefault keeps an fp32 model's
# K/V in fp32.
KV_FORMATS = {
    AsCacheMode.AsCacheDefault: (DEFAULT_KV_FORMAT, 1e-3),
    AsCacheMode.AsCacheQuantI8: ("int8", 1e-1),
    AsCacheMode.AsCacheQuantU4: ("uint4", 1.5),
}
# Against transformers whose K/V go through the same rounding as the cache.
SIMULATED_TOLERANCE = 1e-3


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch_models(request, serialized_tiny):
    loader = serialized_tiny(request.param)
    hf = load_hf_model(loader.model_path)
    hf.config._attn_implementation = "eager"  # the attention function cache_rounding wraps
    return request.param, DashInferModel(loader.model_output_dir, loader.serialize_model_name), hf


@pytest.mark.parametrize("kv_mode", list(KV_FORMATS), ids=lambda m: m.name)
def test_logits_match_transformers(arch_models, kv_mode):
    arch, model, hf = arch_models
    fmt, tolerance = KV_FORMATS[kv_mode]
    rng = np.random.default_rng(7)
    vocab = model.config.vocab_size
    first = [int(t) for t in rng.integers(3, vocab, 45)]
    # shares 40 tokens (two and a half blocks) with the first prompt, then goes its own way
    second = first[:40] + [int(t) for t in rng.integers(3, vocab, 9)]
    loop = make_loop(model, kv_mode)
    for i, prompt in enumerate((first, second)):
        forced, plain, rounded = reference(hf, prompt, fmt)
        got, seq = engine_logits(loop, prompt, forced)
        assert seq.table.cached_len == (0 if i == 0 else 32), "the second prompt reuses 2 blocks"
        where = f"{arch} {kv_mode.name} prompt {i}"
        err = np.abs(got - rounded).max(axis=1)
        assert err.max() < SIMULATED_TOLERANCE, f"{where}: max abs error per step {err}"
        err = np.abs(got - plain).max(axis=1)
        assert err.max() < tolerance, f"{where} vs plain transformers: max abs error per step {err}"


def test_prefix_cache_off_recomputes(arch_models):
    arch, model, hf = arch_models
    cfg = (AsModelRuntimeConfigBuilder().model_name("tiny").model_dir(model.model_dir, model.prefix)
           .max_batch(4).max_length(256).max_prefill_length(16).kv_cache_span_size(BLOCK)
           .prefill_cache(False).build())
    loop = ModelLoop(model, cfg)
    loop.load()
    prompt = list(range(3, 48))
    forced, _, rounded = reference(hf, prompt, KV_FORMATS[AsCacheMode.AsCacheDefault][0])
    for _ in range(2):
        got, seq = engine_logits(loop, prompt, forced)
        assert seq.table.cached_len == 0
        assert np.abs(got - rounded).max() < SIMULATED_TOLERANCE


def test_a_wrong_weight_is_caught(arch_models):
    """The comparison can fail: one slightly scaled norm weight moves the logits far beyond it."""
    arch, model, hf = arch_models
    loop = make_loop(model, AsCacheMode.AsCacheDefault)
    prompt = list(range(3, 30))
    forced, _, rounded = reference(hf, prompt, KV_FORMATS[AsCacheMode.AsCacheDefault][0])
    layer = loop.model.weights.layers[1]
    layer.mlp_norm = layer.mlp_norm * np.float32(1.01)
    loop.model.bind_native()
    got, _ = engine_logits(loop, prompt, forced)
    assert np.abs(got - rounded).max() > 10 * SIMULATED_TOLERANCE


@pytest.mark.parametrize("kv_mode", list(KV_FORMATS), ids=lambda m: m.name)
def test_native_decoder_gives_the_op_by_op_forwards_logits(arch_models, kv_mode):
    """K.decoder_run (every layer in one call) against the same kernels called op by op from
    Python, bit for bit, over mixed steps: chunked prompts of three requests beside decodes."""
    arch, model, hf = arch_models
    loop = make_loop(model, kv_mode)
    decoder = loop.model
    rng = np.random.default_rng(11)
    seqs = [Sequence([int(t) for t in rng.integers(3, model.config.vocab_size, n)], n + 8)
            for n in (20, 37, 5)]
    for seq in seqs:
        loop.scheduler.add(seq)
    steps = 0
    while loop.scheduler.running or loop.scheduler.waiting:
        chunks, interrupted = loop.scheduler.schedule()
        assert not interrupted
        plan = build_plan(chunks, loop.pool.block_size)
        decoder.fused = True
        fused = decoder.forward(plan).copy()
        decoder.fused = False  # writes the same K/V into the same slots again
        by_op = decoder.forward(plan).copy()
        assert np.array_equal(fused, by_op), f"{arch} {kv_mode.name} step {steps}"
        loop.scheduler.advance(chunks)
        for row, chunk in enumerate(c for c in chunks if c.sample):
            chunk.seq.tokens.append(int(np.argmax(fused[row])))
            if len(chunk.seq.tokens) >= chunk.seq.max_length:
                loop.scheduler.finish(chunk.seq)
        steps += 1
    assert steps > 8


def test_native_decoder_refuses_a_bad_plan(arch_models):
    from dashinfer_server import kernels as K
    arch, model, hf = arch_models
    decoder = make_loop(model, AsCacheMode.AsCacheDefault).model
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    good = dict(positions=i32(0, 1), slots=i32(0, 1), block_tables=i32([[0]]).reshape(1, 1),
                q_offsets=i32(0, 2), context_lens=i32(2))
    K.decoder_run(decoder.native, **good)
    n_slots = decoder.kv.num_blocks * decoder.kv.block_size
    for change, error, words in (
            (dict(slots=i32(0, n_slots)), IndexError, r"slots\[1\] = "),
            (dict(positions=i32(0, 10**7)), IndexError, "rope table"),
            (dict(block_tables=i32([[decoder.kv.num_blocks]]).reshape(1, 1)), IndexError, "block_tables"),
            (dict(context_lens=i32(1)), ValueError, "less than its 2 queries"),
            (dict(positions=np.zeros(0, np.int32), slots=np.zeros(0, np.int32), q_offsets=i32(0, 0)),
             ValueError, "tokens"),
            (dict(slots=np.zeros(2, np.int64)), TypeError, "slots")):
        with pytest.raises(error, match=words):
            K.decoder_run(decoder.native, **dict(good, **change))
    with pytest.raises(TypeError, match="decoder_new"):
        K.decoder_run(object(), **good)
    w = decoder.weights.layers[0]
    layer = dict(attn_norm=w.attn_norm, mlp_norm=w.mlp_norm, q=w.q, k=w.k, v=w.v, o=w.o,
                 gate_up=w.gate_up, down=w.down, cos_sin=decoder.cos_sin[0], **decoder.kv.layers[0])
    workspace = vars(decoder.ws)
    new = lambda layers, ws=workspace: K.decoder_new(layers, ws, decoder.heads, 1e-5, 0.1)  # noqa: E731
    with pytest.raises(ValueError, match=r"decoder_new: q is \["):  # k's weight where q's goes
        new([dict(layer, q=w.k)])
    with pytest.raises(ValueError, match="decoder_new: h has size"):  # a kv-wide row as h
        new([layer], dict(workspace, h=decoder.ws.k))
    new([layer])
    new([dict(layer, q_bias=None, k_bias=None, v_bias=None)])  # None: no bias, as absent
    with pytest.raises(TypeError, match="decoder_new: down is required"):
        new([{n: a for n, a in layer.items() if n != "down"}])
    with pytest.raises(ValueError, match="decoder_new: a layer has no field 'qbias'"):
        new([dict(layer, qbias=np.zeros(w.q.shape[0], np.float32))])  # misspelt: not dropped
    with pytest.raises(TypeError, match="dict of named arrays"):
        new([tuple(layer.values())])
    with pytest.raises(ValueError, match="q_norm and k_norm come together"):
        new([dict(layer, q_norm=np.ones(decoder.cfg.head_dim, np.float32))])
    with pytest.raises(ValueError, match="window -1"):
        new([dict(layer, window=-1)])
    with pytest.raises(ValueError, match="act must be .silu., .gelu_tanh., .clamped_swiglu., .relu2. or .xielu., got .relu."):
        K.decoder_new([layer], workspace, decoder.heads, 1e-5, 0.1, act="relu")
    with pytest.raises(ValueError, match="act 'relu2' is a plain MLP's .gated=0."):  # Arcee's, with no gate
        K.decoder_new([layer], workspace, decoder.heads, 1e-5, 0.1, act="relu2")


def test_native_decoder_takes_attention_sinks(arch_models):
    """gpt-oss's attention sinks (LayerWeights.sinks, this rank's heads) reach both forwards: the
    native decoder gives the op-by-op logits bit for bit (whose attention test_attention_sinks holds
    to transformers' formula), and the sinks move the logits."""
    arch, model, hf = arch_models
    loop = make_loop(model, AsCacheMode.AsCacheDefault)
    decoder = loop.model
    loop.scheduler.add(Sequence(list(range(3, 15)), 40))  # one chunk (max_prefill_length 16), sampled
    chunks, _ = loop.scheduler.schedule()
    plan = build_plan(chunks, loop.pool.block_size)
    decoder.fused = False
    plain = decoder.forward(plan).copy()
    rng = np.random.default_rng(5)
    for layer in decoder.weights.layers:
        layer.sinks = rng.normal(0.0, 2.0, decoder.heads).astype(np.float32)
    decoder.bind_native()
    by_op = decoder.forward(plan).copy()  # writes the same K/V into the same slots again
    decoder.fused = True
    assert np.array_equal(decoder.forward(plan), by_op)
    assert np.abs(by_op - plain).max() > 1e-2
