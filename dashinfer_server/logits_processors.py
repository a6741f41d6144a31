"""Logits processing for one row of logits (one request): penalties, top-k / top-p candidate
selection, drawing a token, log-probabilities. Pure numpy over float32 [V] rows.

The selection helpers avoid whole-vocabulary sorts and partitions: on V = 49152, np.argpartition
costs ~0.4 ms and np.cumsum ~0.17 ms, while a vectorized max / compare / exp costs 5-40 us.
"""
import numpy as np

NEG_INF = np.float32(-np.inf)

# top_k_indices: columns of the [V / _GROUPS, _GROUPS] view whose maxima bound the k-th largest.
_GROUPS = 1024
# pick: block size of the two-level inverse CDF over a whole vocabulary.
_CHUNK = 256


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


def _heaviest(w, target):
    """Indices of the largest entries of w [n], sorted descending, whose sum exceeds target (or all
    of them): the top-p nucleus lies inside, and usually only a few dozen tokens need sorting."""
    size = 64
    while size < w.size:
        ids = top_k_indices(w, size)
        if w[ids].sum() > target:
            return _descending(w, ids)
        size *= 16
    return _descending(w, np.arange(w.size))


def sampling_weights(row, temperature, top_k, top_p, min_p=0.0):
    """The distribution a sampled token is drawn from: (ids, weights), unnormalized.

    Order as in DashInfer and transformers: temperature, top-k (0 or >= V: off), then top-p on the
    renormalized top-k distribution, keeping the shortest most-probable prefix whose probability
    exceeds top_p (at least one token), then min_p (0: off): the tokens left whose probability is
    at least min_p times the largest. ids is None when the whole vocabulary is kept (then weights
    is float32 [V]); otherwise ids are sorted by decreasing probability.
    """
    # The weights are probabilities over the largest one (which weighs exp(0) = 1), so min_p
    # compares them with min_p itself.
    if 0 < top_k < row.size:
        ids = _descending(row, top_k_indices(row, top_k))
        w = np.exp((row[ids].astype(np.float64) - row[ids[0]]) / temperature)
        mass = w.sum()
    else:
        w_all = np.exp((row - row.max()) / np.float32(temperature))
        if top_p >= 1.0 and min_p <= 0.0:
            return None, w_all
        if top_p >= 1.0:
            ids = _descending(w_all, np.flatnonzero(w_all >= np.float32(min_p)))
            return ids, w_all[ids].astype(np.float64)
        mass = float(w_all.sum())
        ids = _heaviest(w_all, top_p * mass)
        w = w_all[ids].astype(np.float64)
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(w), top_p * mass, side="right")) + 1
        ids, w = ids[:keep], w[:keep]
    if min_p > 0.0:
        keep = int(np.count_nonzero(w >= min_p))  # w decreases: the kept tokens lead
        ids, w = ids[:keep], w[:keep]
    return ids, w


def _first_above(cdf, target):
    """First i with cdf[i] > target; a zero-weight entry (a flat step) is never returned."""
    i = int(np.searchsorted(cdf, target, side="right"))
    if i == cdf.size:  # target == total, only by rounding: take the last entry with weight
        i = int(np.flatnonzero(np.diff(cdf, prepend=0.0))[-1])
    return i


def pick(w, u):
    """Index i drawn with probability w[i] / sum(w) by inverting the CDF at u in [0, 1).

    One uniform number per token: a request's random stream does not depend on its batch.
    Over a whole vocabulary the CDF is built in two levels (block sums, then one block).
    """
    if w.size <= 4 * _CHUNK:
        cdf = np.cumsum(w, dtype=np.float64)
        return _first_above(cdf, u * cdf[-1])
    block_cdf = np.cumsum(np.add.reduceat(w, np.arange(0, w.size, _CHUNK), dtype=np.float64))
    target = u * block_cdf[-1]
    j = _first_above(block_cdf, target)
    below = block_cdf[j - 1] if j else 0.0
    inner = np.cumsum(w[j * _CHUNK:(j + 1) * _CHUNK], dtype=np.float64)
    return j * _CHUNK + _first_above(inner, target - below)


def logprobs(row, token, top_n):
    """log_softmax(row) at `token`, and the top_n largest as [(id, logprob)], decreasing."""
    m = row.max()
    lse = float(m) + float(np.log(np.exp(row - m).sum()))
    top = []
    if top_n:
        ids = _descending(row, top_k_indices(row, top_n))
        top = [(int(i), float(row[i]) - lse) for i in ids]
    return float(row[token]) - lse, top
