"""Guided decoding: a request's response_format becomes a grammar whose allowed-token mask is
applied to its logits before every sampling step.

The grammar library is llguidance (docs/http.md, "Guided decoding", says why: per-token cost
measured by bench/guided.py, and no torch at run time). One `Grammars` per model holds the
llguidance view of the model's tokenizer (built once, on the first guided request: under a second
at a 49152 vocabulary); each guided request gets its own `Guide`, compiled in the thread that
starts the request (~1 ms; never the scheduler's), and advanced by the scheduler thread with each
token. Only rank 0 samples, so under tensor parallelism the grammar lives there alone.

Forms of response_format (dashinfer_client.generation_config checks their shape):
  {"type": "text"}                                    no constraint (OpenAI's default)
  {"type": "json_object"}                             any JSON object
  {"type": "json_object", "json_schema": S}           DashInfer's form: S a JSON schema, as a
                                                      JSON string or a dict
  {"type": "json_schema", "json_schema": {"schema": S, "name": ..., "strict": ...}}
                                                      OpenAI's form
  {"type": "grammar", "grammar": LARK}                DashInfer's: a lark grammar (llguidance's
                                                      dialect, %json {schema} inside it); forced
                                                      tool calls use it
  "reasoning_end": TEXT in a json or grammar form     the output is free up to TEXT's first
                                                      occurrence, constrained after it (a reasoning
                                                      model's </think>; vLLM lets it reason too)
  "reasoning_start": TEXT beside it                   that free part is optional and begins with
                                                      TEXT (<think>, which a model opens itself)
  "answer_start": TEXT beside reasoning_end           the constrained part begins with TEXT, right
                                                      after the free part or without it (harmony's
                                                      final channel header); the bounds' added
                                                      tokens (harmony's markers) are those tokens
The request ends where the grammar ends (the closing brace of the object), with finish reason
eos; an eos id is allowed wherever the grammar may end, and ends the request too.
"""
import json
import logging
import threading

import numpy as np

from dashinfer_client.generation_config import (response_format_grammar, response_format_reasoning,
                                                response_format_schema)
from dashinfer_client.lark_text import added_pieces, lark_text
from dashinfer_client.tokenizer import added_tokens

log = logging.getLogger("dashinfer_server")
# Whitespace between JSON tokens: any, as JSON allows, but at most 20 characters in a row (enough
# for a newline and nine levels of indentation): unbounded, a model can emit whitespace until its
# max_length and never close the object. A schema's own "x-guidance" options override this.
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{1,20}"}
NEG_INF = np.float32(-np.inf)
# mask byte -> the 8 additive biases of its tokens (bit i set: token allowed, bias 0; else -inf)
_BYTE_TO_BIAS = np.where(np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little") == 1,
                         np.float32(0.0), NEG_INF).astype(np.float32)


def _bit(bits, token) -> bool:
    return bool(bits[token >> 3] >> (token & 7) & 1)


def _set_bits(bits, tokens, value: bool) -> None:
    for t in tokens:
        t = int(t)
        if value:
            bits[t >> 3] |= np.uint8(1 << (t & 7))
        else:
            bits[t >> 3] &= np.uint8(~(1 << (t & 7)) & 0xFF)


class GrammarError(ValueError):
    """response_format names a schema the grammar compiler refuses (the reason is its message)."""


class Grammars:
    """The grammar compiler of one model. tokenizer_source: a callable returning the model's
    tokenizer (a Hugging Face fast tokenizer or dashinfer_client.tokenizer.Tokenizer: anything with
    backend_tokenizer and eos_token_id), called on the first guided request; vocab_size: the
    model's logits width, which may exceed the tokenizer's."""

    def __init__(self, tokenizer_source, vocab_size: int):
        self._source = tokenizer_source  # a callable returning the tokenizer (loaded lazily)
        self.vocab_size = vocab_size
        self._ll_tokenizer = None
        self._added = {}  # the tokenizer's added tokens, text -> id
        self._lock = threading.Lock()

    def _tokenizer(self):
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = self._build_tokenizer()
            return self._ll_tokenizer

    def _build_tokenizer(self):
        try:
            import llguidance
        except ImportError as e:
            raise GrammarError("response_format needs the llguidance package (pip install llguidance)") from e
        try:
            tok = self._source()
        except Exception as e:
            raise GrammarError(f"response_format needs the model's tokenizer: {e}") from e
        if not hasattr(tok, "backend_tokenizer"):
            raise GrammarError(f"response_format needs a fast (tokenizer.json) tokenizer, the model has "
                               f"{type(tok).__name__}")
        eos = tok.eos_token_id
        self._added = added_tokens(tok)
        # The serialized backend carries the added tokens too; llguidance reads the bytes of every
        # token from it, and masks the ids past the tokenizer's (the logits' padding rows).
        # json_slices: the token-trie partition for JSON grammars (114 us a token against 183 us
        # with the general one at V = 49152, bench/guided.py)
        return llguidance.LLTokenizer(tok.backend_tokenizer.to_str(), n_vocab=self.vocab_size,
                                      eos_token=0 if eos is None else eos, slices=llguidance.LLTokenizer.json_slices())

    def guide(self, response_format, eos_ids) -> "Guide | None":
        """The Guide of a request with this (checked) response_format, or None without one;
        GrammarError if the schema cannot be compiled."""
        lark = response_format_grammar(response_format)
        schema = response_format_schema(response_format)
        if lark is None and schema is None:
            return None
        tokenizer = self._tokenizer()
        import llguidance
        what = "the grammar" if lark is not None else "the JSON schema"
        try:
            grammar = (llguidance.LLMatcher.grammar_from_lark(lark) if lark is not None else
                       llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS))
            start, end, answer = response_format_reasoning(response_format)
            if end is not None:
                grammar = after_free_text(start, end, answer, {"lark_grammar": lark} if lark is not None else
                                          json.loads(grammar)["grammars"][0], self._added)
        except (ValueError, RecursionError) as e:
            # llguidance's parser refuses some schemas before the matcher sees them (a nesting past its
            # recursion limit: ValueError); json.dumps refuses a nesting past Python's: the client's schema
            raise GrammarError(f"response_format: {what} cannot be compiled: {e}") from None
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"response_format: {what} cannot be compiled: {matcher.get_error()}")
        return Guide(matcher, self.vocab_size, tokenizer.eos_token, eos_ids)


