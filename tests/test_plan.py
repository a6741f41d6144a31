"""build_plan: a step of chunks -> the int32 arrays every rank's forward reads."""
import numpy as np

from dashinfer_server.block_pool import BlockTable
from dashinfer_server.plan import build_plan
from dashinfer_server.scheduler import Chunk
from dashinfer_server.sequence import Sequence

BLOCK = 4


def chunk(tokens, blocks, start, count, sample):
    return Chunk(Sequence(list(tokens), 100, table=BlockTable(list(blocks))), start, count, sample)


def test_a_decode_beside_a_prompt_chunk_after_a_cached_prefix():
    decoding = chunk(range(10, 17), [5, 2], 6, 1, True)          # 7 tokens, computes the 7th
    prompt = chunk(range(20, 31), [7, 3, 9], 5, 4, False)        # 11 tokens, computes 5..8
    plan = build_plan([decoding, prompt], BLOCK)
    assert plan.token_ids.tolist() == [16, 25, 26, 27, 28]
    assert plan.positions.tolist() == [6, 5, 6, 7, 8]
    # position p of a sequence lives in its block p // 4, at offset p % 4
    assert plan.slots.tolist() == [2 * 4 + 2, 3 * 4 + 1, 3 * 4 + 2, 3 * 4 + 3, 9 * 4 + 0]
    assert plan.q_offsets.tolist() == [0, 1, 5]
    assert plan.context_lens.tolist() == [7, 9]
    assert plan.block_tables.tolist() == [[5, 2, 0], [7, 3, 9]]
    assert plan.sample_rows.tolist() == [0]
    assert all(a.dtype == np.int32 for a in plan.arrays())


def test_the_last_chunk_of_a_prompt_is_sampled_at_its_last_row():
    plan = build_plan([chunk(range(3, 9), [1, 4], 0, 6, True), chunk(range(5), [6, 8], 4, 1, True)], BLOCK)
    assert plan.q_offsets.tolist() == [0, 6, 7]
    assert plan.sample_rows.tolist() == [5, 6]
    assert plan.context_lens.tolist() == [6, 5]
