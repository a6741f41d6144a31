import logging

from dashinfer_server.block_pool import BlockPool
from dashinfer_server.scheduler import Scheduler
from dashinfer_server.sequence import Phase, Sequence


def run_step(sched, new_token=7):
    """Schedule, pretend the model ran, append a token to every sampled sequence."""
    chunks, interrupted = sched.schedule()
    sched.advance(chunks)
    for c in chunks:
        if c.sample:
            c.seq.tokens.append(new_token)
    return chunks, interrupted


def test_prompt_is_chunked_by_the_token_budget_then_decodes():
    sched = Scheduler(BlockPool(64, 4), max_batch=4, max_step_tokens=8)
    seq = Sequence(list(range(20)), 64)
    sched.add(seq)
    sizes = []
    for _ in range(5):
        chunks, _ = run_step(sched)
        sizes.append([(c.start, c.count, c.sample) for c in chunks])
    assert sizes == [[(0, 8, False)], [(8, 8, False)], [(16, 4, True)], [(20, 1, True)],
                     [(21, 1, True)]]
    assert seq.phase == Phase.DECODE and seq.num_computed == 22


def test_new_requests_join_running_decodes_in_the_same_step():
    sched = Scheduler(BlockPool(64, 4), max_batch=4, max_step_tokens=16)
    a, b = Sequence(list(range(5)), 64), Sequence(list(range(10, 16)), 64)
    sched.add(a)
    run_step(sched)
    sched.add(b)
    chunks, _ = run_step(sched)
    assert [(c.seq, c.count) for c in chunks] == [(a, 1), (b, 6)]


def test_max_batch_and_fifo_admission():
    sched = Scheduler(BlockPool(64, 4), max_batch=2, max_step_tokens=100)
    seqs = [Sequence([i] * 3, 64) for i in range(3)]
    for s in seqs:
        sched.add(s)
    chunks, _ = run_step(sched)
    assert [c.seq for c in chunks] == seqs[:2]
    sched.finish(seqs[0])
    chunks, _ = run_step(sched)
    assert [c.seq for c in chunks] == [seqs[1], seqs[2]]


def test_first_in_line_is_not_overtaken_when_the_pool_is_short():
    """The shortest prompt is first in line; when the pool cannot hold it yet, longer ones wait
    behind it rather than take the blocks it needs."""
    sched = Scheduler(BlockPool(5, 4), max_batch=8, max_step_tokens=100)
    running = Sequence(list(range(12)), 64)
    sched.add(running)
    run_step(sched)  # 3 blocks used, then a 4th for its first decode token: 1 left
    small, big = Sequence(list(range(20, 27)), 64), Sequence(list(range(30, 43)), 64)
    sched.add(big)
    sched.add(small)
    assert sched.prompt_order() == [small, big]
    chunks, _ = run_step(sched)
    assert [c.seq for c in chunks] == [running]
    assert sched.waiting == [big, small]


def test_pool_exhaustion_preempts_the_latest_admitted_which_recomputes_first_later(caplog):
    caplog.set_level(logging.DEBUG, logger="dashinfer_server")
    sched = Scheduler(BlockPool(4, 4), max_batch=8, max_step_tokens=100)
    first, second = Sequence(list(range(7)), 64), Sequence(list(range(20, 28)), 64)  # no common prefix
    sched.add(first)
    sched.add(second)
    run_step(sched)  # first: 7+1 tokens in 2 blocks; second: 8+1 in 2 blocks, needs a 3rd
    newcomer = Sequence([50, 51], 64)
    sched.add(newcomer)
    chunks, interrupted = run_step(sched)
    assert interrupted == [] and [c.seq for c in chunks] == [first]  # nobody admitted in this step
    assert second.phase == Phase.WAITING and second.num_computed == 0 and sched.preemptions == 1
    assert second.tokens == list(range(20, 28)) + [7]  # what it generated stays
    assert sched.pool.num_available == 2  # its blocks, kept in the prefix cache
    assert sched.prompt_order() == [second, newcomer]  # the preempted goes on first
    assert caplog.records[-1].getMessage() == (
        f"preempt request {second.handle} (admitted last, 9 tokens): request {second.handle} needs a "
        "KV block and none is free")
    sched.finish(first)
    run_step(sched)  # admitted again: its two full blocks come back from the prefix cache
    assert second.phase == Phase.DECODE and second.num_computed == 8
    chunks, interrupted = run_step(sched)  # only its newest token is computed, as a decode
    assert [(c.seq, c.start, c.count, c.sample) for c in chunks][0] == (second, 8, 1, True)
    assert second.tokens[-2:] == [7, 7] and len(second.tokens) == 10


def test_a_preempted_sequence_recomputes_its_prompt_then_its_tokens_one_a_step():
    """Prompt tokens again as a prompt chunk, generated ones as decodes did them: one per step,
    sampled only at its newest token."""
    sched = Scheduler(BlockPool(16, 4), max_batch=8, max_step_tokens=100)
    seq = Sequence(list(range(10)), 64)
    sched.add(seq)
    for _ in range(4):
        run_step(sched)  # 10 prompt + 4 generated tokens
    sched.pool.clear_cache()
    sched._preempt(seq, seq)
    sched.pool.clear_cache()  # nothing kept: everything is recomputed
    spans = [[(c.start, c.count, c.sample) for c in run_step(sched)[0]] for _ in range(5)]
    assert spans == [[(0, 10, False)], [(10, 1, False)], [(11, 1, False)], [(12, 1, False)], [(13, 1, True)]]
    assert seq.phase == Phase.DECODE and len(seq.tokens) == 15


