"""Incremental detokenization: the text of a growing list of token ids, handed out piece by piece.

Only the tokenizer's decode(ids, skip_special_tokens=...) is used. Each push decodes a short window
(the last tokens already handed out, for context, plus the new ones) instead of the whole list, so
a long answer costs the same per token as a short one. A character whose UTF-8 bytes span several
tokens (byte-level BPE) decodes to U+FFFD until its last byte arrives: it is held back until then,
so no piece ends inside a character; finish() hands out whatever is still held at the end.
"""

REPLACEMENT = "\ufffd"


class IncrementalDecoder:

    def __init__(self, tokenizer, skip_special_tokens=True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = []
        self.prefix = 0  # window start: ids before it are handed out and no longer decoded
        self.read = 0    # ids before it are handed out

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, ids) -> str:
        """Add ids; -> the text they complete ('' while a character is incomplete)."""
        self.ids += ids
        return self._advance(final=False)

    def finish(self) -> str:
        """The text still held back (a trailing incomplete character decodes as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final):
        if self.read == len(self.ids):
            return ""
        seen = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if not final and (text.endswith(REPLACEMENT) or len(text) <= len(seen)):
            return ""  # an incomplete character (or nothing printable yet): wait for more ids
        piece = text[len(seen):] if text.startswith(seen) else text
        self.prefix, self.read = self.read, len(self.ids)
        return piece
