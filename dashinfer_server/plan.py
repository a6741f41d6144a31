"""The step plan: what every rank's forward needs to know about one step, as int32 arrays
(rank 0 builds it from the scheduler's chunks and broadcasts it as is).

Attention sees each chunk as one entry: its query rows, the context length after it, and its
sequence's block table; row i of an entry of n rows over context c attends to c - n + i + 1
tokens (the causal mask).
"""
from dataclasses import dataclass, field

import numpy as np

from .prompt_logprobs import scored_positions


@dataclass
class StepPlan:
    token_ids: np.ndarray     # [T] the tokens computed this step, sequence after sequence
    positions: np.ndarray     # [T] their positions
    slots: np.ndarray         # [T] where their K/V go: block_id * block_size + offset
    q_offsets: np.ndarray     # [B+1] chunk b's tokens are rows q_offsets[b]:q_offsets[b+1]
    context_lens: np.ndarray  # [B] tokens of chunk b's sequence in the cache after this step
    block_tables: np.ndarray  # [B, max_blocks] block ids (unused entries 0)
    sample_rows: np.ndarray   # [S] rows whose logits are sampled (last row of a finishing chunk)
    # [R] prompt rows whose logits score the next prompt token (prompt_logprobs.py)
    score_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def arrays(self) -> tuple:
        return (self.token_ids, self.positions, self.slots, self.q_offsets, self.context_lens,
                self.block_tables, self.sample_rows, self.score_rows)


def build_plan(chunks, block_size: int) -> StepPlan:
    """Chunks (scheduler.Chunk) -> StepPlan. Each array is built as one Python list and converted
    once: numpy slice assignments per chunk cost a microsecond apiece, ~0.2 ms of a 32-row decode
    step's serial part."""
    tokens, positions, counts, context_lens, sample_rows, score_rows = [], [], [], [], [], []
    width = 0
    for c in chunks:
        if c.seq.prompt_scores is not None:  # prompt_logprobs: rare, kept off the decode path
            score_rows += (len(tokens) + p - c.start for p in scored_positions(c))
        tokens += c.seq.tokens[c.start:c.start + c.count]
        positions += range(c.start, c.start + c.count)
        counts.append(c.count)
        context_lens.append(c.start + c.count)
        if c.sample:
            sample_rows.append(len(tokens) - 1)
        width = max(width, len(c.seq.table.blocks))
    block_tables = np.array([c.seq.table.blocks + [0] * (width - len(c.seq.table.blocks)) for c in chunks],
                            np.int32).reshape(len(chunks), width)
    q_offsets = np.zeros(len(chunks) + 1, np.int32)
    np.cumsum(counts, out=q_offsets[1:])
    positions = np.array(positions, np.int32)
    rows = np.repeat(np.arange(len(chunks)), counts)  # each token's chunk
    slots = block_tables[rows, positions // block_size] * block_size + positions % block_size
    return StepPlan(np.array(tokens, np.int32), positions, slots.astype(np.int32), q_offsets,
                    np.array(context_lens, np.int32), block_tables, np.array(sample_rows, np.int32),
                    np.array(score_rows, np.int32))
