"""Tensor parallelism's shard math: which slice of each weight and of the KV heads a rank owns.

Attention is split by whole KV-head groups (a rank owns some KV heads and their query heads;
uneven splits are fine), the MLP by the intermediate dimension, lm_head by vocabulary.
Row-parallel outputs (o_proj, down_proj) are then partial sums that the group's allreduce
completes (parallel.py).
"""
from dataclasses import dataclass


def split_range(n: int, rank: int, world: int, align: int = 1) -> tuple[int, int]:
    """Rank's [start, stop) of n items cut into `world` near-equal parts whose borders are
    multiples of `align` (earlier ranks take the remainder)."""
    if n % align:
        raise ValueError(f"cannot split {n} into parts aligned to {align}")
    units, extra = divmod(n // align, world)
    start = (rank * units + min(rank, extra)) * align
    stop = start + (units + (rank < extra)) * align
    return start, stop


@dataclass(frozen=True)
class Shard:
    """What rank `rank` of `world` owns of a model with these dimensions."""
    rank: int
    world: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    intermediate_align: int = 64

    def __post_init__(self):
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a group of {self.world}")
        if self.world > self.num_kv_heads:
            raise ValueError(f"{self.world} tensor-parallel ranks need at least as many KV heads; "
                             f"the model has {self.num_kv_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} query heads do not form groups over "
                             f"{self.num_kv_heads} KV heads")

    @property
    def kv_heads(self) -> tuple[int, int]:
        return split_range(self.num_kv_heads, self.rank, self.world)

    @property
    def heads(self) -> tuple[int, int]:
        group = self.num_heads // self.num_kv_heads
        a, b = self.kv_heads
        return a * group, b * group

    @property
    def intermediate(self) -> tuple[int, int]:
        align = self.intermediate_align
        if self.intermediate_size % align:
            align = 1
        return split_range(self.intermediate_size, self.rank, self.world, align)

    @property
    def vocab(self) -> tuple[int, int]:
        return split_range(self.vocab_size, self.rank, self.world)
