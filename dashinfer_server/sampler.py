"""Sampling: the per-request parameters, the per-request history the penalties need, and the
Sampler that turns a batch of logits into one token per request.

Semantics follow DashInfer (allspark GenerateConfig and its CPU/CUDA generate kernels); where it
is silent, Hugging Face transformers. Per option:
  do_sample            False: greedy argmax (of the penalized logits: penalties apply to greedy too).
  temperature          divides the logits before top-k / top-p; > 0 when sampling; unused by greedy.
  top_k                keep the k most probable tokens; 0 (or >= vocab) = off.
  top_p                keep the shortest most-probable prefix whose probability exceeds top_p,
                       computed after top-k; 1.0 = off.
  repetition_penalty   HF formula (logit / p if > 0 else logit * p), once per distinct token of
                       prompt + generated tokens; 1.0 = off.
  suppress_repetition_in_generation
                       the repetition penalty looks at generated tokens only, not the prompt.
  presence_penalty     subtracted once from every token generated so far (never the prompt's);
                       0 = off.
  length_penalty       DashInfer uses it in beam search only, which it does not run: any value
                       other than 1.0 is refused by validate().
  no_repeat_ngram_size a token that would repeat an n-gram of prompt + generated tokens gets -inf.
  min_length           eos ids get -inf while prompt + generated length < min_length.
  eos_token_id, stop_words_ids, max_length, early_stopping: see stopping.py.
  seed                 each request owns a numpy Generator seeded with it and draws exactly one
                       uniform number per sampled token: the same seed gives the same tokens in any
                       batch. None: seeded from the OS.
  logprobs, top_logprobs
                       log_softmax of the logits after penalties, before temperature and top-k /
                       top-p (what DashInfer's logprobs kernel reads); top_logprobs <= 10 pairs.
"""
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from .logits_processors import apply_penalties, logprobs, pick, sampling_weights

MAX_TOP_LOGPROBS = 10


@dataclass(frozen=True)
class SamplingParams:
    """DashInfer's generation keys that drive sampling and stopping; defaults are DashInfer's,
    except eos_token_id (none) and seed (None: random)."""
    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    length_penalty: float = 1.0
    suppress_repetition_in_generation: bool = False
    no_repeat_ngram_size: int = 0
    min_length: int = 0
    max_length: int = 20
    early_stopping: bool = True
    eos_token_id: tuple = ()
    stop_words_ids: tuple = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            object.__setattr__(self, f.name, _NORMALIZE[f.name](f.name, value))

    @classmethod
    def from_config(cls, config):
        """Read the same-named keys of a dict, or attributes of any object (a built generation
        config, a transformers GenerationConfig); missing or None keys take the defaults."""
        if isinstance(config, Mapping):
            get = config.get
        else:
            def get(name, default):
                return getattr(config, name, default)
        found = {f.name: get(f.name, None) for f in fields(cls)}
        return cls(**{k: v for k, v in found.items() if v is not None})


def _bool(name, v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    raise ValueError(f"{name} must be a bool, got {v!r}")


def _int(name, v):
    if isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
        return int(v)
    raise ValueError(f"{name} must be an integer, got {v!r}")


def _float(name, v):
    if isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)):
        return float(v)
    raise ValueError(f"{name} must be a number, got {v!r}")


def _seed(name, v):
    return None if v is None else _int(name, v)


def _ids(name, v):
    if isinstance(v, numbers.Integral):
        v = [v]
    try:
        return tuple(_int(name, i) for i in v)
    except TypeError:
        raise ValueError(f"{name} must be a token id or a list of token ids, got {v!r}") from None


def _id_lists(name, v):
    try:
        words = [list(w) for w in v]
    except TypeError:
        raise ValueError(f"{name} must be a list of lists of token ids, got {v!r}") from None
    return tuple(_ids(name, w) for w in words)


