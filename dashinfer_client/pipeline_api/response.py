"""Response (LMDeploy's fields) and Answer, which turns one request's GeneratedElements into
Responses through the front end's output side: the whole answer for pipe(), pieces for
stream_infer().

As in LMDeploy, the tokens that ended a request (the eos, a stop word) are not part of the answer:
neither its text nor its token_ids (the OutputProcessor's terminators). The finish reasons are
the front end's: 'stop', 'length', 'abort' (stopped), 'error' (interrupted).
"""
from dataclasses import dataclass, field
from typing import List, Optional

from ..frontend import Delta, OutputProcessor


@dataclass
class Response:
    """text: the answer (a piece of it when streaming). generate_token_len: tokens generated so far.
    input_token_len: prompt tokens, chat template included. session_id: the prompt's index in the
    call. finish_reason: None while running, 'stop' (eos or a stop word), 'length' (max_new_tokens or
    session_len; an empty text when the prompt alone fills the session), 'abort' (stopped) or
    'error' (the engine failed the request). token_ids: the answer's ids (the piece's when
    streaming). logprobs: with GenerationConfig(logprobs=N), per token {token id: logprob} of the
    token chosen and the N most likely. reasoning_content: with a model whose template speaks a
    reasoning format (<think>), the reasoning the text holds (None otherwise); tool_calls: when the
    call offered tools, the calls the text holds, in OpenAI's shape ({"id", "type": "function",
    "function": {"name", "arguments": JSON text}}), the whole ones a piece completes when streaming.
    text stays what the model wrote, as LMDeploy's pipeline answers it."""
    text: str
    generate_token_len: int
    input_token_len: int
    session_id: int
    finish_reason: Optional[str] = None
    token_ids: List[int] = field(default_factory=list)
    logprobs: Optional[List[dict]] = None
    index: int = 0  # LMDeploy's: which of the n answers (always 0)
    reasoning_content: Optional[str] = None
    tool_calls: Optional[List[dict]] = None

    def __repr__(self):
        head = (f"Response(session_id={self.session_id}, text={self.text!r}, "
                f"generate_token_len={self.generate_token_len}, input_token_len={self.input_token_len}, "
                f"finish_reason={self.finish_reason!r}")
        tail = (f", reasoning_content={self.reasoning_content!r}" if self.reasoning_content is not None else "") + \
            (f", tool_calls={self.tool_calls!r}" if self.tool_calls is not None else "")
        return head + (f", logprobs=[{len(self.logprobs)} tokens]" if self.logprobs is not None else "") + tail + ")"

    __str__ = __repr__


def too_long(session_id, input_len) -> Response:
    """The Response of a prompt that already fills the session."""
    return Response("", 0, input_len, session_id, "length", [], None)


class Answer:
    """One request's output through the front end's OutputProcessor. terminators: the token
    sequences that may end it (eos ids, stop words): never part of the answer; with_logprobs: the
    request asked for logprobs; reasoning / tools: the front end's parsers (None: none)."""

    def __init__(self, session_id, input_len, tokenizer, skip_special_tokens, terminators, with_logprobs,
                 reasoning=None, tools=None):
        self.session_id = session_id
        self.input_len = input_len
        self.with_logprobs = with_logprobs
        self.output = OutputProcessor(tokenizer, terminators=terminators, skip_special_tokens=skip_special_tokens,
                                      logprobs=with_logprobs, reasoning=reasoning, tools=tools)
        self.deltas = []

    def add(self, elements) -> Optional[Response]:
        """Take in new tokens -> the piece they complete (None while all of them are held back)."""
        delta = self.output.push(elements)
        self.deltas.append(delta)
        return self._response(delta, self.output.sent) if delta.token_ids else None

    def end(self, reason) -> Response:
        """The last piece, once the request ended for `reason` (RequestStatInfo's finish_reason)."""
        delta = self.output.finish(reason)
        self.deltas.append(delta)
        return self._response(delta, self.output.sent)

    def response(self, reason) -> Response:
        """The whole answer of a finished request."""
        self.end(reason)
        whole = Delta(reasoning="".join(d.reasoning for d in self.deltas),
                      tool_calls=[c for d in self.deltas for c in d.tool_calls],
                      raw_text="".join(d.raw_text for d in self.deltas),
                      token_ids=[i for d in self.deltas for i in d.token_ids],
                      logprobs=[t for d in self.deltas for t in d.logprobs], finish_reason=self.deltas[-1].finish_reason)
        return self._response(whole, len(whole.token_ids))

    def _response(self, delta, generated) -> Response:
        logprobs = [{**dict(top or ()), chosen: lp} for chosen, lp, top in delta.logprobs] \
            if self.with_logprobs else None
        reasoning = delta.reasoning if self.output.reasoning is not None else None
        calls = [c.openai() for c in delta.tool_calls] if self.output.tools is not None else None
        # LMDeploy's finish reasons: a call is an answer that stopped
        reason = "stop" if delta.finish_reason == "tool_calls" else delta.finish_reason
        return Response(delta.raw_text, generated, self.input_len, self.session_id, reason,
                        delta.token_ids, logprobs, reasoning_content=reasoning, tool_calls=calls)
