"""Continuous batching policy: which tokens of which sequences run in the next step.

A step holds at most max_step_tokens tokens: one for each decoding sequence, then prompt chunks.
Prompts go shortest first (fewest tokens left to compute), so a short prompt is not held behind
a long one, with bounded unfairness: a prompt passed over in max_wait_steps steps is aged, and
aged prompts go before all others, first come first served (max_wait_steps 0: all of them).
A prompt starts in a step only if it finishes there, unless prompts fill less than half of the
room the decodes leave (long prompts are cut into chunks then): its first token comes at the end
of the step its last chunk ran in, not a step later. Decodes never crowd prompts out: when more
sequences decode than half a step holds and prompts are pending, the decodes that ran least
recently take the other half.

Prompts first (prompt_step_tokens > 0): while prompts wait, steps run prompts only, whole ones
shortest first until the step reaches prompt_step_tokens, so each step ends at a first token
(a big step gives all of its prompts the time of the last one). Every such step reads the
weights once like any other, so above a few dozen rows it costs what its tokens cost. Decodes
wait for them at most a whole step's tokens (max_step_tokens since their last token), then
run in a step beside prompt_step_tokens of prompts. Aging then counts tokens: a prompt is aged
once max_wait_steps whole steps of tokens (max_step_tokens each) ran since it came.

Waiting sequences are admitted (given KV blocks) in that order while max_batch and the KV pool
allow; nobody overtakes a waiting sequence the pool cannot hold yet. A prompt whose next block
the prefix cache lacks while an admitted prompt is computing that very block (the n choices of one
OpenAI request, prompts with one system prompt sent together) waits until it is computed and
registered, then shares it instead of computing it again; others may go before it meanwhile.
When the pool cannot give a decoding sequence its next block, the most recently admitted sequence
is preempted: its blocks are freed (the full ones stay in the prefix cache), it waits again ahead
of every new prompt, and once admitted again it recomputes what the prefix cache did not keep and
goes on where it stopped, so its client never sees it: its prompt as prompt chunks, then the
tokens it had generated one a step beside the decodes, as they were first computed (the prefill
and decode kernels round differently, so this is what gives it the same K/V and the same greedy
tokens, as far as the decode batches it meets take the same kernels: bf16 weights round the
activations to bf16 from 5 rows, below that they stay fp32). No sequence is admitted in a step that preempted one. A sequence interrupted here is one
that cannot grow with nothing else admitted: the whole pool is too small for it (DashInfer's
GenerateInterrupted, "no resource to finish this request's generation"). Pure policy: no tensors,
no threads. Its decisions are logged at DEBUG.
"""
import logging
import time
from dataclasses import dataclass

from dashinfer_client import settings

from .block_pool import BlockPool
from .sequence import Phase, Sequence

log = logging.getLogger("dashinfer_server")

MAX_WAIT_STEPS = settings.REGISTRY["DASHINFER_MAX_WAIT_STEPS"].default  # steps in which shorter prompts may overtake a prompt before it goes first
PROMPT_STEP_TOKENS = settings.REGISTRY["DASHINFER_PROMPT_STEP_TOKENS"].default  # a prompt-only step ends with the prompt that brings it to this many tokens


def max_wait_steps() -> int:
    """DASHINFER_MAX_WAIT_STEPS, or MAX_WAIT_STEPS; 0 is first come first served."""
    return settings.get("DASHINFER_MAX_WAIT_STEPS")


def prompt_step_tokens() -> int:
    """DASHINFER_PROMPT_STEP_TOKENS, or PROMPT_STEP_TOKENS; 0 runs decodes in every step."""
    return settings.get("DASHINFER_PROMPT_STEP_TOKENS")


@dataclass
class Chunk:
    """`count` tokens of `seq` from position `start`; `sample` when the step's logits of the
    last of them give the sequence its next token."""
    seq: Sequence
    start: int
    count: int
    sample: bool


