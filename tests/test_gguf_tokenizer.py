"""A GGUF's tokenizer rebuilt with `tokenizers` only (dashinfer_client/model/gguf_tokenizer.py)
against transformers' own GGUF tokenizer (AutoTokenizer with gguf_file=) on the same file: ids with
and without special tokens, text back, the chat template's output, the special tokens, each
token's own bytes (dashinfer_client/token_bytes.py, logprobs' `bytes`)."""
import os
import re
import sys

import pytest

from dashinfer_client import default_model
from dashinfer_client.model import DashInferModel, GGUFModel
from dashinfer_client.model.gguf_tokenizer import Unsupported, derived_merges, write_tokenizer_dir
from dashinfer_client.token_bytes import TokenBytes, token_name
from dashinfer_client.tokenizer import Tokenizer
from tests.gguf_builders import build_sentencepiece_gguf, build_tiny_gguf
from tests.helpers import build_tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "bench", "data", "project_docs.txt"), encoding="utf-8") as _f:
    CORPUS = [p for p in _f.read().split("\n\n") if p.strip()]
EXTRA = ["", " ", "  leading spaces, tabs\tand\nnew lines\n\n", "é, 日本語, emoji 🙂 and ß, Ελληνικά, русский",
         "control \x01 chars \u200b and a lone combining \u0301", "<|im_start|>user\nhi<|im_end|>\n",
         "<|endoftext|>x<|im_end|><|im_end|>", "<s> inside </s> text <unk>", "a <tool> call", "123456789 3.14159"]
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "2+2? 🙂"}]]


@pytest.fixture(scope="module", params=["smollm2", "tiny-gpt2", "sentencepiece"])
def gguf_path(request, tmp_path_factory):
    if request.param == "smollm2":  # byte-level BPE with merges, llama.cpp pre-tokenizer "smollm"
        return default_model.default_model_path(progress=False)
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "tiny-gpt2":  # byte-level BPE without merges: derived from the vocabulary
        return build_tiny_gguf(out / "tiny.gguf", build_tiny_model(str(out / "hf")))
    return build_sentencepiece_gguf(out / "spm.gguf")


@pytest.fixture(scope="module")
def pair(gguf_path):
    """(ours, transformers') for one GGUF file."""
    from transformers import AutoTokenizer
    ours = GGUFModel(gguf_path, "t").get_tokenizer()
    assert isinstance(ours, Tokenizer)  # built without transformers
    reference = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    return ours, reference


@pytest.mark.parametrize("special", [True, False])
def test_same_ids(pair, special):
    ours, ref = pair
    for text in CORPUS + EXTRA:
        assert ours.encode(text, add_special_tokens=special) == ref.encode(text, add_special_tokens=special), text


@pytest.mark.parametrize("skip", [True, False])
def test_same_text(pair, skip):
    ours, ref = pair
    for text in CORPUS + EXTRA:
        ids = ref.encode(text)
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text
    every_id = list(range(len(ref)))  # each token alone, specials and byte tokens included
    assert ours.batch_decode([[i] for i in every_id]) == ref.batch_decode([[i] for i in every_id])


def test_same_chat_template_and_special_tokens(pair):
    ours, ref = pair
    for chat in CHATS:
        text = ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        assert ours.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == text
        assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
    assert ours.special_tokens_map == {k: v for k, v in ref.special_tokens_map.items() if isinstance(v, str)}
    assert len(ours) == len(ref) and ours.get_vocab() == ref.get_vocab()


