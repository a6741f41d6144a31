"""The scheduler's order and budget, step by step (no model, no clock): prompts shortest first,
aged prompts first come first served, a prompt not started where it cannot finish, decodes held
to half a step while prompts wait."""
import pytest

from dashinfer_client.settings import SettingError
from dashinfer_server.block_pool import BlockPool
from dashinfer_server.scheduler import (MAX_WAIT_STEPS, PROMPT_STEP_TOKENS, Scheduler, max_wait_steps,
                                        prompt_step_tokens)
from dashinfer_server.sequence import Phase, Sequence
from tests.test_scheduler import run_step

_next = iter(range(10**9))


def prompt(n):
    """A prompt of n tokens no other prompt shares (no prefix-cache hits between them)."""
    return Sequence([next(_next) for _ in range(n)], 10**6)


def test_prompts_are_admitted_shortest_first():
    sched = Scheduler(BlockPool(256, 4), max_batch=8, max_step_tokens=1000)
    seqs = [prompt(n) for n in (30, 5, 17, 9, 40)]
    for s in seqs:
        sched.add(s)
    chunks, _ = run_step(sched)
    assert [len(c.seq.tokens) - 1 for c in chunks] == [5, 9, 17, 30, 40]
    assert [c.seq for c in chunks] == sched.running  # admitted in that order


def test_zero_wait_steps_is_first_come_first_served():
    sched = Scheduler(BlockPool(256, 4), max_batch=8, max_step_tokens=1000, max_wait_steps=0)
    seqs = [prompt(n) for n in (30, 5, 17, 9, 40)]
    for s in seqs:
        sched.add(s)
    chunks, _ = run_step(sched)
    assert [c.seq for c in chunks] == seqs


def test_step_budget_and_no_prompt_started_where_it_cannot_finish():
    """A step holds at most max_step_tokens tokens; once prompts fill half of it, a prompt that
    would not finish in it waits for the next step instead of being cut."""
    sched = Scheduler(BlockPool(256, 4), max_batch=8, max_step_tokens=20)
    a, b, c = prompt(8), prompt(9), prompt(30)
    for s in (c, b, a):
        sched.add(s)
    steps = []
    while any(s.phase != Phase.DECODE for s in (a, b, c)):
        chunks, _ = run_step(sched)
        assert sum(ch.count for ch in chunks) <= 20
        steps.append([(ch.seq, ch.count) for ch in chunks])
    # a and b finish in step 1 (17 tokens); c (30) would not finish in the 3 left: not started
    assert steps[0] == [(a, 8), (b, 9)]
    # then c is cut: 18 tokens beside the 2 decodes, then the rest
    assert steps[1] == [(a, 1), (b, 1), (c, 18)]
    assert steps[2] == [(a, 1), (b, 1), (c, 12)]


def test_a_long_prompt_waits_at_most_max_wait_steps():
    """Short prompts arriving every step would overtake a long one forever; after
    max_wait_steps steps it goes first, and its chunks keep going first until it has finished."""
    wait = 3
    sched = Scheduler(BlockPool(4096, 4), max_batch=64, max_step_tokens=16, max_wait_steps=wait)
    long = prompt(40)
    sched.add(long)
    sched.add(prompt(12))
    started = finished = None
    for step in range(1, 20):
        sched.add(prompt(12))  # a new short prompt each step: it fills most of a step
        chunks, _ = run_step(sched)
        if started is None and any(c.seq is long for c in chunks):
            started = step
        if long.phase == Phase.DECODE:
            finished = step
            break
    assert started == wait + 1  # aged at step wait + 1: first in line
    # and first in line until its last chunk: 40 tokens, at least half of each 16-token step
    assert finished - started + 1 <= 40 // (16 // 2)


def test_aged_prompts_go_first_come_first_served():
    sched = Scheduler(BlockPool(4096, 4), max_batch=64, max_step_tokens=8, max_wait_steps=2)
    old_long, old_short = prompt(20), prompt(6)
    sched.add(old_long)
    sched.add(old_short)
    sched.steps = 3  # both were passed over in two steps: aged
    young = prompt(1)
    sched.add(young)
    assert sched.prompt_order() == [old_long, old_short, young]


def test_decodes_hold_at_most_half_a_step_while_prompts_wait():
    """With more decoding sequences than half a step, a waiting prompt still gets half of
    every step, and the decodes take turns: none waits more than one step for its token."""
    sched = Scheduler(BlockPool(4096, 4), max_batch=64, max_step_tokens=10)
    decoding = [prompt(1) for _ in range(8)]
    for s in decoding:
        sched.add(s)
    run_step(sched)  # 8 one-token prompts: all decode from now on
    assert all(s.phase == Phase.DECODE for s in decoding)
    late = prompt(12)
    sched.add(late)
    last_ran = {s: 1 for s in decoding}
    for step, count in zip(range(2, 5), (5, 5, 2)):
        chunks, _ = run_step(sched)
        decodes = [c.seq for c in chunks if c.seq in last_ran]
        assert len(decodes) == 5 and [(c.seq, c.count) for c in chunks[5:]] == [(late, count)]
        for s in decodes:
            last_ran[s] = step
        assert all(step - ran <= 1 for ran in last_ran.values())
    # the prompt done, every decode runs again in each step
    chunks, _ = run_step(sched)
    assert late.phase == Phase.DECODE and len(chunks) == 9


@pytest.mark.parametrize("name, read, default", [
    ("DASHINFER_MAX_WAIT_STEPS", max_wait_steps, MAX_WAIT_STEPS),
    ("DASHINFER_PROMPT_STEP_TOKENS", prompt_step_tokens, PROMPT_STEP_TOKENS)])
def test_counts_from_the_environment(monkeypatch, name, read, default):
    monkeypatch.setenv(name, "0")
    assert read() == 0
    monkeypatch.setenv(name, "64")
    assert read() == 64
    for bad in ("soon", "-1"):  # refused with the one-line error, never replaced by the default
        monkeypatch.setenv(name, bad)
        with pytest.raises(SettingError, match=f"^{name}='{bad}': expected an integer >= 0$"):
            read()
    monkeypatch.delenv(name)
    assert read() == default
