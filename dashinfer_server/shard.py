"""Tensor parallelism's shard math: which slice of each weight and of the KV heads a rank owns.

Attention is split by whole KV-head groups (a rank owns some KV heads and their query heads;
uneven splits are fine), the MLP by the intermediate dimension, lm_head by vocabulary. When the
heads split unevenly (SmolLM2: 9 heads / 3 KV heads over 2 ranks = 6+3), the intermediate
dimension is cut so that every rank holds about as many layer weights as the others: a step's
time on a rank follows them (the bytes it reads in a decode, the flops of a prompt), and every
rank waits for the slowest at each allreduce.
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


def balanced_cuts(attention: list[int], intermediate: int, align: int) -> list[int]:
    """Borders [world+1] of the intermediate dimension such that rank r's attention[r] plus its
    3 MLP weights (gate, up, down) per intermediate unit come out near-equal over the ranks;
    borders are multiples of `align` and every rank keeps at least one `align` unit."""
    world = len(attention)
    target = (sum(attention) + 3 * intermediate) / world
    want = [max(target - a, 0.0) / 3 for a in attention]
    scale = intermediate / sum(want) if sum(want) else 0.0
    cuts, done = [0], 0.0
    for r in range(1, world):
        done += want[r - 1] * scale if scale else intermediate / world
        cut = round(done / align) * align
        cuts.append(min(max(cut, cuts[-1] + align), intermediate - (world - r) * align))
    return cuts + [intermediate]


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
    head_dim: int = 0  # 0: the MLP splits evenly, whatever the heads do

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
        if not self.head_dim:
            return split_range(self.intermediate_size, self.rank, self.world, align)
        cuts = balanced_cuts(self._attention_weights(), self.intermediate_size, align)
        return cuts[self.rank], cuts[self.rank + 1]

    def _attention_weights(self) -> list[int]:
        """Per rank, its attention weights per hidden unit: q and o rows of its heads, k and v
        rows of its KV heads."""
        group = self.num_heads // self.num_kv_heads
        kv = [split_range(self.num_kv_heads, r, self.world) for r in range(self.world)]
        return [2 * (group + 1) * (b - a) * self.head_dim for a, b in kv]

    @property
    def vocab(self) -> tuple[int, int]:
        return split_range(self.vocab_size, self.rank, self.world)
