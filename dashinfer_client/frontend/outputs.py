"""The output side of every front door: one request's GeneratedElements in, Deltas out.

    tokens -> (terminators held back) -> text on whole characters -> stop strings cut
           -> reasoning parser -> tool-call parser -> Delta(text, reasoning, tool_calls, ...)

Used by the HTTP server (OpenAI and Anthropic), the pipeline, `dashinfer chat` and EngineHelper.
Terminators are token sequences that end the answer without being part of it (the pipeline's eos
and stop words, as LMDeploy answers): while the request runs the newest tokens, as many as the
longest terminator, are held back until the next ones show they did not end it. Stop strings
are texts cut from the answer with everything after them (OpenAI's `stop`).
"""
from dataclasses import dataclass, field

from ..detokenize import IncrementalDecoder
from ..tokenizer import added_tokens
from ..types import FinishReason
from .parsers.base import ToolCallPart

# The engine's finish reason (RequestStatInfo) -> the answer's; a front door words these its way.
FINISH = {FinishReason.EOS: "stop", FinishReason.STOP_WORDS: "stop", FinishReason.LENGTH: "length",
          FinishReason.STOPPED: "abort", FinishReason.INTERRUPTED: "error"}


@dataclass
class Delta:
    """What one step of the answer adds. logprobs: (id, logprob, [(id, logprob), ...]) per token
    of token_ids, when asked. finish_reason: set on the last Delta only ('stop', 'length',
    'tool_calls', 'abort' or 'error'); stop_string: there, the stop string that ended the answer.
    tool_calls: the calls that ended in this step, whole (what a whole answer lists); tool_call_parts:
    the same calls as they stream (ToolCallPart: a call's id and name first, then its arguments' text
    in pieces, as the model writes them where its format allows, else whole). raw_text: the text as
    the model wrote it, before the parsers took reasoning and calls out of it (LMDeploy's pipeline
    answers it). prompt_logprobs: on the first Delta of a request with the prompt_logprobs option,
    (logprob, [(id, logprob), ...], rank) per prompt token after the first."""
    text: str = ""
    reasoning: str = ""
    tool_calls: list = field(default_factory=list)
    tool_call_parts: list = field(default_factory=list)
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str = None
    stop_string: str = None
    raw_text: str = ""
    prompt_logprobs: list = field(default_factory=list)

    def __bool__(self):
        return bool(self.text or self.reasoning or self.tool_calls or self.tool_call_parts or self.token_ids
                    or self.finish_reason)