def after_free_text(start, end: str, answer, constrained: dict, added: dict) -> str:
    """llguidance's grammar of free text up to the first `end` (included; with `start`, optional and
    beginning with it), then `answer` where given (right after: harmony's final channel header, reasoning
    or not), else optional whitespace, then `constrained` (one of its grammars: {"lark_grammar": ...}
    or {"json_schema": ...}). A bound's markers that are the tokenizer's added tokens (`added`: text ->
    id; QwQ's and DeepSeek-R1's </think>, gpt-oss's <|channel|>) are those tokens (lark_text). The free
    text holds no special token, so one that `end` begins with ends it."""
    opening = "" if start is None else lark_text(start, added) + " "
    pieces = added_pieces(end, added)
    if pieces[0] in added:
        free = f"free: {opening}/(?s:.*)/ {lark_text(end, added)}\n"
    else:  # lazy: the free text ends at the first occurrence of end's text (up to its first marker)
        rest = "".join(pieces[1:])
        free = (f"free: {opening}free_text {lark_text(rest, added) if rest else ''}\n"
                f"free_text[lazy]: /(?s:.*){_regex_literal(pieces[0])}/\n")
    after = "/[ \\t\\r\\n]*/" if answer is None else ""
    reasoning = f"(free {after})?" if start else f"free {after}"
    opener = "" if answer is None else lark_text(answer, added)
    head = f"start: {reasoning} {opener} @constrained\n"
    return json.dumps({"grammars": [{"lark_grammar": head + free}, dict(constrained, name="constrained")]})


def _regex_literal(text: str) -> str:
    """text as a regex that matches it alone: every character escaped by its code point."""
    return "".join(f"\\x{{{ord(c):x}}}" for c in text)


class Guide:
    """One request's grammar state: `apply(row)` masks a logits row to the tokens the grammar
    allows next, `advance(token)` takes in the token sampled from it, `ended` says the grammar
    has ended the request."""

    def __init__(self, matcher, vocab_size, grammar_eos, eos_ids):
        self._matcher = matcher
        self._vocab = vocab_size
        self._bits = np.zeros(-(-vocab_size // 32) * 4, np.uint8)  # llguidance's bitmask: 1 = allowed
        self._bias = np.empty((self._bits.size, 8), np.float32)     # the bitmask as 0 / -inf per token
        self._grammar_eos = grammar_eos  # the eos id the tokenizer view was built with
        self._eos = np.array(sorted(eos_ids), np.int64)  # the request's own eos ids
        self._eos_set = frozenset(eos_ids)
        self.ended = False
        self.error = None  # llguidance's reason, if a token the grammar refused was taken

    def apply(self, row) -> None:
        """Set every logit of `row` (float32 [V], in place) the grammar forbids to -inf. Where
        the grammar may end, the request's eos ids stay allowed (the tokenizer's eos is not
        necessarily the request's). If the penalties before left no allowed token finite
        (min_length banning eos, a bad word that is the only way on), the grammar wins: its
        allowed tokens become equally likely, so the output still parses."""
        bits = self._bits
        self._matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.size)
        if _bit(bits, self._grammar_eos):
            _set_bits(bits, [self._grammar_eos], False)
            _set_bits(bits, self._eos, True)
        # One gather of 8 floats per mask byte and one add: 21 us at V = 49152, where a
        # boolean-masked store (np.copyto where=) takes 82 us (docs/http.md, "Why llguidance").
        np.take(_BYTE_TO_BIAS, bits, axis=0, out=self._bias)
        np.add(row, self._bias.reshape(-1)[:self._vocab], out=row)
        if row.max() == NEG_INF:
            allowed = np.unpackbits(bits, count=self._vocab, bitorder="little").view(bool)
            if not allowed.any():  # the grammar is in error (advance keeps why): let eos end it
                allowed[self._eos] = True
            row[allowed] = 0.0

    def advance(self, token: int) -> None:
        """Take in the sampled `token`; an eos id, or the grammar's own end, ends the request."""
        if token in self._eos_set:
            self.ended = True
            return
        m = self._matcher
        if not m.consume_token(token):  # only after the grammar-wins fallback found nothing allowed
            self.error = m.get_error()
            log.warning("guided decoding ended a request: the grammar refused token %d: %s", token, self.error)
            self.ended = True
        elif m.is_stopped():
            self.ended = True
