"""One request inside the engine, in one object: its tokens (held here only), its KV blocks, how
far it has run, its sampler state and where its results go."""
import enum
import itertools
import time
from dataclasses import dataclass, field

from dashinfer_client.types import ResultQueue

from .block_pool import BlockTable
from .prompt_logprobs import PromptScores
from .sampler import RequestSamplingState


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
    prompt_cached: int | None = None  # prompt tokens the prefix cache held at its first admission
    arrival: float = field(default_factory=time.perf_counter)
    admitted: float = 0.0           # when the scheduler gave it KV blocks (perf_counter)
    queue: object = None            # the ResultQueue its tokens go to
    sampling: object = None         # its RequestSamplingState (options, penalty sets, RNG)
    prompt_scores: object = None    # its PromptScores until they are delivered (prompt_logprobs)

    def __post_init__(self):
        if self.prompt_len < 0:
            self.prompt_len = len(self.tokens)

    @classmethod
    def start(cls, prompt: list, params: dict, guide=None) -> "Sequence":
        """A new request: `prompt` (token ids) generating by `params`, its checked options
        (request.new_request checks them against the model), under `guide` (its grammar) if any."""
        seq = cls(list(prompt), params["max_length"])
        seq.sampling = RequestSamplingState(params, seq.tokens, guide)
        seq.queue = ResultQueue(str(seq.handle))
        seq.queue.update_stats(context_token_length=len(prompt), uuid=params["uuid"])
        if params["prompt_logprobs"] is not None:
            seq.prompt_scores = PromptScores(len(prompt), params["prompt_logprobs"])
        return seq

    def append(self, token: int) -> None:
        """Add a generated token (and tell the sampler state, which reads the same list)."""
        self.tokens.append(token)
        if self.sampling is not None:
            self.sampling.observe(token)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to run through the model: the rest of the prompt, or the newest token."""
        return len(self.tokens) - self.num_computed
