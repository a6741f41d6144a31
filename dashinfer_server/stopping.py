"""When a request stops, decided after each new token (DashInfer's UpdateIdOp::check_finish).

  eos_token_id    with early_stopping on (DashInfer's default), generating an eos id (one id or a
                  list) finishes the request; with early_stopping off, eos is an ordinary token and
                  the request runs to max_length (early_stopping means exactly this in DashInfer).
  stop_words_ids  the request finishes when the token sequence (prompt + generated, as DashInfer
                  compares it) ends with one of the stop words.
  max_length      prompt + generated tokens reach max_length.
  response_format the grammar has ended (the JSON is complete; or an eos id it allowed came, even
                  with early_stopping off): finish reason eos, as the model's own end.
  min_length      never stops a request by itself: the sampler masks eos ids until it is reached
                  (so eos cannot come earlier), but a stop word or max_length still ends a request
                  before min_length, as in DashInfer.

The token that triggers a stop (the eos, the stop word's last token) is delivered with the others:
the engine appends it to the output before finishing, as DashInfer does.
"""
from dashinfer_client.types import FinishReason


def check_stop(seq):
    """Why the request `seq` (a Sequence) must stop after its newest token, or None."""
    tokens = seq.tokens
    state = seq.sampling
    params = state.params
    new_id = tokens[-1]
    if params["early_stopping"] and new_id in state.eos_ids:
        return FinishReason.EOS
    if state.guide is not None and state.guide.ended:
        return FinishReason.EOS
    for word in params["stop_words_ids"]:
        if word[-1] == new_id and len(word) <= len(tokens) and tokens[-len(word):] == word:
            return FinishReason.STOP_WORDS
    if len(tokens) >= seq.max_length:
        return FinishReason.LENGTH
    return None
