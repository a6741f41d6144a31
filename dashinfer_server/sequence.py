"""One request's state inside the engine: its tokens, its KV blocks, how far it has run,
and where its results go."""
import enum
import itertools
import time
from dataclasses import dataclass, field

from .block_pool import BlockTable


class Phase(enum.Enum):
    WAITING = 0   # not admitted: no KV blocks yet
    PREFILL = 1   # admitted, prompt partly computed
    DECODE = 2    # prompt computed, one token per step
    DONE = 3      # finished, stopped or interrupted: blocks freed


_handles = itertools.count(1)


@dataclass(eq=False)
class Sequence:
    tokens: list                    # prompt, then every generated token
    max_length: int                 # prompt + generated, the hard stop
    handle: int = field(default_factory=lambda: next(_handles))
    prompt_len: int = -1
    phase: Phase = Phase.WAITING
    table: BlockTable | None = None
    num_computed: int = 0           # tokens whose K/V are in the cache
    arrival: float = field(default_factory=time.perf_counter)
    admitted: float = 0.0           # when the scheduler gave it KV blocks (perf_counter)
    queue: object = None            # the ResultQueue its tokens go to
    sampling: object = None         # its sampler state (params, history, RNG)

    def __post_init__(self):
        if self.prompt_len < 0:
            self.prompt_len = len(self.tokens)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to run through the model: the rest of the prompt, or the newest token."""
        return len(self.tokens) - self.num_computed
