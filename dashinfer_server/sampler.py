"""Sampling: what the sampler keeps of each request (its options, the token sets its penalties
read, its random generator) and the Sampler that turns a batch of logits into one token per request:
penalties and masks here, row by row in numpy; the draw (greedy, temperature, top-k, top-p, min-p)
and the log-probabilities in native/sample.c, every row at once on the kernels' threads.

A request's options come checked (dashinfer_client.generation_config.check_generation: a plain
dict); its tokens are the request's own list (Sequence.tokens), read here, never copied.
Semantics follow DashInfer (allspark GenerateConfig and its CPU/CUDA generate kernels); where it
is silent, Hugging Face transformers. Per option:
  do_sample            False: greedy argmax (of the penalized logits: penalties apply to greedy too).
  temperature          divides the logits before top-k / top-p; 0 = greedy, as do_sample False.
  top_k                keep the k most probable tokens; 0 (or >= vocab) = off.
  top_p                keep the shortest most-probable prefix whose probability exceeds top_p,
                       computed after top-k; 1.0 = off.
  min_p                after top-p, drop the tokens whose probability is below min_p times the
                       most probable one's (transformers' MinPLogitsWarper, in its order); 0 = off.
                       Greedy is unchanged by it.
  repetition_penalty   HF formula (logit / p if > 0 else logit * p), once per distinct token of
                       prompt + generated tokens; 1.0 = off.
  suppress_repetition_in_generation
                       the repetition penalty looks at generated tokens only, not the prompt.
  presence_penalty     subtracted once from every token generated so far (never the prompt's);
                       0 = off.
  frequency_penalty    OpenAI's: times the number of times a token was generated so far (never
                       the prompt's), subtracted from its logit; 0 = off.
  logit_bias           {token id: bias} added to those logits after the penalties, before the
                       bans below (so -100 cannot undo a ban, and +100 cannot beat one).
  length_penalty       DashInfer uses it in beam search only, which it does not run: any value
                       other than 1.0 is refused (request.check_generation).
  no_repeat_ngram_size a token that would repeat an n-gram of prompt + generated tokens gets -inf.
  min_length           eos ids get -inf while prompt + generated length < min_length.
  eos_token_id, stop_words_ids, max_length, early_stopping: see stopping.py.
  seed                 each request owns a numpy Generator seeded with it and draws exactly one
                       uniform number per sampled token: the same seed gives the same tokens in any
                       batch.
  logprobs, top_logprobs
                       log_softmax of the logits after penalties, before temperature and top-k /
                       top-p (what DashInfer's logprobs kernel reads); top_logprobs <= 10 pairs.
  response_format      after the penalties, the request's grammar (guided.py) sets every token it
                       forbids to -inf, for greedy and sampling alike; logprobs see the mask.
"""
from dataclasses import dataclass

import numpy as np

from . import kernels as K
from .logits_processors import apply_penalties


class _IdSet:
    """Distinct token ids in first-seen order, each with how often it was added; `ids` and
    `counts` are numpy views for fancy indexing."""

    def __init__(self):
        self._position = {}
        self._buf = np.empty(64, np.int64)
        self._counts = np.zeros(64, np.float32)
        self._n = 0

    def add(self, token):
        i = self._position.get(token)
        if i is not None:
            self._counts[i] += 1
            return
        if self._n == self._buf.size:
            self._buf = np.concatenate((self._buf, np.empty_like(self._buf)))
            self._counts = np.concatenate((self._counts, np.zeros_like(self._counts)))
        self._position[token] = self._n
        self._buf[self._n] = token
        self._counts[self._n] = 1
        self._n += 1

    @property
    def ids(self):
        return self._buf[:self._n]

    @property
    def counts(self):
        return self._counts[:self._n]


_EMPTY_IDS = np.empty(0, np.int64)


