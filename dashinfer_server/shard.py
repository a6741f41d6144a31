"""Tensor parallelism's shard math: which slice of each weight and of the KV heads a rank owns.

Attention is split by query heads, as evenly as they go, and a rank holds the KV heads its query
heads read: where a GQA group straddles two ranks, both compute and cache that KV head (SmolLM2's
9 heads / 3 KV heads on 2 ranks: heads 0-4 over KV heads 0-1, heads 5-8 over KV heads 1-2, not
whole groups 6+3, which left rank 1 idle for a quarter of a prefill step at every attention
allreduce). With fewer KV heads than ranks the same rule puts a KV head on every rank whose query
heads read it (Gemma 3 1B's one KV head on 2 ranks: each computes and caches it for its 2 of 4
query heads), as vLLM replicates KV heads. The MLP is split by the intermediate dimension, lm_head by vocabulary. A sparse layer's experts
are split one of two ways (EXPERT_SPLITS): each expert by its intermediate rows, as the dense MLP,
or whole experts dealt out to the ranks (rank r of R holds experts r, r + R, ...); a shared expert
is split by its intermediate rows either way.
Row-parallel outputs (o_proj, down_proj) are then partial sums that the group's allreduce
completes (parallel.py).
"""
from dataclasses import dataclass

# how a sparse layer's experts are spread over the ranks (DASHINFER_MOE_SPLIT): "intermediate",
# every expert's rows split as the dense MLP's; "experts", whole experts per rank
EXPERT_SPLITS = ("intermediate", "experts")


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
    num_experts: int = 0
    expert_split: str = "intermediate"

    def __post_init__(self):
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a group of {self.world}")
        if self.world > self.num_heads:
            raise ValueError(f"{self.world} tensor-parallel ranks need a query head each; "
                             f"the model has {self.num_heads}")
        if self.expert_split not in EXPERT_SPLITS:
            raise ValueError(f"expert split {self.expert_split!r} is not one of {', '.join(EXPERT_SPLITS)}")
        if self.expert_split == "experts" and self.world > self.num_experts > 0:
            raise ValueError(f"{self.world} ranks holding whole experts need at least as many experts; "
                             f"the model has {self.num_experts}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} query heads do not form groups over "
                             f"{self.num_kv_heads} KV heads")

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def heads(self) -> tuple[int, int]:
        return split_range(self.num_heads, self.rank, self.world)

    @property
    def kv_heads(self) -> tuple[int, int]:
        """The KV heads the rank's query heads read."""
        a, b = self.heads
        return a // self.group, (b - 1) // self.group + 1

    @property
    def q_head0(self) -> int:
        """Where the rank's first query head sits in its first KV head's group."""
        return self.heads[0] - self.kv_heads[0] * self.group

    @property
    def intermediate(self) -> tuple[int, int]:
        return self.rows_of(self.intermediate_size)

    def rows_of(self, size: int) -> tuple[int, int]:
        """The rank's [start, stop) of a gated MLP of `size` intermediate rows."""
        align = self.intermediate_align
        if size % align or size < align * self.world:  # a small MLP: every rank gets rows
            align = 1
        return split_range(size, self.rank, self.world, align)

    @property
    def experts(self) -> range:
        """The experts whose work this rank holds a part of (native/moe.h: expert0, expert_step)."""
        if self.expert_split == "experts":
            return range(self.rank, self.num_experts, self.world)
        return range(self.num_experts)

    def expert_rows(self, size: int) -> tuple[int, int]:
        """The rank's rows of one expert of `size` intermediate rows."""
        return (0, size) if self.expert_split == "experts" else self.rows_of(size)

    @property
    def vocab(self) -> tuple[int, int]:
        return split_range(self.vocab_size, self.rank, self.world)
