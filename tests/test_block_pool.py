import pytest

from dashinfer_server.block_pool import BlockPool


def test_fresh_allocation_and_free_return_every_block():
    pool = BlockPool(8, 4)
    table = pool.allocate(list(range(10)))  # 3 blocks
    assert len(table.blocks) == 3 and len(set(table.blocks)) == 3 and table.cached_len == 0
    assert pool.num_available == 5
    assert pool.grow(table, 13) and len(table.blocks) == 4
    pool.free(table)
    assert pool.num_available == 8 and table.blocks == []


def test_allocation_refused_when_short_and_takes_nothing():
    pool = BlockPool(4, 4)
    a = pool.allocate(list(range(12)))
    assert pool.allocate(list(range(100, 108))) is None
    assert pool.num_available == 1
    assert not pool.grow(a, 24) and len(a.blocks) == 3


def test_prefix_is_shared_after_registration():
    pool = BlockPool(16, 4)
    prompt = list(range(11))
    a = pool.allocate(prompt)
    assert pool.match_prefix(prompt) == 0  # nothing registered until the KV is computed
    pool.register_full_blocks(a, prompt, len(prompt))
    b = pool.allocate(prompt[:10] + [99, 98])
    assert b.cached_len == 8 and b.blocks[:2] == a.blocks[:2] and b.blocks[2] != a.blocks[2]
    assert pool.blocks[a.blocks[0]].ref_count == 2


def test_last_token_is_never_matched():
    pool = BlockPool(16, 4)
    prompt = list(range(8))
    a = pool.allocate(prompt)
    pool.register_full_blocks(a, prompt, len(prompt))
    assert pool.match_prefix(prompt) == 4  # 8 tokens: the block holding token 7 is recomputed
    assert pool.match_prefix(prompt + [8]) == 8


def test_different_history_does_not_match():
    pool = BlockPool(16, 4)
    a = pool.allocate(list(range(9)))
    pool.register_full_blocks(a, list(range(9)), 9)
    # same second block, different first block: the chain hash differs
    assert pool.match_prefix([7, 7, 7, 7, 4, 5, 6, 7, 8]) == 0


def test_blocks_after_a_duplicate_keep_their_history():
    """Two sequences that compute the same blocks side by side (identical greedy requests): the
    second's copy of a block is not registered, and its next block must still be found only
    behind the same history, never as the first block of a prompt that starts with its tokens."""
    pool = BlockPool(16, 4)
    tokens = list(range(100, 112))
    a, b = pool.allocate(tokens[:5]), pool.allocate(tokens[:5])
    for table in (a, b):
        assert pool.grow(table, 12)
    for computed in (4, 8, 12):
        pool.register_full_blocks(a, tokens, computed)
        pool.register_full_blocks(b, tokens, computed)
    assert pool.match_prefix(tokens[4:12] + [1, 2]) == 0
    assert pool.match_prefix(tokens + [1]) == 12


def test_freed_prefix_stays_cached_until_evicted_deepest_first():
    pool = BlockPool(4, 4)
    prompt = list(range(13))
    a = pool.allocate(prompt)  # 4 blocks
    pool.register_full_blocks(a, prompt, len(prompt))
    first, second, third = a.blocks[:3]
    pool.free(a)
    assert pool.num_available == 4 and pool.match_prefix(prompt) == 12
    b = pool.allocate([50, 51, 52, 53, 54])  # 2 fresh blocks: the unhashed one, then the deepest
    assert third in b.blocks and first not in b.blocks
    assert pool.match_prefix(prompt) == 8
    assert pool.allocate(prompt[:9]) is None  # 2 cached blocks + 1 fresh, none left
    pool.free(b)
    c = pool.allocate(prompt[:9])
    assert c.cached_len == 8 and c.blocks[:2] == [first, second]


def test_prefix_cache_off_never_shares():
    pool = BlockPool(8, 4, prefix_cache=False)
    a = pool.allocate(list(range(9)))
    pool.register_full_blocks(a, list(range(9)), 9)
    assert pool.allocate(list(range(9))).cached_len == 0


def test_clear_cache_forgets_prefixes():
    pool = BlockPool(8, 4)
    a = pool.allocate(list(range(9)))
    pool.register_full_blocks(a, list(range(9)), 9)
    pool.free(a)
    pool.clear_cache()
    assert pool.match_prefix(list(range(9))) == 0 and pool.num_available == 8


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        BlockPool(0, 16)