class RequestSamplingState:
    """What the sampler keeps of one request between steps: its checked options (`params`, with
    `greedy` and `eos_ids` derived once), the token sets its penalties read, updated in O(1) per
    token (O(n) for an n-gram's prefix), and its own random generator. `tokens` is the request's
    token list (prompt, then generated), shared: its owner appends a token, then calls observe()."""

    def __init__(self, params: dict, tokens: list, guide=None):
        self.params = params
        self.tokens = tokens
        self.guide = guide  # a guided.Guide (response_format), or None
        self.greedy = not params["do_sample"] or params["temperature"] == 0.0
        # K.sample's options row but u: temperature, top_k, top_p, min_p
        self.draw_options = (params["temperature"], params["top_k"], params["top_p"], params["min_p"], 0.0)
        eos = params["eos_token_id"]
        self.eos_ids = frozenset(eos if isinstance(eos, list) else [eos])
        self.eos_array = np.array(sorted(self.eos_ids), np.int64)
        rep = params["repetition_penalty"] != 1.0
        suppress = params["suppress_repetition_in_generation"]
        self.ngram_size = n = params["no_repeat_ngram_size"]
        # a 1-gram ban is every token seen so far: the set the repetition penalty keeps
        self._seen = _IdSet() if (rep and not suppress) or n == 1 else None
        counted = params["presence_penalty"] != 0.0 or params["frequency_penalty"] != 0.0
        self._generated = _IdSet() if counted or (rep and suppress) else None
        # (n-1)-token prefix -> tokens that followed it; lists: most prefixes have one follower
        self._ngrams = {} if n > 1 else None
        self.rng = np.random.default_rng(params["seed"])
        bad = params["bad_words_ids"]
        self.bad_tokens = np.array(sorted({w[0] for w in bad if len(w) == 1}), np.int64)  # always banned
        self.bad_sequences = [(tuple(w[:-1]), w[-1]) for w in bad if len(w) > 1]  # banned after a prefix
        bias = params["logit_bias"]
        self.bias_ids = np.fromiter(bias.keys(), np.int64, len(bias)) if bias else None
        self.bias_values = np.fromiter(bias.values(), np.float32, len(bias)) if bias else None
        for end in range(1, len(tokens) + 1):
            self._record(end)

    def observe(self, token: int) -> None:
        """Take in the generated `token`, just appended to `tokens`."""
        self._record(len(self.tokens))
        if self._generated is not None:
            self._generated.add(token)
        if self.guide is not None:
            self.guide.advance(token)

    def _record(self, end):
        """Take in tokens[end - 1] (the prompt's or a generated one)."""
        token = self.tokens[end - 1]
        if self._seen is not None:
            self._seen.add(token)
        n = self.ngram_size
        if self._ngrams is not None and end >= n:
            followers = self._ngrams.setdefault(tuple(self.tokens[end - n:end - 1]), [])
            if token not in followers:
                followers.append(token)

    @property
    def repetition_ids(self):
        """Distinct tokens the repetition penalty applies to."""
        ids = self._generated if self.params["suppress_repetition_in_generation"] else self._seen
        return ids.ids if ids is not None else _EMPTY_IDS

    @property
    def generated_ids(self):
        """Distinct generated tokens (the presence penalty's)."""
        return self._generated.ids if self._generated is not None else _EMPTY_IDS

    @property
    def generated_counts(self):
        """How often each of generated_ids was generated (the frequency penalty's), float32."""
        return self._generated.counts

    def bad_word_ids(self):
        """Tokens bad_words_ids bans at this step (ids to index with), or None."""
        if not self.bad_sequences:
            return self.bad_tokens if self.bad_tokens.size else None
        tail = [last for prefix, last in self.bad_sequences
                if len(prefix) <= len(self.tokens) and tuple(self.tokens[len(self.tokens) - len(prefix):]) == prefix]
        return np.concatenate((self.bad_tokens, np.array(tail, np.int64))) if tail else self.bad_tokens

    def ngram_banned_ids(self):
        """Tokens that would complete an n-gram already present (ids to index with), or None."""
        n = self.ngram_size
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
        call it holds the processed logits); requests: B RequestSamplingState, unchanged but for
        their random generators (the caller appends the tokens)."""
        if not (isinstance(logits, np.ndarray) and logits.dtype == np.float32 and logits.ndim == 2
                and logits.flags.c_contiguous):
            raise TypeError("Sampler.sample: logits must be a C-contiguous float32 [B, V] array, "
                            f"got {type(logits).__name__} {getattr(logits, 'dtype', '')} "
                            f"{getattr(logits, 'shape', '')}")
        if logits.shape[0] != len(requests):
            raise ValueError(f"Sampler.sample: {logits.shape[0]} logits rows for "
                             f"{len(requests)} requests")
        batch = logits.shape[0]
        # per row: temperature (0: greedy), top_k (0: off), top_p (1: off), min_p (0: off), u (the
        # one number drawn); one array, since every numpy call counts between two decode steps
        options = np.zeros((batch, 5))
        logprobs = False
        for i, state in enumerate(requests):
            row = logits[i]
            apply_penalties(row, state)
            if state.guide is not None:  # last: the grammar's mask overrides what came before
                state.guide.apply(row)
            if not state.greedy:
                options[i] = state.draw_options
                options[i, 4] = state.rng.random()
            logprobs = logprobs or state.params["logprobs"]
        ids32 = np.empty(batch, np.int32)
        K.sample(logits, options, ids32)  # rows in parallel, in C
        ids = ids32.astype(np.int64)

        token_logprobs = np.full(batch, np.nan, np.float32)
        top_logprobs = [None] * batch
        if logprobs:  # the rows that asked, in C as the draw
            wanted = np.array([min(state.params["top_logprobs"], logits.shape[1]) if state.params["logprobs"]
                               else -1 for state in requests], np.int32)
            width = max(1, int(wanted.max()))
            top_ids = np.zeros((batch, width), np.int32)
            top_values = np.zeros((batch, width), np.float32)
            K.logprobs(logits, ids32, wanted, token_logprobs, top_ids, top_values)
            for i in np.flatnonzero(wanted >= 0):
                n = wanted[i]
                top_logprobs[i] = [(int(t), float(v)) for t, v in zip(top_ids[i, :n], top_values[i, :n])]
        return SampleResult(ids, token_logprobs, top_logprobs)
