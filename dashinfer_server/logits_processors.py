"""Logits processing for one row of logits (one request) in numpy: penalties and
log-probabilities. Drawing the token (temperature, top-k, top-p, min-p) is native/sample.c's,
all rows at once.

top_k_indices avoids a whole-vocabulary partition: on V = 49152, np.argpartition costs ~0.4 ms,
while a vectorized max / compare costs 5-40 us.
"""
import numpy as np

NEG_INF = np.float32(-np.inf)

# top_k_indices: columns of the [V / _GROUPS, _GROUPS] view whose maxima bound the k-th largest.
_GROUPS = 1024


def apply_penalties(row, state):
    """Penalize row (float32 [V], in place) for the history held by `state`, in DashInfer's order:
    repetition, presence (with OpenAI's frequency penalty beside it), the caller's logit_bias,
    then the bans: no-repeat n-gram, min-length, bad words."""
    p = state.params
    penalty = p["repetition_penalty"]
    if penalty != 1.0:
        ids = state.repetition_ids
        if ids.size:
            # Dividing a negative logit would raise it: negative logits are multiplied instead.
            v = row[ids]
            row[ids] = np.where(v < 0, v * np.float32(penalty), v / np.float32(penalty))
    if p["presence_penalty"] != 0.0:
        ids = state.generated_ids
        if ids.size:
            row[ids] -= np.float32(p["presence_penalty"])
    if p["frequency_penalty"] != 0.0:
        ids = state.generated_ids
        if ids.size:
            row[ids] -= np.float32(p["frequency_penalty"]) * state.generated_counts
    if state.bias_ids is not None:
        row[state.bias_ids] += state.bias_values
    if state.ngram_size:
        banned = state.ngram_banned_ids()
        if banned is not None:
            row[banned] = NEG_INF
    if len(state.tokens) < p["min_length"]:
        row[state.eos_array] = NEG_INF
    bad = state.bad_word_ids()
    if bad is not None and bad.size:
        row[bad] = NEG_INF


def top_k_indices(x, k):
    """Indices of the k largest entries of x [n] (exact, in no particular order).

    The maxima of _GROUPS disjoint groups are _GROUPS distinct entries, so the k-th largest of them
    is <= the k-th largest entry: every top-k entry is >= it, and one compare leaves few candidates.
    """
    n = x.size
    if k >= n:
        return np.arange(n)
    if n < 8 * _GROUPS or 8 * k > _GROUPS:
        return np.argpartition(x, n - k)[n - k:]
    whole = n - n % _GROUPS
    group_max = x[:whole].reshape(-1, _GROUPS).max(axis=0)
    if whole < n:
        group_max = np.concatenate((group_max, x[whole:]))
    bound = np.partition(group_max, group_max.size - k)[group_max.size - k]
    cand = np.flatnonzero(x >= bound)
    if cand.size > k:
        cand = cand[np.argpartition(x[cand], cand.size - k)[cand.size - k:]]
    return cand


def _descending(x, ids):
    return ids[np.argsort(-x[ids], kind="stable")]


def logprobs(row, token, top_n):
    """log_softmax(row) at `token`, and the top_n largest as [(id, logprob)], decreasing."""
    m = row.max()
    lse = float(m) + float(np.log(np.exp(row - m).sum()))
    top = []
    if top_n:
        ids = _descending(row, top_k_indices(row, top_n))
        top = [(int(i), float(row[i]) - lse) for i in ids]
    return float(row[token]) - lse, top
