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


def test_pool_exhaustion_interrupts_the_latest_admitted(caplog):
    caplog.set_level(logging.DEBUG, logger="dashinfer_server")
    sched = Scheduler(BlockPool(4, 4), max_batch=8, max_step_tokens=100)
    first, second = Sequence(list(range(7)), 64), Sequence(list(range(10, 18)), 64)  # no common prefix
    sched.add(first)
    sched.add(second)
    run_step(sched)  # first: 7+1 tokens in 2 blocks; second: 8 in 2 blocks, needs a 3rd
    chunks, interrupted = run_step(sched)
    assert interrupted == [second] and second.phase == Phase.DONE
    assert [c.seq for c in chunks] == [first]
    assert sched.pool.num_available == 2  # the victim's blocks, freed
    assert caplog.records[-1].getMessage() == (
        f"interrupt request {second.handle} (admitted last): request {second.handle} needs a KV "
        "block and none is free")


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