_NORMALIZE = {
    "do_sample": _bool, "temperature": _float, "top_k": _int, "top_p": _float,
    "repetition_penalty": _float, "presence_penalty": _float, "length_penalty": _float,
    "suppress_repetition_in_generation": _bool, "no_repeat_ngram_size": _int,
    "min_length": _int, "max_length": _int, "early_stopping": _bool, "eos_token_id": _ids,
    "stop_words_ids": _id_lists, "seed": _seed, "logprobs": _bool, "top_logprobs": _int,
}


def validate(params, vocab_size, prompt_len=None):
    """Raise ValueError naming the first option out of range for this model (and prompt)."""
    p = params
    finite = np.isfinite
    checks = [
        (p.do_sample and not (finite(p.temperature) and p.temperature > 0),
         f"temperature must be a positive number when do_sample is on, got {p.temperature}"),
        (p.top_k < 0, f"top_k must be >= 0 (0 = off), got {p.top_k}"),
        (not 0.0 < p.top_p <= 1.0, f"top_p must be in (0, 1] (1.0 = off), got {p.top_p}"),
        (not (finite(p.repetition_penalty) and p.repetition_penalty > 0),
         f"repetition_penalty must be a positive number (1.0 = off), got {p.repetition_penalty}"),
        (not finite(p.presence_penalty),
         f"presence_penalty must be a finite number, got {p.presence_penalty}"),
        (p.length_penalty != 1.0,
         f"length_penalty={p.length_penalty} is not supported: DashInfer applies it in beam "
         "search only, and generation here samples one sequence; use 1.0"),
        (p.no_repeat_ngram_size < 0,
         f"no_repeat_ngram_size must be >= 0 (0 = off), got {p.no_repeat_ngram_size}"),
        (p.max_length < 1, f"max_length must be >= 1, got {p.max_length}"),
        (not 0 <= p.min_length <= p.max_length,
         f"min_length must be in 0..max_length ({p.max_length}), got {p.min_length}"),
        (any(not 0 <= i < vocab_size for i in p.eos_token_id),
         f"eos_token_id {list(p.eos_token_id)} has an id outside the vocabulary 0..{vocab_size - 1}"),
        (any(len(w) == 0 for w in p.stop_words_ids), "stop_words_ids has an empty stop word"),
        (any(not 0 <= i < vocab_size for w in p.stop_words_ids for i in w),
         f"stop_words_ids has an id outside the vocabulary 0..{vocab_size - 1}"),
        (p.seed is not None and not 0 <= p.seed < 2**64,
         f"seed must be in 0..2**64-1, got {p.seed}"),
        (not 0 <= p.top_logprobs <= MAX_TOP_LOGPROBS,
         f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {p.top_logprobs}"),
        (p.top_logprobs > 0 and not p.logprobs,
         f"top_logprobs={p.top_logprobs} needs logprobs=True"),
        (prompt_len is not None and prompt_len >= p.max_length,
         f"the prompt has {prompt_len} tokens: max_length ({p.max_length}, prompt + generated) "
         "leaves no room to generate"),
    ]
    for failed, message in checks:
        if failed:
            raise ValueError(message)


class _IdSet:
    """Distinct token ids in first-seen order; `ids` is a numpy view for fancy indexing."""

    def __init__(self):
        self._members = set()
        self._buf = np.empty(64, np.int64)
        self._n = 0

    def add(self, token):
        if token in self._members:
            return
        self._members.add(token)
        if self._n == self._buf.size:
            self._buf = np.concatenate((self._buf, np.empty_like(self._buf)))
        self._buf[self._n] = token
        self._n += 1

    @property
    def ids(self):
        return self._buf[:self._n]


_EMPTY_IDS = np.empty(0, np.int64)


class RequestSamplingState:
    """What the sampler keeps of one request between steps: its params, its tokens (prompt, then
    each sampled token appended), the token sets its penalties read, updated in O(1) per token
    (O(n) for an n-gram's prefix), and its own random generator."""

    def __init__(self, params, prompt_ids):
        self.params = params
        self.tokens = []
        self.prompt_len = len(prompt_ids)
        self.rng = np.random.default_rng(params.seed)
        self.eos_ids = frozenset(params.eos_token_id)
        self.eos_array = np.array(params.eos_token_id, np.int64)
        rep = params.repetition_penalty != 1.0
        suppress = params.suppress_repetition_in_generation
        n = params.no_repeat_ngram_size
        # a 1-gram ban is every token seen so far: the set the repetition penalty keeps
        self._seen = _IdSet() if (rep and not suppress) or n == 1 else None
        self._generated = _IdSet() if params.presence_penalty != 0.0 or (rep and suppress) else None
        # (n-1)-token prefix -> tokens that followed it; lists: most prefixes have one follower
        self._ngrams = {} if n > 1 else None
        for t in prompt_ids:
            self._record(int(t))

    @property
    def num_generated(self):
        return len(self.tokens) - self.prompt_len

    def append(self, token):
        """Record a generated token (Sampler.sample does it for the tokens it returns)."""
        token = int(token)
        self._record(token)
        if self._generated is not None:
            self._generated.add(token)

    def _record(self, token):
        self.tokens.append(token)
        if self._seen is not None:
            self._seen.add(token)
        n = self.params.no_repeat_ngram_size
        if self._ngrams is not None and len(self.tokens) >= n:
            followers = self._ngrams.setdefault(tuple(self.tokens[-n:-1]), [])
            if token not in followers:
                followers.append(token)

    @property
    def repetition_ids(self):
        """Distinct tokens the repetition penalty applies to."""
        ids = self._generated if self.params.suppress_repetition_in_generation else self._seen
        return ids.ids if ids is not None else _EMPTY_IDS

    @property
    def generated_ids(self):
        """Distinct generated tokens (the presence penalty's)."""
        return self._generated.ids if self._generated is not None else _EMPTY_IDS

    def ngram_banned_ids(self):
        """Tokens that would complete an n-gram already present (ids to index with), or None."""
        n = self.params.no_repeat_ngram_size
        if n == 1:
            return self._seen.ids
        return self._ngrams.get(tuple(self.tokens[-(n - 1):]))


@dataclass
class SampleResult:
    ids: np.ndarray             # int64 [B]
    token_logprobs: np.ndarray  # float32 [B]; NaN in rows that did not ask for logprobs
    top_logprobs: list          # per row: [(id, logprob)] decreasing, or None without logprobs


class Sampler:
    def sample(self, logits, requests):
        """One token per row. logits: float32 [B, V], C-contiguous, penalized IN PLACE (after the
        call it holds the processed logits); requests: B RequestSamplingState, each given its
        new token (appended) before returning."""
        if not (isinstance(logits, np.ndarray) and logits.dtype == np.float32 and logits.ndim == 2
                and logits.flags.c_contiguous):
            raise TypeError("Sampler.sample: logits must be a C-contiguous float32 [B, V] array, "
                            f"got {type(logits).__name__} {getattr(logits, 'dtype', '')} "
                            f"{getattr(logits, 'shape', '')}")
        if logits.shape[0] != len(requests):
            raise ValueError(f"Sampler.sample: {logits.shape[0]} logits rows for "
                             f"{len(requests)} requests")
        batch = logits.shape[0]
        ids = np.empty(batch, np.int64)
        greedy = []
        for i, state in enumerate(requests):
            row = logits[i]
            apply_penalties(row, state)
            p = state.params
            if p.do_sample:
                cand, w = sampling_weights(row, p.temperature, p.top_k, p.top_p)
                j = pick(w, state.rng.random())
                ids[i] = j if cand is None else cand[j]
            else:
                greedy.append(i)
        if len(greedy) == batch:
            ids[:] = logits.argmax(axis=1)
        elif greedy:
            ids[greedy] = logits[greedy].argmax(axis=1)

        token_logprobs = np.full(batch, np.nan, np.float32)
        top_logprobs = [None] * batch
        for i, state in enumerate(requests):
            if state.params.logprobs:
                token_logprobs[i], top_logprobs[i] = logprobs(logits[i], ids[i],
                                                              state.params.top_logprobs)
            state.append(ids[i])
        return SampleResult(ids, token_logprobs, top_logprobs)
