"""Logprobs of characters spread over several tokens, through `dashinfer serve` on the default model
(SmolLM2-135M-Instruct, a byte-level BPE tokenizer) and the official openai client.

OpenAI documents a token's `bytes` as its UTF-8 bytes, "useful in instances where characters are
represented by multiple tokens and their byte representations must be combined": each entry's (and
each top_logprobs entry's) bytes are the token's own, as transformers' tokenizer and GPT-2's byte
alphabet spell it, the bytes of an answer in Chinese and emoji join into its text, a token that is
part of a character is named "bytes:\\xNN...", and a text completion's text_offset indexes its text.
"""
import codecs
import os
import re

import openai
import pytest

from tests.http_server import API_KEY, Reference, default_model_dir, serving
from tests.test_gguf_tokenizer import reference_bytes

# Its greedy answer (32 tokens): Chinese, full-width punctuation and emoji, ended on a whole character.
GREETING = [{"role": "user", "content": "Write a greeting in Chinese with an emoji."}]
MAX_TOKENS = 32
WIDE = re.compile(r"[\u4e00-\u9fff]")      # CJK ideographs: 3 bytes
EMOJI = re.compile(r"[\U0001F300-\U0001FAFF]")  # 4 bytes


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with serving(default_model_dir(), str(tmp_path_factory.mktemp("serve") / "serve.log"), "--api-key", API_KEY,
                 tp=1) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def reference():
    """The default model in this process, and transformers' tokenizer of its files."""
    ref = Reference(*os.path.split(default_model_dir()))
    ids, _, tops, _ = ref.generate(ref.chat_ids(GREETING), MAX_TOKENS, logprobs=True, top_logprobs=3)
    hf = ref.hf_tokenizer()
    yield ids, tops, lambda i: reference_bytes(hf, False, i), ref
    ref.close()


def _check_entries(entries, reference):
    """Each entry's token, bytes and top_logprobs are those of the reference's token ids."""
    ids, tops, token_bytes, _ = reference
    assert len(entries) == len(ids)
    for entry, token_id, top in zip(entries, ids, tops):
        assert entry.bytes == list(token_bytes(token_id)) and entry.token == _name(token_bytes(token_id)), entry
        assert [(t.token, t.bytes) for t in entry.top_logprobs] == \
            [(_name(token_bytes(j)), list(token_bytes(j))) for j, _ in top]


def _name(data: bytes) -> str:
    """The token's text, or "bytes:" and its bytes escaped where they are not UTF-8 alone."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def test_chat_bytes_join_into_the_answer(client, reference):
    answer = client.chat.completions.create(model="tiny", messages=GREETING, max_tokens=MAX_TOKENS, temperature=0,
                                            logprobs=True, top_logprobs=3)
    text = answer.choices[0].message.content
    assert WIDE.search(text) and EMOJI.search(text), text  # what this test is about
    entries = answer.choices[0].logprobs.content
    assert b"".join(bytes(e.bytes) for e in entries) == text.encode()
    assert any(e.token.startswith("bytes:") for e in entries)  # characters spread over tokens
    _check_entries(entries, reference)


def test_streamed_chat_bytes_are_the_same(client, reference):
    chunks = list(client.chat.completions.create(model="tiny", messages=GREETING, max_tokens=MAX_TOKENS,
                                                 temperature=0, logprobs=True, top_logprobs=3, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    entries = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert b"".join(bytes(e.bytes) for e in entries) == text.encode()
    _check_entries(entries, reference)


def test_text_offsets_index_the_text(client, reference):
    """text_offset: the characters of the text before each token; a token that continues a
    character starts where that character does."""
    ids, _, token_bytes, ref = reference
    answer = client.completions.create(model="tiny", prompt=ref.chat_ids(GREETING), max_tokens=MAX_TOKENS,
                                       temperature=0, logprobs=2)
    text, offsets = answer.choices[0].text, answer.choices[0].logprobs.text_offset
    assert WIDE.search(text) and EMOJI.search(text), text
    assert len(offsets) == len(ids)
    for k, offset in enumerate(offsets):
        before = codecs.getincrementaldecoder("utf-8")().decode(b"".join(token_bytes(i) for i in ids[:k]))
        assert offset == len(before) and text.startswith(before), (k, offset, before)
    assert answer.choices[0].logprobs.tokens == [_name(token_bytes(i)) for i in ids]