def test_a_sequence_the_whole_pool_cannot_hold_is_interrupted():
    sched = Scheduler(BlockPool(2, 4), max_batch=8, max_step_tokens=100)
    seq = Sequence(list(range(7)), 64)
    sched.add(seq)
    run_step(sched)  # 8 tokens: 2 blocks, full
    chunks, interrupted = run_step(sched)  # the 8th token's K/V fits; then 9 tokens
    assert [c.seq for c in chunks] == [seq] and not interrupted
    chunks, interrupted = run_step(sched)  # the 9th needs a 3rd block: nothing to preempt
    assert interrupted == [seq] and chunks == [] and seq.phase == Phase.DONE
    assert sched.preemptions == 0 and sched.pool.num_available == 2


def test_prefix_cache_skips_computed_tokens():
    sched = Scheduler(BlockPool(64, 4), max_batch=4, max_step_tokens=100)
    a = Sequence(list(range(10)), 64)
    sched.add(a)
    run_step(sched)
    b = Sequence(list(range(9)) + [42], 64)
    sched.add(b)
    chunks, _ = run_step(sched)
    assert [(c.seq, c.start, c.count) for c in chunks] == [(a, 10, 1), (b, 8, 2)]
    assert b.table.cached_len == 8


def test_finish_frees_blocks_and_waiting_can_be_removed():
    pool = BlockPool(8, 4)
    sched = Scheduler(pool, max_batch=1, max_step_tokens=100)
    a, b = Sequence(list(range(6)), 64), Sequence(list(range(3)), 64)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    sched.finish(b)
    sched.finish(a)
    assert not sched.has_work() and pool.num_available == 8


def test_prompts_sent_together_share_the_blocks_one_of_them_computes():
    """n copies of a prompt (OpenAI's n): one computes its whole blocks, the others wait for them
    and take them from the prefix cache; the reference is what a pool without sharing would do,
    n times the prompt's tokens computed."""
    block, prompt_len, n = 4, 18, 3
    sched = Scheduler(BlockPool(64, block), max_batch=8, max_step_tokens=64)
    copies = [Sequence(list(range(100, 100 + prompt_len)), 64) for _ in range(n)]
    other = Sequence(list(range(1, 6)), 64)  # a different prompt is not held back
    for s in copies + [other]:
        sched.add(s)
    computed = {s: 0 for s in copies + [other]}
    for _ in range(4):
        chunks, _ = run_step(sched)
        for c in chunks:
            if c.seq.phase != Phase.DONE and c.start < c.seq.prompt_len:
                computed[c.seq] += min(c.count, c.seq.prompt_len - c.start)
    cached = prompt_len - 1 - (prompt_len - 1) % block  # whole blocks before the last token: 16
    assert computed[other] == 5 and computed[copies[0]] == prompt_len
    assert [s.table.cached_len for s in copies] == [0] + [cached] * (n - 1)
    assert [computed[s] for s in copies[1:]] == [prompt_len - cached] * (n - 1)
    assert all(s.phase == Phase.DECODE for s in copies + [other])
def test_random_traffic_under_kv_pressure_recomputes_exactly():
    """A fake model over a simulated KV cache: each step writes its chunks' tokens into their
    blocks and reads back every earlier position a chunk attends to; a sampled token is a function
    of the tokens so far. Under random arrivals (some prompts copies of another's tokens from a
    block's start) and a pool far too small, every chunk must attend to exactly its sequence's
    tokens, each K/V computed behind the same history (prefix-cache blocks included), every
    sequence must finish with the tokens it gets alone, and preemptions must have happened."""
    import random
    preempted = 0
    for trial in range(60):
        rng = random.Random(trial)
        pool = BlockPool(rng.randint(10, 24), 4)  # 40 tokens, the longest sequence, fit alone
        sched = Scheduler(pool, max_batch=rng.randint(2, 8), max_step_tokens=rng.randint(8, 40),
                          prompt_step_tokens=rng.choice([0, 6]))
        kv = {}  # (block id, offset) -> the tokens up to the one whose K/V sits there (its history)
        alone = lambda tokens: hash(tuple(tokens)) % 5  # noqa: E731 (the fake model's next token)
        seqs = []
        for step in range(600):
            if rng.random() < 0.2 and len(seqs) < 24:
                n = rng.randint(1, 10)
                prompt = [rng.randrange(5) for _ in range(n)]
                if seqs and rng.random() < 0.5:  # a copy of some tokens of another, from a block's start
                    other = rng.choice(seqs).tokens
                    start = 4 * rng.randrange(len(other) // 4 + 1)
                    prompt = other[start:start + n] or prompt
                seqs.append(Sequence(prompt, len(prompt) + rng.randint(1, 30)))
                sched.add(seqs[-1])
            chunks, interrupted = sched.schedule()
            assert not interrupted  # every sequence fits the pool alone
            for c in chunks:
                seq, bs = c.seq, pool.block_size
                assert c.count > 0 and c.start == seq.num_computed
                for pos in range(c.start, c.start + c.count):
                    kv[(seq.table.blocks[pos // bs], pos % bs)] = tuple(seq.tokens[:pos + 1])
                assert [kv[(seq.table.blocks[p // bs], p % bs)] for p in range(c.start + c.count)] == \
                    [tuple(seq.tokens[:p + 1]) for p in range(c.start + c.count)]
            sched.advance(chunks)
            for c in chunks:
                if c.sample:
                    c.seq.tokens.append(alone(c.seq.tokens))
                    if len(c.seq.tokens) == c.seq.max_length:
                        sched.finish(c.seq)
        for seq in seqs:
            expected = seq.tokens[:seq.prompt_len]
            while len(expected) < len(seq.tokens):
                expected.append(alone(expected))
            assert seq.tokens == expected
        assert all(s.phase == Phase.DONE for s in seqs[:len(seqs) // 2])  # the older half is done
        preempted += sched.preemptions
    assert preempted > 0