def reference_bytes(ref, sentencepiece: bool, token_id: int) -> bytes:
    """A token's bytes read from transformers' tokenizer of the file: an added token's text; a
    SentencePiece byte piece <0xNN> its byte, another piece its text with the word-start marker a
    space; a byte-level token each character mapped back through transformers' GPT-2 byte alphabet."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    if token_id in ref.added_tokens_decoder:
        return ref.added_tokens_decoder[token_id].content.encode()
    token = ref.convert_ids_to_tokens(token_id)
    if sentencepiece:
        piece = re.fullmatch(r"<0x([0-9A-F]{2})>", token)
        return bytes([int(piece.group(1), 16)]) if piece else token.replace("\u2581", " ").encode()
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(byte_of[c] for c in token)


def test_token_bytes(pair, gguf_path):
    """Every token's bytes are the reference's, and a text's tokens join into its UTF-8 bytes (for
    SentencePiece, with the space its decoder strips at the start), characters split over several
    tokens (日本語, 🙂 in byte-level BPE; in byte pieces without a merge) included."""
    ours, ref = pair
    sentencepiece = os.path.basename(gguf_path) == "spm.gguf"
    token_bytes = TokenBytes(ours)
    for token_id in range(len(ref)):
        assert token_bytes(token_id) == reference_bytes(ref, sentencepiece, token_id), token_id
    for text in CORPUS + EXTRA:
        ids = ref.encode(text, add_special_tokens=False)
        joined = b"".join(token_bytes(i) for i in ids)
        text = ref.decode(ids)
        assert joined == ((" " if sentencepiece and joined.startswith(b" ") else "") + text).encode(), text
    split = [i for i in ref.encode("🙂", add_special_tokens=False) if token_name(token_bytes(i)).startswith("bytes:")]
    assert split, "the emoji is one token: nothing to check"
    assert token_name(b"\xf0\x9f") == "bytes:\\xf0\\x9f" and token_name(" é".encode()) == " é"


def test_derived_merges_order():
    """transformers' order (generate_merges): the best-scored merged token first, then the longer
    left piece."""
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    assert derived_merges(tokens, [0, 0, 0, -1, -2, -0.5]) == [("ab", "c"), ("a", "bc"), ("a", "b"), ("b", "c")]


def test_gguf_converts_and_serves_its_tokenizer_without_transformers(tmp_path, monkeypatch):
    gguf_file = build_tiny_gguf(tmp_path / "tiny.gguf", build_tiny_model(str(tmp_path / "hf")))
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "torch", None)
    GGUFModel(gguf_file, "tiny").load_model().read_model_config().serialize_to_path(None, str(tmp_path / "out"))
    served = DashInferModel(str(tmp_path / "out"), "tiny").get_tokenizer()
    assert served.encode("hi é <|im_end|>") == ref.encode("hi é <|im_end|>")


def test_families_transformers_rebuilds_its_own_way_are_left_to_it(tmp_path):
    """Gemma's and Phi-3's SentencePiece GGUFs are built differently by transformers (respelled
    spaces, a normalizer): not rebuilt here, so the loader falls back to transformers."""
    from gguf import GGUFReader
    path = build_sentencepiece_gguf(tmp_path / "phi3.gguf", arch="phi3")
    with pytest.raises(Unsupported, match="phi3"):
        write_tokenizer_dir(GGUFReader(path), str(tmp_path / "out"))


@pytest.mark.parametrize("pre,pieces", [
    # llama.cpp's LLAMA3 split (GLM-4.5's glm4 too): digits in threes, the space a piece of its own
    ("llama-bpe", ["hello", "Ġ", "123", "45", "Ġworld"]), ("glm4", ["hello", "Ġ", "123", "45", "Ġworld"]),
    # Qwen2's: every digit alone
    ("qwen2", ["hello", "Ġ", "1", "2", "3", "4", "5", "Ġworld"]),
    # GPT-2's own (a kind not listed): the space joins the digits, which stay together
    ("default", ["hello", "Ġ12345", "Ġworld"]),
])
def test_the_text_splits_as_llama_cpp_splits_it_for_the_files_pre(tmp_path, pre, pieces):
    from gguf import GGUFReader
    from tokenizers import Tokenizer as Backend
    path = build_tiny_gguf(tmp_path / "t.gguf", build_tiny_model(str(tmp_path / "hf")), tokenizer_pre=pre)
    write_tokenizer_dir(GGUFReader(path), str(tmp_path / "tok"))
    backend = Backend.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    assert [p for p, _ in backend.pre_tokenizer.pre_tokenize_str("hello 12345 world")] == pieces
