"""Logits processing for one row of logits (one request) in numpy: the penalties. Drawing the
token (temperature, top-k, top-p, min-p) and the log-probabilities are native/sample.c's, all
rows at once."""
import numpy as np

NEG_INF = np.float32(-np.inf)


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
