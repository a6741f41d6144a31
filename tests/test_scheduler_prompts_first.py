"""Prompts first (prompt_step_tokens): while prompts wait, steps run whole prompts shortest first
until they reach prompt_step_tokens, decodes wait at most a whole step's tokens, aging still
bounds a long prompt's wait (no model, no clock)."""
from dashinfer_server.block_pool import BlockPool
from dashinfer_server.scheduler import Scheduler
from dashinfer_server.sequence import Phase
from tests.test_scheduler import run_step
from tests.test_scheduler_order import prompt


def test_prompt_only_steps_end_at_a_first_token_and_decodes_wait_one_step_of_tokens():
    sched = Scheduler(BlockPool(4096, 4), max_batch=64, max_step_tokens=40, prompt_step_tokens=8)
    decoding = prompt(2)
    sched.add(decoding)
    run_step(sched)
    assert decoding.phase == Phase.DECODE
    lens = (9, 3, 5, 12, 4, 7, 6, 2, 10, 3, 8, 5, 11, 4)
    prompts = [prompt(n) for n in lens]
    for p in prompts:
        sched.add(p)
    plen = dict(zip(prompts, lens))
    gap, gaps, steps = 0, [], []
    while any(p.phase != Phase.DECODE for p in prompts):
        chunks, _ = run_step(sched)
        steps.append(chunks)
        if any(c.seq is decoding for c in chunks):
            gaps.append((gap, sum(c.count for c in chunks if c.start < plen.get(c.seq, 0))))
            gap = 0
        else:
            gap += sum(c.count for c in chunks)
    only_prompts = [s for s in steps if all(c.start < plen.get(c.seq, 0) for c in s)]
    assert len(only_prompts) > len(steps) // 2
    for s in only_prompts:  # whole prompts shortest first until the step reaches 8 tokens (the
        # last may be cut where the decode's wait would exceed a whole step's tokens)
        assert all(c.sample for c in s[:-1]) and sum(c.count for c in s[:-1]) < 8
    firsts = [c.seq for s in steps for c in s if c.start < plen.get(c.seq, 0) and c.sample]
    assert [plen[p] for p in firsts] == sorted(lens)
    # the decode ran while prompts waited, after at most a whole step's tokens since its last
    # token, in a step with at most a prompt step's tokens of prompts
    assert gaps and all(before <= 40 and beside <= 8 for before, beside in gaps)


def test_a_prompt_alone_is_not_cut_to_prompt_steps():
    sched = Scheduler(BlockPool(4096, 4), max_batch=8, max_step_tokens=40, prompt_step_tokens=8)
    long = prompt(30)
    sched.add(long)
    chunks, _ = run_step(sched)
    assert [(c.seq, c.count, c.sample) for c in chunks] == [(long, 30, True)]


def test_decodes_run_when_no_waiting_prompt_can_start():
    """max_batch full: the waiting prompt cannot be admitted, the decode must still run."""
    sched = Scheduler(BlockPool(4096, 4), max_batch=1, max_step_tokens=40, prompt_step_tokens=8)
    running, waiting = prompt(3), prompt(2)
    sched.add(running)
    run_step(sched)
    sched.add(waiting)
    for _ in range(3):
        chunks, _ = run_step(sched)
        assert [c.seq for c in chunks] == [running]
    assert waiting.phase == Phase.WAITING


def test_aging_counts_whole_steps_of_tokens():
    """A long prompt among a stream of short ones is aged once max_wait_steps whole steps of
    tokens ran since it came, and starts in the next step."""
    wait, step_tokens = 2, 32
    sched = Scheduler(BlockPool(8192, 4), max_batch=256, max_step_tokens=step_tokens, max_wait_steps=wait,
                      prompt_step_tokens=8)
    long = prompt(20)
    sched.add(long)
    work_before = []
    for _ in range(40):
        sched.add(prompt(8))  # a short prompt each step: fills a prompt step
        work_before.append(sched.work)
        chunks, _ = run_step(sched)
        if any(c.seq is long for c in chunks):
            break
    assert work_before[-2] < wait * step_tokens <= work_before[-1]
    assert len(work_before) > 4  # many prompt steps: not aged by a count of steps


def test_prompt_steps_off_when_a_whole_step_is_no_longer():
    assert Scheduler(BlockPool(8, 4), 1, 32, prompt_step_tokens=32).prompt_step_tokens == 0
