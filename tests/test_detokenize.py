"""IncrementalDecoder: pieces never split a character and add up to the whole decoded text."""
import pytest

from dashinfer_client.detokenize import IncrementalDecoder
from tests.helpers import build_tiny_tokenizer


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(build_tiny_tokenizer(str(tmp_path_factory.mktemp("tok"))))


def test_pieces_hold_multibyte_characters_until_complete(byte_tokenizer):
    text = "café 日本 🚀!"
    ids = byte_tokenizer(text)["input_ids"]
    assert len(ids) == len(text.encode())  # one token per byte: characters span several tokens
    decoder = IncrementalDecoder(byte_tokenizer)
    pieces = [decoder.push([i]) for i in ids]
    assert "".join(pieces) + decoder.finish() == text
    assert not any("\ufffd" in p for p in pieces)
    start = text.encode().index("🚀".encode())
    assert pieces[start:start + 4] == ["", "", "", "🚀"]  # its fourth byte completes it


def test_a_trailing_incomplete_character_comes_out_at_finish(byte_tokenizer):
    ids = byte_tokenizer("ab日")["input_ids"][:-1]  # the last byte of 日 never arrives
    decoder = IncrementalDecoder(byte_tokenizer)
    assert [decoder.push([i]) for i in ids] == ["a", "b", "", ""]
    assert decoder.finish() == byte_tokenizer.decode(ids[2:]) != ""


def test_special_tokens_are_skipped_unless_asked(byte_tokenizer):
    ids = byte_tokenizer("hi")["input_ids"] + byte_tokenizer.convert_tokens_to_ids(["<|im_end|>"])
    assert IncrementalDecoder(byte_tokenizer).push(ids) == "hi"
    assert IncrementalDecoder(byte_tokenizer, skip_special_tokens=False).push(ids) == "hi<|im_end|>"


def test_sentencepiece_style_spaces_survive_piecewise_decoding():
    """SmolLM2's real tokenizer, one token at a time, gives the text decode gives at once."""
    from dashinfer_client import default_model
    from dashinfer_client.model import DashInferModel
    tok = DashInferModel(*default_model.ensure_default_model("bfloat16", progress=False)).get_tokenizer()
    text = "The capital of France is Paris. Ça coûte 5 €, 東京 too 🙂."
    ids = tok.encode(text, add_special_tokens=False)
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push([i]) for i in ids]
    assert "".join(pieces) + decoder.finish() == tok.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in pieces)
