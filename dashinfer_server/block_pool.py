"""Paged KV-cache bookkeeping: a pool of fixed-size blocks with reference counts, and the
prefix cache (full blocks are found again by a hash chain over their tokens).

Pure policy, no tensors: the KV arrays live in kv_cache.py and are indexed by block id.
A block is in one of three states:
  used        ref_count > 0, owned by one or more sequences
  cached      ref_count == 0 but its tokens are remembered (hash set): reusable as a prefix,
              evicted least-recently-freed first when fresh blocks run out, and forgotten once
              no sequence has used it for prefix_cache_ttl seconds (DashInfer's prefix cache TTL)
  free        ref_count == 0, no hash
"""
import time
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Block:
    id: int
    ref_count: int = 0
    hash: int | None = None
    tokens: tuple = ()


@dataclass
class BlockTable:
    """The blocks of one sequence, in order; `cached_len` tokens came from the prefix cache."""
    blocks: list = field(default_factory=list)
    cached_len: int = 0
    hashed: int = 0  # how many leading blocks are registered in the prefix cache
    # the chain hash of those blocks: kept here, not read from the last block, whose own hash is
    # None when another sequence registered the same tokens first
    chain: int | None = None


def chain_hash(parent: int | None, tokens: tuple) -> int:
    return hash((parent, tokens))


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, prefix_cache: bool = True,
                 prefix_cache_ttl: float | None = None, clock=time.monotonic):
        """prefix_cache_ttl: seconds an unused cached block stays reusable (None: until evicted).
        clock: seconds, monotonic (tests pass a fake one)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"BlockPool needs num_blocks >= 1 and block_size >= 1, "
                             f"got {num_blocks} and {block_size}")
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.prefix_cache_ttl = prefix_cache_ttl
        self.clock = clock
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self.cached = OrderedDict()  # block id -> when it was freed, oldest first: the eviction order
        self.by_hash = {}  # chain hash -> block id, for full blocks with known tokens

    @property
    def num_available(self) -> int:
        return len(self.free_ids) + len(self.cached)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, tokens) -> int:
        """How many leading tokens of `tokens` the cache holds (whole blocks only).
        The last token is never matched: its logits must be computed."""
        return len(self._match(tokens)[0]) * self.block_size

    def allocate(self, tokens, reuse=True) -> BlockTable | None:
        """A block table for a new sequence whose prompt is `tokens`: cached prefix blocks are
        shared (unless reuse is False), fresh blocks cover the rest. None when the pool cannot
        hold it."""
        shared, chain = self._match(tokens) if reuse else ([], None)
        fresh = self.blocks_needed(len(tokens)) - len(shared)
        reclaimable = sum(1 for b in shared if b.ref_count == 0)
        if fresh > self.num_available - reclaimable:
            return None
        for b in shared:
            self._ref(b)
        table = BlockTable([b.id for b in shared], len(shared) * self.block_size, len(shared), chain)
        table.blocks += [self._take().id for _ in range(fresh)]
        return table

    def grow(self, table: BlockTable, num_tokens: int) -> bool:
        """Make `table` hold `num_tokens` tokens; False (nothing taken) when the pool is short."""
        extra = self.blocks_needed(num_tokens) - len(table.blocks)
        if extra > self.num_available:
            return False
        table.blocks += [self._take().id for _ in range(extra)]
        return True

    def register_full_blocks(self, table: BlockTable, tokens, num_computed: int) -> None:
        """Remember the tokens of every block of `table` that the first `num_computed` of
        `tokens` (those whose KV is in the cache) now fill, so later prompts reuse them."""
        if not self.prefix_cache:
            return
        bs = self.block_size
        while (table.hashed + 1) * bs <= num_computed:
            block = self.blocks[table.blocks[table.hashed]]
            chunk = tuple(tokens[table.hashed * bs:(table.hashed + 1) * bs])
            h = chain_hash(table.chain, chunk)
            if block.hash is None and h not in self.by_hash:
                block.hash, block.tokens = h, chunk
                self.by_hash[h] = block.id
            table.chain = h
            table.hashed += 1

    def free(self, table: BlockTable) -> None:
        """Release a sequence's blocks; the deepest blocks become the first to be evicted."""
        now = self.clock()
        for block_id in reversed(table.blocks):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is not None:
                    self.cached[block_id] = now
                else:
                    self.free_ids.append(block_id)
        table.blocks = []

    def clear_cache(self) -> None:
        """Forget every cached prefix (their blocks become plain free blocks)."""
        for block_id in self.cached:
            self._forget(self.blocks[block_id])
            self.free_ids.append(block_id)
        self.cached.clear()

    def expire(self) -> None:
        """Forget the cached blocks no sequence has used for prefix_cache_ttl seconds."""
        if self.prefix_cache_ttl is None:
            return
        deadline = self.clock() - self.prefix_cache_ttl
        while self.cached:
            block_id, freed_at = next(iter(self.cached.items()))
            if freed_at > deadline:
                break
            del self.cached[block_id]
            self._forget(self.blocks[block_id])
            self.free_ids.append(block_id)

    def uncached_block(self, tokens):
        """(index, chain hash) of the first block of `tokens` the cache does not hold that a new
        sequence of them would compute and could register (a whole block before the last token),
        or None."""
        if not self.prefix_cache:
            return None
        found, parent = self._match(tokens)
        start, bs = len(found) * self.block_size, self.block_size
        if start + bs > len(tokens) - 1:
            return None
        return len(found), chain_hash(parent, tuple(tokens[start:start + bs]))

    def block_hash(self, tokens, index) -> int:
        """The chain hash of block `index` of `tokens` (which fill it)."""
        bs, parent = self.block_size, None
        for start in range(0, (index + 1) * bs, bs):
            parent = chain_hash(parent, tuple(tokens[start:start + bs]))
        return parent

    def _match(self, tokens):
        """(the cached blocks that hold the leading tokens, the chain hash of the last of them)."""
        if not self.prefix_cache:
            return [], None
        self.expire()
        bs, found, parent = self.block_size, [], None
        for start in range(0, len(tokens) - 1 - bs + 1, bs):
            chunk = tuple(tokens[start:start + bs])
            h = chain_hash(parent, chunk)
            block_id = self.by_hash.get(h)
            if block_id is None or self.blocks[block_id].tokens != chunk:
                break
            found.append(self.blocks[block_id])
            parent = h
        return found, parent

    def _ref(self, block: Block) -> None:
        if block.ref_count == 0:
            del self.cached[block.id]
        block.ref_count += 1

    def _take(self) -> Block:
        if self.free_ids:
            block = self.blocks[self.free_ids.pop()]
        else:
            block_id, _ = self.cached.popitem(last=False)
            block = self.blocks[block_id]
            self._forget(block)
        block.ref_count = 1
        return block

    def _forget(self, block: Block) -> None:
        if block.hash is not None and self.by_hash.get(block.hash) == block.id:
            del self.by_hash[block.hash]
        block.hash, block.tokens = None, ()
