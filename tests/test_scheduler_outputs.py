"""Whatever order the scheduler picks (shortest first, aging, prompts cut where they do not
finish, decodes taking turns), every greedy request gets the tokens it gets alone."""
import numpy as np
import pytest

from dashinfer_client import AsModelRuntimeConfigBuilder
from dashinfer_client.model import DashInferModel
from dashinfer_server.block_pool import BlockPool
from dashinfer_server.model_loop import ModelLoop
from dashinfer_server.request import ModelLimits, new_request
from dashinfer_server.scheduler import Scheduler
from dashinfer_server.sequence import Phase
from tests.engine_helpers import hf_greedy
from tests.helpers import load_hf_model


@pytest.fixture(scope="module")
def loop(serialized_tiny):
    """A loaded loop (no thread) of steps of at most 13 tokens beside up to 12 requests: more
    decoding requests than half a step holds."""
    loader = serialized_tiny("llama")
    model = DashInferModel(loader.model_output_dir, loader.serialize_model_name)
    cfg = (AsModelRuntimeConfigBuilder().model_name("tiny").model_dir(model.model_dir, model.prefix)
           .max_batch(12).max_length(96).max_prefill_length(8).kv_cache_span_size(16).build())
    loop = ModelLoop(model, cfg)
    loop.load()
    loop.scheduler.max_wait_steps = 4
    return loop


def start(loop, prompt, new):
    limits = ModelLimits(loop.model.cfg.vocab_size, loop.cfg.max_length, loop.block_capacity)
    seq = new_request(prompt, {"max_length": len(prompt) + new, "do_sample": False,
                               "early_stopping": False}, limits)
    loop.scheduler.add(seq)
    return seq


def drain(loop, arrivals=()):
    """Step until idle; arrivals: (step, prompt, new) started before that step. Returns the
    sequences of the arrivals and every step as (requests decoding before it, decodes it ran,
    its chunks as (sequence, count))."""
    pending, seqs, steps = sorted(arrivals, key=lambda a: a[0]), [], []
    scheduler = loop.scheduler
    while pending or scheduler.has_work():
        while pending and pending[0][0] <= len(steps):
            _, prompt, new = pending.pop(0)
            seqs.append(start(loop, prompt, new))
        decoding = sum(s.phase == Phase.DECODE for s in scheduler.running)
        chunks, interrupted = scheduler.schedule()
        assert not interrupted
        ran = sum(c.seq.phase == Phase.DECODE for c in chunks)
        steps.append((decoding, ran, [(c.seq, c.count) for c in chunks]))
        scheduler.schedule = lambda: (chunks, [])  # loop.step runs these chunks
        try:
            loop.step()
        finally:
            del scheduler.schedule
    return seqs, steps


def arrivals(vocab):
    rng = np.random.default_rng(5)
    return [(step, rng.integers(3, vocab, n).tolist(), new) for step, n, new in
            [(0, 30, 6), (0, 3, 20), (0, 11, 9), (0, 5, 14), (1, 2, 18), (1, 25, 5), (2, 4, 16),
             (2, 7, 12), (3, 1, 22), (3, 19, 8), (4, 6, 15), (5, 9, 10)]]


def solo_tokens(loop, arrivals):
    solo = []
    for _, prompt, new in arrivals:
        (seq,), _ = drain(loop, [(0, prompt, new)])
        solo.append(seq.tokens)
    return solo


def test_every_request_gets_its_solo_tokens(loop):
    arrivals_ = arrivals(loop.model.cfg.vocab_size)
    seqs, steps = drain(loop, arrivals_)
    assert [s.tokens for s in seqs] == solo_tokens(loop, arrivals_)
    # the orders under test happened: a later, shorter prompt ran before the 30-token one, a
    # prompt was cut into chunks, and a step ran fewer decodes than requests were decoding
    def first_step(seq):
        return next(i for i, (_, _, chunks) in enumerate(steps) if any(s is seq for s, _ in chunks))
    assert first_step(seqs[4]) < first_step(seqs[0])
    assert any(s is seqs[0] and 1 < n < seqs[0].prompt_len for _, _, chunks in steps for s, n in chunks)
    assert any(ran < decoding for decoding, ran, _ in steps)
    assert all(sum(n for _, n in chunks) <= loop.max_step_tokens for _, _, chunks in steps)


def test_prompts_first_gives_the_solo_tokens(loop):
    """Prompt-only steps of 4 tokens (decodes held back for up to a whole step): same tokens."""
    default = loop.scheduler
    loop.scheduler = Scheduler(loop.pool, loop.cfg.max_batch, loop.max_step_tokens, 4, prompt_step_tokens=4)
    try:
        arrivals_ = arrivals(loop.model.cfg.vocab_size)
        seqs, steps = drain(loop, arrivals_)
        assert [s.tokens for s in seqs] == solo_tokens(loop, arrivals_)
        assert any(decoding and not ran for decoding, ran, _ in steps)  # decodes were held back
    finally:
        loop.scheduler = default


def test_a_preempted_request_reports_the_prefix_its_prompt_found(loop):
    """Recomputed after a preemption, a request finds its own blocks in the prefix cache (prompt
    and generated tokens); its prefix_cache_len and context_cached_length stay what its prompt
    found when it came (none here): never more than its prompt, never a negative context_tps."""
    default_pool, default_scheduler = loop.pool, loop.scheduler
    loop.pool = BlockPool(7, loop.pool.block_size)  # 112 tokens for 3 requests of 80
    loop.scheduler = Scheduler(loop.pool, 3, loop.max_step_tokens)
    try:
        rng = np.random.default_rng(3)
        seqs, _ = drain(loop, [(0, rng.integers(3, loop.model.cfg.vocab_size, 20).tolist(), 60)
                               for _ in range(3)])
        assert loop.scheduler.preemptions > 0
        for seq in seqs:
            elements = []
            while (element := seq.queue.GetNoWait()) is not None:
                elements.append(element)
            info = seq.queue.RequestStatInfo()
            assert {e.prefix_cache_len for e in elements} == {0}
            assert info["context_cached_length"] == 0 and info["context_tps"] > 0
        assert loop.pool.num_available == 7
    finally:
        loop.pool, loop.scheduler = default_pool, default_scheduler


def test_a_prompt_that_starts_like_generated_text_gets_transformers_tokens(loop, serialized_tiny):
    """Two identical greedy requests compute the same blocks side by side; a later prompt that
    starts with 16 of their generated tokens (a block of them, deep in their context) shares no
    KV with them: it gets transformers' greedy tokens."""
    rng = np.random.default_rng(8)
    vocab = loop.model.cfg.vocab_size
    prompt = rng.integers(3, vocab, 20).tolist()
    first, second = drain(loop, [(0, prompt, 44), (0, prompt, 44)])[0]
    assert first.tokens == second.tokens
    follow_up = first.tokens[32:48] + rng.integers(3, vocab, 5).tolist()
    (seq,), _ = drain(loop, [(0, follow_up, 12)])
    assert seq.prompt_cached == 0
    hf = load_hf_model(serialized_tiny("llama").model_path)
    assert seq.tokens[len(follow_up):] == hf_greedy(hf, follow_up, 12)
