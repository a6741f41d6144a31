"""Prompt logprobs: how likely the model finds each token of a prompt after the first (the
generation option prompt_logprobs: k), with the k most likely tokens at its place and its rank.

Position p's logits give token p + 1, so a prompt chunk of such a request has its rows scored
(StepPlan.score_rows) up to the one before its last prompt token, whose logits are sampled as
every request's are. The forward computes the head over those rows a slice at a time, on every
rank (the vocabulary-parallel head gathers each slice), and rank 0's StepScores turns each slice
into logprobs at once (model.DecoderModel.forward's `score`), before the next slice overwrites it.
A request's values are kept by position (PromptScores), so a prompt in several chunks fills them
step by step; they go to its queue with its first token. Such a request computes its whole
prompt: a prefix the cache holds has K/V but no logits (Scheduler._admit, as vLLM does).
"""
import numpy as np

from . import kernels as K


class PromptScores:
    """One request's prompt logprobs, by position: entry p is prompt token p + 1's."""

    def __init__(self, prompt_len: int, k: int):
        n = prompt_len - 1
        self.k = k
        self.token_logprobs = np.zeros(n, np.float32)
        self.top_ids = np.zeros((n, k), np.int32)
        self.top_logprobs = np.zeros((n, k), np.float32)
        self.ranks = np.zeros(n, np.int64)

    def pushed(self) -> tuple:
        """ResultQueue.push's prompt_logprobs."""
        tops = [list(zip(ids.tolist(), lps.tolist())) for ids, lps in zip(self.top_ids, self.top_logprobs)]
        return self.token_logprobs.tolist(), tops, self.ranks.tolist()


def scored_positions(chunk) -> range:
    """The positions of `chunk` (a scheduler.Chunk) whose logits score the next prompt token."""
    seq = chunk.seq
    if seq.prompt_scores is None:
        return range(0)
    return range(chunk.start, min(chunk.start + chunk.count, seq.prompt_len - 1))


class StepScores:
    """The scored rows of one step, in StepPlan.score_rows' order: each one's request, position
    and target (the prompt token that follows it). Called with each slice of their logits."""

    def __init__(self, chunks):
        self.scores, self.positions, targets = [], [], []
        for c in chunks:
            positions = scored_positions(c)
            self.scores += [c.seq.prompt_scores] * len(positions)
            self.positions += positions
            targets += c.seq.tokens[positions.start + 1:positions.stop + 1]
        self.targets = np.array(targets, np.int32)

    def __len__(self) -> int:
        return len(self.positions)

    def __call__(self, first: int, logits) -> None:
        """logits [n, V]: the rows first .. first + n of this step's scored rows."""
        n = logits.shape[0]
        scores, positions = self.scores[first:first + n], self.positions[first:first + n]
        targets = self.targets[first:first + n]
        wanted = np.array([s.k for s in scores], np.int32)
        width = max(1, int(wanted.max()))
        token_logprobs = np.empty(n, np.float32)
        top_ids = np.zeros((n, width), np.int32)
        top_logprobs = np.zeros((n, width), np.float32)
        K.logprobs(logits, targets, wanted, token_logprobs, top_ids, top_logprobs)
        # rank: 1 + the tokens more likely than the target (vLLM's)
        ranks = 1 + (logits > logits[np.arange(n), targets][:, None]).sum(axis=1)
        for i, (s, p) in enumerate(zip(scores, positions)):
            s.token_logprobs[p], s.ranks[p] = token_logprobs[i], ranks[i]
            s.top_ids[p], s.top_logprobs[p] = top_ids[i, :s.k], top_logprobs[i, :s.k]
