"""Response (LMDeploy's fields) and Answer, which turns one request's GeneratedElements into
Responses: the whole answer for pipe(), pieces for stream_infer().

As in LMDeploy, the tokens that ended a request (the eos, a stop word) are not part of the answer:
neither its text nor its token_ids. Streaming holds back the newest tokens, as many as the longest
of them, until the next tokens show they did not end it.
"""
from dataclasses import dataclass, field
from typing import List, Optional

from ..detokenize import IncrementalDecoder
from ..types import FinishReason

# RequestStatInfo's finish_reason -> LMDeploy's.
FINISH = {FinishReason.EOS: "stop", FinishReason.STOP_WORDS: "stop", FinishReason.LENGTH: "length",
          FinishReason.STOPPED: "abort", FinishReason.INTERRUPTED: "error"}


@dataclass
class Response:
    """text: the answer (a piece of it when streaming). generate_token_len: tokens generated so far.
    input_token_len: prompt tokens, chat template included. session_id: the prompt's index in the
    call. finish_reason: None while running, 'stop' (eos or a stop word), 'length' (max_new_tokens or
    session_len; an empty text when the prompt alone fills the session), 'abort' (stopped) or
    'error' (the engine failed the request). token_ids: the answer's ids (the piece's when
    streaming). logprobs: with GenerationConfig(logprobs=N), per token {token id: logprob} of the
    token chosen and the N most likely."""
    text: str
    generate_token_len: int
    input_token_len: int
    session_id: int
    finish_reason: Optional[str] = None
    token_ids: List[int] = field(default_factory=list)
    logprobs: Optional[List[dict]] = None
    index: int = 0  # LMDeploy's: which of the n answers (always 0)

    def __repr__(self):
        head = (f"Response(session_id={self.session_id}, text={self.text!r}, "
                f"generate_token_len={self.generate_token_len}, input_token_len={self.input_token_len}, "
                f"finish_reason={self.finish_reason!r}")
        return head + (f", logprobs=[{len(self.logprobs)} tokens]" if self.logprobs is not None else "") + ")"

    __str__ = __repr__


def too_long(session_id, input_len) -> Response:
    """The Response of a prompt that already fills the session."""
    return Response("", 0, input_len, session_id, "length", [], None)


class Answer:
    """One request's output. terminators: the token sequences that may end it (eos ids, stop words);
    with_logprobs: the request asked for logprobs."""

    def __init__(self, session_id, input_len, tokenizer, skip_special_tokens, terminators, with_logprobs):
        self.session_id = session_id
        self.input_len = input_len
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.terminators = [list(t) for t in terminators]
        self.hold = max((len(t) for t in self.terminators), default=0)
        self.with_logprobs = with_logprobs
        self.ids, self.logprobs = [], []
        self.sent = 0  # ids already handed out as pieces
        self.decoder = None

    def add(self, elements) -> None:
        self.ids += elements.ids_from_generate
        if self.with_logprobs:
            for chosen, token_lp, top in zip(elements.ids_from_generate, elements.token_logprobs_list,
                                             elements.log_probs_list):
                self.logprobs.append({**dict(top or ()), chosen: token_lp})

    def _answer_len(self, reason):
        """How many of the ids are the answer once the request ended for `reason`."""
        n = len(self.ids)
        if reason == FinishReason.EOS and n:
            return n - 1
        if reason == FinishReason.STOP_WORDS:
            for t in sorted(self.terminators, key=len, reverse=True):
                if len(t) <= n and self.ids[n - len(t):] == t:
                    return n - len(t)
        return n

    def response(self, reason) -> Response:
        """The whole answer of a finished request."""
        n = self._answer_len(reason)
        ids = self.ids[:n]
        text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return Response(text, len(ids), self.input_len, self.session_id, FINISH.get(reason, "error"), ids,
                        self.logprobs[:n] if self.with_logprobs else None)

    def piece(self, reason=None) -> Optional[Response]:
        """The next piece: the ids not handed out yet (but the newest `hold` while it runs); None when
        there is nothing to hand out. reason: the request has ended, for that reason."""
        if self.decoder is None:
            self.decoder = IncrementalDecoder(self.tokenizer, self.skip_special_tokens)
        end = self._answer_len(reason) if reason else max(self.sent, len(self.ids) - self.hold)
        ids = self.ids[self.sent:end]
        if not ids and not reason:
            return None
        text = self.decoder.push(ids) + (self.decoder.finish() if reason else "")
        logprobs = self.logprobs[self.sent:end] if self.with_logprobs else None
        self.sent = end
        return Response(text, end, self.input_len, self.session_id,
                        FINISH.get(reason, "error") if reason else None, ids, logprobs)