class StopText:
    """Cuts the text at the first stop string; holds back an ending that may begin one."""

    def __init__(self, stops):
        self.stops, self.held, self.hit = list(stops), "", False
        self.matched = None  # the stop string met

    def push(self, piece: str) -> str:
        if self.hit:
            return ""
        text = self.held + piece
        found = [(i, s) for s in self.stops for i in (text.find(s),) if i >= 0]
        if found:
            cut, self.matched = min(found)
            self.held, self.hit = "", True
            return text[:cut]
        keep = max((n for s in self.stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


class OutputProcessor:
    """One request's answer. stop: stop strings; terminators: token sequences (lists of ids);
    logprobs: keep each token's logprobs; reasoning / tools: parser instances (parsers/) or None.
    A parser whose markers are special tokens (harmony's) has the text decoded with those kept (the
    tokenizer's other special tokens skipped, unless skip_special_tokens is False): the parsers take
    them out of content and reasoning, raw_text keeps them."""

    def __init__(self, tokenizer, stop=(), terminators=(), skip_special_tokens=True, logprobs=False,
                 reasoning=None, tools=None):
        kept = {t for p in (reasoning, tools) if p is not None for t in p.special_tokens}
        self.skipped = _special_ids(tokenizer, kept) if kept and skip_special_tokens else set()
        self.decoder = IncrementalDecoder(tokenizer, skip_special_tokens and not kept)
        self.stop = StopText(stop)
        self.terminators = [list(t) for t in terminators]
        self.hold = max((len(t) for t in self.terminators), default=0)
        self.with_logprobs = logprobs
        self.reasoning, self.tools = reasoning, tools
        self.ids, self.logprobs = [], []
        self.sent = 0  # ids handed out
        # The answer's tokens its reasoning took, its markers (<think>, </think>, harmony's) not
        # counted, as vLLM counts them; usage's reasoning_tokens.
        self.reasoning_tokens = 0
        self.unplaced = 0  # tokens handed out whose text has not come out of the parsers yet
        self.boundary_ids = _marker_ids(tokenizer, reasoning.boundary_tokens) if reasoning is not None else set()
        self.called = False  # a tool call was handed out
        self.call_index = {}  # tool call id -> its index in the answer, in the order calls began

    @property
    def stopped(self) -> bool:
        """A stop string ended the answer: nothing after it is handed out."""
        return self.stop.hit

    def push(self, elements) -> Delta:
        """The Delta of newly generated tokens (a GeneratedElements)."""
        new = elements.ids_from_generate
        self.ids += new
        if self.with_logprobs:
            self.logprobs += zip(new, elements.token_logprobs_list, elements.log_probs_list)
        delta = self._release(max(self.sent, len(self.ids) - self.hold))
        delta.prompt_logprobs = list(zip(elements.prompt_token_logprobs_list, elements.prompt_log_probs_list,
                                         elements.prompt_token_ranks_list))
        return delta

    def finish(self, engine_reason) -> Delta:
        """The last Delta, once the request ended for engine_reason (a FinishReason; None or ''
        when the engine interrupted it)."""
        delta = self._release(self._answer_len(engine_reason))
        tail = self.stop.push(self.decoder.finish()) + self.stop.flush()
        rest = self._parse(tail, final=True)
        delta.text += rest.text
        delta.reasoning += rest.reasoning
        delta.tool_calls += rest.tool_calls
        delta.tool_call_parts += rest.tool_call_parts
        delta.raw_text += rest.raw_text
        self._count_reasoning((), rest)
        reason = "stop" if self.stop.hit else FINISH.get(engine_reason or FinishReason.INTERRUPTED, "error")
        delta.finish_reason = "tool_calls" if self.called and reason == "stop" else reason
        delta.stop_string = self.stop.matched
        return delta

    def _answer_len(self, engine_reason) -> int:
        """How many ids are the answer: without the terminator that ended it."""
        n = len(self.ids)
        if engine_reason in (FinishReason.EOS, FinishReason.STOP_WORDS):
            for t in sorted(self.terminators, key=len, reverse=True):
                if len(t) <= n and self.ids[n - len(t):] == t:
                    return n - len(t)
        return n

    def _release(self, end) -> Delta:
        ids, logprobs = self.ids[self.sent:end], self.logprobs[self.sent:end]
        self.sent = max(self.sent, end)
        shown = [i for i in ids if i not in self.skipped] if self.skipped else ids
        delta = self._parse(self.stop.push(self.decoder.push(shown)) if shown else "", final=False)
        delta.token_ids, delta.logprobs = ids, logprobs
        self._count_reasoning(ids, delta)
        return delta

    def _count_reasoning(self, ids, delta) -> None:
        """Counts the tokens of `ids` that are reasoning. A token whose text has not come out (held
        by the decoder, a stop string or a parser, or a header the parser takes out) goes with the
        next text that does; where that text is both reasoning and answer, its tokens are shared by
        characters."""
        if self.reasoning is None:
            return
        self.unplaced += sum(i not in self.boundary_ids for i in ids)
        said = len(delta.text) + sum(len(p.name or "") + len(p.arguments) for p in delta.tool_call_parts)
        if delta.reasoning or said:
            self.reasoning_tokens += round(self.unplaced * len(delta.reasoning) / (len(delta.reasoning) + said))
            self.unplaced = 0

    def _parse(self, text, final) -> Delta:
        raw, reasoning, calls, parts = text, "", [], []
        if self.reasoning is not None:
            reasoning, text = self.reasoning.feed(text)
            if final:
                more_reasoning, more_text = self.reasoning.finish()
                reasoning, text = reasoning + more_reasoning, text + more_text
        if self.tools is not None:
            text, calls = self.tools.feed(text)
            if final:
                more_text, more_calls = self.tools.finish()
                text, calls = text + more_text, calls + more_calls
            parts = self._parts(calls)
        self.called = self.called or bool(calls)
        return Delta(text, reasoning, calls, parts, raw_text=raw)

    def _parts(self, calls) -> list:
        """The parser's streamed parts, then each call it did not stream as one part; numbered."""
        parts = self.tools.take_parts()
        streamed = {p.id for p in parts} | set(self.call_index)
        parts += [ToolCallPart(c.id, c.name, c.arguments) for c in calls if c.id not in streamed]
        for part in parts:
            part.index = self.call_index.setdefault(part.id, len(self.call_index))
        return parts


def _marker_ids(tokenizer, markers) -> set:
    """The ids of those of `markers` (texts) that are tokens of their own (added tokens)."""
    added = added_tokens(tokenizer)
    return {added[m] for m in markers if m in added}


def _special_ids(tokenizer, kept) -> set:
    """The ids of the tokenizer's special tokens other than `kept` (texts): what the decoder, which
    keeps special tokens for a parser that reads some, must still skip."""
    added = tokenizer.backend_tokenizer.get_added_tokens_decoder()
    return {i for i, token in added.items() if token.special and token.content not in kept}