class Scheduler:
    def __init__(self, pool: BlockPool, max_batch: int, max_step_tokens: int,
                 max_wait_steps: int = MAX_WAIT_STEPS, prompt_step_tokens: int = 0):
        self.pool = pool
        self.max_batch = max_batch
        self.max_step_tokens = max_step_tokens
        # prompt-only steps are this long; 0 (or a whole step or more): decodes run every step
        self.prompt_step_tokens = prompt_step_tokens if 0 < prompt_step_tokens < max_step_tokens else 0
        self.max_wait_steps = max_wait_steps
        self.waiting: list = []  # arrival order
        self.running: list = []  # admission order: the last one is preempted first
        self.preemptions = 0     # sequences preempted so far
        self.steps = 0           # steps scheduled so far: the clock of aging
        self.work = 0            # tokens scheduled so far: the clock of decode gaps (and of aging
        #                          with prompt-only steps: max_wait_steps whole steps of tokens)
        self._came = {}          # sequence -> (step, work) it came in (until its first token)
        self._decoded = {}       # decoding sequence -> self.work after the last step that ran it
        self._preempted = set()  # preempted sequences until their next token

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self._came[seq] = (self.steps, self.work)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Take `seq` out (finished, stopped or interrupted) and free its blocks."""
        if seq.phase == Phase.WAITING:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            self.pool.free(seq.table)
        self._came.pop(seq, None)
        self._decoded.pop(seq, None)
        self._preempted.discard(seq)
        seq.phase = Phase.DONE

    def schedule(self) -> tuple[list, list]:
        """The next step's chunks, and the sequences interrupted because the pool can never hold them."""
        self.steps += 1
        preempted = self.preemptions
        decodes, interrupted = self._grow_decodes()
        prompts = self.prompt_order()
        if self.preemptions != preempted:  # the pool is short: finish admitted prompts only
            prompts = [s for s in prompts if s.phase != Phase.WAITING]
        target = self.prompt_step_tokens or self.max_step_tokens
        chunks = []
        room = self._gap_room(decodes) if prompts and self.prompt_step_tokens else 0
        if room >= target:
            chunks = self._fill(prompts, room, target)  # prompts only
        if not chunks:  # no prompt waits, decodes are due, or no prompt could start
            if prompts:
                decodes = self._take_turns(decodes)
            chunks = decodes + self._fill(prompts, min(target, self.max_step_tokens - len(decodes)), target)
        self.work += sum(c.count for c in chunks)
        for c in chunks:
            if c.seq.phase == Phase.DECODE:
                self._decoded[c.seq] = self.work
        return chunks, interrupted

    def _gap_room(self, decodes: list) -> int:
        """Tokens a prompt-only step may hold before some decode waits more than a whole step's
        tokens for its next token."""
        return self.max_step_tokens - max((self.work - self._decoded[c.seq] for c in decodes), default=0)

    def _take_turns(self, decodes: list) -> list:
        """At most half a step of decodes while prompts wait: those that ran least recently."""
        half = self.max_step_tokens - self.max_step_tokens // 2
        if len(decodes) > half:
            decodes = sorted(decodes, key=lambda c: self._decoded.get(c.seq, 0))[:half]
        return decodes

    def prompt_order(self) -> list:
        """Sequences with prompt tokens left (admitted or waiting), in the order they get the
        step's budget: aged first by arrival, then fewest tokens left first."""
        def key(seq):
            came, came_work = self._came[seq]
            if self.prompt_step_tokens:  # passed over in max_wait_steps whole steps of tokens
                aged = self.work - came_work >= self.max_wait_steps * self.max_step_tokens
            else:  # passed over in max_wait_steps steps
                aged = self.steps - came > self.max_wait_steps
            if seq in self._preempted:  # it goes on first, in arrival order
                return (-1, seq.arrival, 0)
            if aged:
                return (0, came, 0)
            return (1, seq.num_uncomputed, came)
        pending = [s for s in self.running if s.phase == Phase.PREFILL] + self.waiting
        return sorted(pending, key=key)

    def _grow_decodes(self) -> tuple[list, list]:
        """A block for the next token of every decoding sequence, preempting the latest admitted
        while the pool is short; a sequence alone in the pool that cannot grow is interrupted."""
        interrupted, decodes = [], []
        for seq in list(self.running):
            if seq.phase != Phase.DECODE:
                continue
            while not self.pool.grow(seq.table, len(seq.tokens)):
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    log.debug("interrupt request %d: %d tokens do not fit the whole KV pool",
                              seq.handle, len(seq.tokens))
                    self.finish(seq)
                    interrupted.append(seq)
                    break
                self._preempt(victim, seq)
                if victim is seq:
                    break
            if seq.phase == Phase.DECODE:  # behind its newest token only while it recomputes
                decodes.append(Chunk(seq, seq.num_computed, 1, seq.num_computed == len(seq.tokens) - 1))
        return [c for c in decodes if c.seq.phase == Phase.DECODE], interrupted

    def _preempt(self, seq: Sequence, needy: Sequence) -> None:
        """Free `seq`'s blocks (full ones stay cached) and make it wait to recompute its tokens."""
        log.debug("preempt request %d (admitted last, %d tokens): request %d needs a KV block and "
                  "none is free", seq.handle, len(seq.tokens), needy.handle)
        self.running.remove(seq)
        self.pool.free(seq.table)
        seq.num_computed, seq.phase = 0, Phase.WAITING
        self._decoded.pop(seq, None)
        self._came.setdefault(seq, (self.steps, self.work))
        self._preempted.add(seq)
        self.waiting.append(seq)
        self.preemptions += 1

    def _fill(self, prompts: list, room: int, target: int) -> list:
        """Prompt chunks for `room` tokens, whole prompts until they reach `target` tokens."""
        chunks, used, admitting = [], 0, True
        for seq in prompts:
            budget = room - used
            if budget <= 0 or used >= target:
                break
            if seq.prompt_len - seq.num_computed > budget and used >= room // 2:
                break  # would not finish here: it starts a step that has room for more of it
            if seq.phase == Phase.WAITING:
                if self._prefix_in_flight(seq):
                    continue
                admitting = admitting and self._admit(seq)
                if not admitting:
                    continue  # nobody overtakes it; admitted prompts still go on
            if seq.phase == Phase.DECODE:
                continue  # preempted, its prompt all cached: it recomputes beside the decodes
            chunks.append(self._chunk(seq, budget))
            used += chunks[-1].count
        return chunks

    def _prefix_in_flight(self, seq: Sequence) -> bool:
        """Whether an admitted prompt is computing the first block of seq's prompt that the prefix
        cache lacks (it registers the block once computed)."""
        pending = self.pool.uncached_block(seq.tokens) if seq.prompt_scores is None else None
        if pending is None:
            return False
        index, block_hash = pending
        end = (index + 1) * self.pool.block_size
        return any(other.phase == Phase.PREFILL and other.num_computed < end <= other.prompt_len
                   and self.pool.block_hash(other.tokens, index) == block_hash for other in self.running)

    def _admit(self, seq: Sequence) -> bool:
        if len(self.running) >= self.max_batch:
            return False
        # a prompt scored for prompt_logprobs needs the logits of every position: no cached prefix
        table = self.pool.allocate(seq.tokens, reuse=seq.prompt_scores is None)
        if table is None:
            return False
        self.waiting.remove(seq)
        seq.table, seq.num_computed, seq.phase = table, table.cached_len, Phase.PREFILL
        if seq.prompt_cached is None:  # a preempted one finds its own blocks again: not its prompt's hit
            seq.prompt_cached = table.cached_len
        if seq.num_computed >= seq.prompt_len:  # preempted, and the cache kept its whole prompt
            seq.phase = Phase.DECODE
            self._decoded[seq] = self.work
            self._came.pop(seq, None)
            self._preempted.discard(seq)
        seq.admitted = time.perf_counter()
        self.running.append(seq)
        log.debug("admit request %d: %d prompt tokens (%d cached), %d running, %d waiting, "
                  "%d KV blocks free", seq.handle, len(seq.tokens), table.cached_len,
                  len(self.running), len(self.waiting), self.pool.num_available)
        return True

    @staticmethod
    def _chunk(seq: Sequence, budget: int) -> Chunk:
        count = min(seq.prompt_len - seq.num_computed, budget)  # a preempted one's prompt only
        return Chunk(seq, seq.num_computed, count, seq.num_computed + count == len(seq.tokens))

    def advance(self, chunks: list) -> None:
        """Record that the step computed `chunks`; sequences whose prompt is computed move to decoding."""
        for c in chunks:
            seq = c.seq
            seq.num_computed = c.start + c.count
            self.pool.register_full_blocks(seq.table, seq.tokens, seq.num_computed)
            if seq.phase == Phase.PREFILL and seq.num_computed >= seq.prompt_len:
                seq.phase = Phase.DECODE
                self._decoded[seq] = self.work
                self._came.pop(seq, None)
                self._preempted.discard(seq)
