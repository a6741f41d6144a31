"""Continuous batching policy: which tokens of which sequences run in the next step.

Every step runs one token for each decoding sequence, then fills a token budget with prompt
chunks: first of sequences already admitted, then of waiting ones, admitted first come first
served while max_batch and the KV pool allow. When the pool cannot give a decoding sequence
its next block, the most recently admitted sequence is interrupted and its blocks freed.
Pure policy: no tensors, no threads. Its decisions are logged at DEBUG.
"""
import logging
import time
from collections import deque
from dataclasses import dataclass

from .block_pool import BlockPool
from .sequence import Phase, Sequence

log = logging.getLogger("dashinfer_server")


@dataclass
class Chunk:
    """`count` tokens of `seq` from position `start`; `sample` when the step's logits of the
    last of them give the sequence its next token."""
    seq: Sequence
    start: int
    count: int
    sample: bool


class Scheduler:
    def __init__(self, pool: BlockPool, max_batch: int, max_step_tokens: int):
        self.pool = pool
        self.max_batch = max_batch
        self.max_step_tokens = max_step_tokens
        self.waiting: deque = deque()
        self.running: list = []  # admission order: the last one is interrupted first

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Take `seq` out (finished, stopped or interrupted) and free its blocks."""
        if seq.phase == Phase.WAITING:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            self.pool.free(seq.table)
        seq.phase = Phase.DONE

    def schedule(self) -> tuple[list, list]:
        """The next step's chunks, and the sequences interrupted to make room for it."""
        interrupted = []
        decodes = []
        for seq in list(self.running):
            if seq.phase != Phase.DECODE:
                continue
            while not self.pool.grow(seq.table, len(seq.tokens)):
                victim = self.running[-1]
                log.debug("interrupt request %d (admitted last): request %d needs a KV block and "
                          "none is free", victim.handle, seq.handle)
                self.finish(victim)
                interrupted.append(victim)
                if victim is seq:
                    break
            if seq.phase != Phase.DONE:
                decodes.append(Chunk(seq, len(seq.tokens) - 1, 1, True))
        decodes = [c for c in decodes if c.seq.phase != Phase.DONE]

        budget = self.max_step_tokens - len(decodes)
        prefills = []
        for seq in self.running:
            if seq.phase == Phase.PREFILL and budget > 0:
                prefills.append(self._chunk(seq, budget))
                budget -= prefills[-1].count
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            table = self.pool.allocate(seq.tokens)
            if table is None:
                break  # first come first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            seq.table, seq.num_computed, seq.phase = table, table.cached_len, Phase.PREFILL
            seq.admitted = time.perf_counter()
            self.running.append(seq)
            log.debug("admit request %d: %d prompt tokens (%d cached), %d running, %d waiting, "
                      "%d KV blocks free", seq.handle, len(seq.tokens), table.cached_len,
                      len(self.running), len(self.waiting), self.pool.num_available)
            prefills.append(self._chunk(seq, budget))
            budget -= prefills[-1].count
        return decodes + prefills, interrupted

    @staticmethod
    def _chunk(seq: Sequence, budget: int) -> Chunk:
        count = min(seq.num_uncomputed, budget)
        return Chunk(seq, seq.num_computed, count, seq.num_computed + count == len(seq.tokens))

    def advance(self, chunks: list) -> None:
        """Record that the step computed `chunks`; sampled sequences move to decoding."""
        for c in chunks:
            seq = c.seq
            seq.num_computed = c.start + c.count
            self.pool.register_full_blocks(seq.table, seq.tokens, seq.num_computed)
            if c.sample:
                seq.phase = Phase.DECODE
