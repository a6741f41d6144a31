"""Each token's own bytes, and how a token is named when those bytes are not text by themselves.

OpenAI's logprobs give every token its `bytes`, "the UTF-8 bytes representation of the token ...
where characters are represented by multiple tokens", so that a client joining them rebuilds the
text. Decoding one token id as text cannot give them: a byte-level BPE token that holds part of a
character (two of the three bytes of 你) decodes to U+FFFD, whose own bytes are EF BF BD. The
bytes are read from the vocabulary instead, as the tokenizer's decoder reads it:

    byte-level BPE (GPT-2, SmolLM2, Qwen2, Llama 3)  each character of the token string stands for
                                                     one byte (GPT-2's byte alphabet)
    SentencePiece byte fallback (Llama 2, Mistral)   <0xE4> is the byte E4; other pieces are their
                                                     text, the word-start marker a space
    added tokens (<|im_end|>, ...)                   their text

A token whose bytes are not UTF-8 by themselves is named "bytes:" and its bytes as \\xNN escapes
("bytes:\\xe4\\xbd"), as FastDeploy's OpenAI-compatible server names it: the name keeps the bytes
that U+FFFD loses, and cannot be taken for a token whose text is U+FFFD.

A SentencePiece decoder strips the space that starts a text, which is the first token's (its word-
start marker): joined, the tokens of an answer hold that space before the answer's text.
"""
import json
import re

from .model.gguf_tokenizer import byte_alphabet

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenBytes:
    """TokenBytes(tokenizer)(token_id) -> the token's bytes. tokenizer: a Hugging Face fast tokenizer
    or dashinfer_client.tokenizer.Tokenizer (anything with backend_tokenizer); any other is asked to
    decode the id, which names a partial character U+FFFD."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        steps = _decoder_steps(self.backend.decoder) if self.backend is not None else []
        kinds = {s["type"] for s in steps}
        self.byte_level = "ByteLevel" in kinds
        self.byte_fallback = "ByteFallback" in kinds
        # what the decoder writes for the vocabulary's spelling of a space (SentencePiece's marker)
        self.replacements = [(s["pattern"]["String"], s["content"]) for s in steps
                             if s["type"] == "Replace" and "String" in s.get("pattern", {})]
        self.replacements += [(s["replacement"], " ") for s in steps if s["type"] == "Metaspace"]
        self.of_char = {c: b for b, c in byte_alphabet().items()}
        added = self.backend.get_added_tokens_decoder() if self.backend is not None else {}
        self.added = {i: t.content for i, t in added.items()}
        self.special = {i for i, t in added.items() if t.special}  # what skip_special_tokens leaves out
        self.known = {}

    def __call__(self, token_id: int) -> bytes:
        token_id = int(token_id)
        found = self.known.get(token_id)
        if found is None:
            found = self.known[token_id] = self._bytes(token_id)
        return found

    def _bytes(self, token_id) -> bytes:
        if self.backend is None:
            return self.tokenizer.decode([token_id]).encode()
        if token_id in self.added:
            return self.added[token_id].encode()
        token = self.backend.id_to_token(token_id)
        if token is None:  # past the vocabulary (a padded logits row)
            return b""
        if self.byte_level and all(c in self.of_char for c in token):
            return bytes(self.of_char[c] for c in token)
        if self.byte_fallback and (piece := _BYTE_PIECE.fullmatch(token)):
            return bytes([int(piece.group(1), 16)])
        for spelled, text in self.replacements:
            token = token.replace(spelled, text)
        return token.encode()


def token_name(data: bytes) -> str:
    """A token's `token` string: its text, or "bytes:\\xNN..." when its bytes are not UTF-8 alone."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def _decoder_steps(decoder) -> list:
    """A tokenizers decoder as a flat list of its steps' JSON settings."""
    if decoder is None:
        return []

    def flat(step):
        return [s for inner in step["decoders"] for s in flat(inner)] if step["type"] == "Sequence" else [step]
    return flat(json.loads(decoder.__getstate__()))
