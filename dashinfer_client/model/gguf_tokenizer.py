"""A GGUF file's tokenizer and chat template, written as a Hugging Face tokenizer directory.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary, merges, token types and special
token ids as `tokenizer.ggml.*` metadata. This module rebuilds the `tokenizers` pipeline those
describe, with `tokenizers` only (no transformers, no torch), and writes tokenizer.json,
tokenizer_config.json and chat_template.jinja, which dashinfer_client/tokenizer.py then reads.
The result encodes and decodes as transformers' own GGUF tokenizer does (tests/test_gguf_tokenizer.py).

Two vocabulary kinds are built: "gpt2" (byte-level BPE: SmolLM2, Qwen2, Llama 3) and "llama"
(SentencePiece-style BPE with byte fallback: Llama 2, Mistral, TinyLlama). Any other kind raises
`Unsupported`, and the loader falls back to transformers (the [convert] extra). A file without a
tokenizer (has_tokenizer) converts without one.
"""
import json
import os

# llama.cpp's token types (gguf.TokenType)
_CONTROL, _USER_DEFINED = 3, 4
_SPECIAL_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                "pad_token": "padding_token_id"}

# How text is split before the merges, by `tokenizer.ggml.pre` (the merges were learned on these
# pieces). A kind not listed keeps GPT-2's own split (ByteLevel with its regex): "default",
# "gpt2", "smollm" and others whose split is GPT-2's.
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "smaug-bpe": _LLAMA3, "dbrx": _LLAMA3,
          "glm4": _LLAMA3, "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2}  # glm4: GLM-4.5's, llama.cpp's CHATGLM4


# Families whose SentencePiece vocabulary transformers rebuilds its own way (Gemma's respelled
# spaces and merge order, Phi-3's normalizer): theirs to read.
SENTENCEPIECE_OWN_WAY = ("gemma", "gemma2", "gemma3", "phi3")


class Unsupported(ValueError):
    """The file's tokenizer kind is not one this module builds."""


def byte_alphabet():
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the
    others (controls, space, ...) take the characters from U+0100 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelled, extra = {}, 0
    for b in range(256):
        if b in keep:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return spelled


def read_metadata(reader) -> dict:
    """The `tokenizer.*` fields of a gguf.GGUFReader as Python values (lists for arrays)."""
    from gguf import GGUFValueType
    out = {}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or not field.types:
            continue
        kind = field.types[-1]

        def value(i, kind=kind, field=field):
            part = field.parts[i]
            return bytes(part).decode("utf-8") if kind == GGUFValueType.STRING else part[0].item()
        if field.types[0] == GGUFValueType.ARRAY:
            out[key[len("tokenizer."):]] = [value(i) for i in field.data]
        else:
            out[key[len("tokenizer."):]] = value(field.data[0])
    return out


def derived_merges(tokens, scores):
    """Merges for a vocabulary that lists none: every split of a token into two tokens of the
    vocabulary, the best-scored merged token first (then the longer left, the longer right piece;
    ties keep the vocabulary's order, a token's own splits ordered by the ids of their pieces)."""
    ids = {t: i for i, t in enumerate(tokens)}
    score_of = dict(zip(tokens, scores))
    found = []
    for token, score in score_of.items():
        pairs = [(token[:cut], token[cut:]) for cut in range(1, len(token))
                 if token[:cut] in ids and token[cut:] in ids]
        pairs.sort(key=lambda p: (ids[p[0]], ids[p[1]]))
        found += [(left, right, score) for left, right in pairs]
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def build(meta: dict):
    """(tokenizers.Tokenizer, tokenizer_config dict) from read_metadata()'s values."""
    kind = meta.get("ggml.model")
    if kind == "gpt2":
        backend = _byte_level(meta)
    elif kind == "llama":
        backend = _sentencepiece(meta)
    else:
        raise Unsupported(f"GGUF tokenizer model {kind!r} (this runtime builds 'gpt2' and 'llama' ones)")
    tokens = meta["ggml.tokens"]
    config = {"tokenizer_class": "TokenizersBackend", "clean_up_tokenization_spaces": False}
    for name, key in _SPECIAL_IDS.items():
        index = meta.get(f"ggml.{key}")
        if index is not None and 0 <= index < len(tokens):
            config[name] = tokens[index]
    _add_marked_tokens(backend, meta, config)
    # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise
    add_bos = meta.get("ggml.add_bos_token", kind == "llama")
    add_eos = meta.get("ggml.add_eos_token", False)
    _set_post_processor(backend, config, add_bos, add_eos)
    return backend, config


def _byte_level(meta):
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    spelled = byte_alphabet()
    alphabet = set(spelled.values())
    # a token written in plain UTF-8 (not in the byte alphabet) is re-spelled byte by byte
    vocab = {t if set(t) <= alphabet else "".join(spelled[b] for b in t.encode("utf-8")): i
             for i, t in enumerate(meta["ggml.tokens"])}
    backend = Tokenizer(BPE(vocab=vocab, merges=_merges(meta), dropout=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False))
    split = SPLITS.get(meta.get("ggml.pre"))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                  use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece(meta):
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    vocab = {t: i for i, t in enumerate(meta["ggml.tokens"])}
    backend = Tokenizer(BPE(vocab=vocab, merges=_merges(meta), fuse_unk=True, byte_fallback=True, dropout=None))
    # a word-start marker before the text's first word only; spaces become the marker
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
    return backend


def _merges(meta):
    if "ggml.merges" in meta:
        return [tuple(m.split(" ")) for m in meta["ggml.merges"]]
    tokens = meta["ggml.tokens"]
    return derived_merges(tokens, meta.get("ggml.scores") or [0.0] * len(tokens))


def _add_marked_tokens(backend, meta, config):
    """Control tokens (and the named special ones) become special added tokens, user-defined ones
    plain added tokens: both are then matched whole in a text instead of being cut into pieces.
    In a byte-level vocabulary a control token outside the byte alphabet is a mislabel of the
    file's converter and is left alone (adding it would grow the vocabulary past the model's)."""
    from tokenizers import AddedToken
    tokens, types = meta["ggml.tokens"], meta.get("ggml.token_type") or []
    alphabet = set(byte_alphabet().values()) if meta.get("ggml.model") == "gpt2" else None
    vocab = backend.get_vocab()
    control = [t for t, kind in zip(tokens, types) if kind == _CONTROL and (alphabet is None or set(t) <= alphabet)]
    named = [config[k] for k in _SPECIAL_IDS if k in config and config[k] in vocab]
    special = list(dict.fromkeys(control + named))
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    user = [t for t, kind in zip(tokens, types) if kind == _USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _set_post_processor(backend, config, add_bos, add_eos):
    from tokenizers import processors
    bos = config.get("bos_token") if add_bos else None
    eos = config.get("eos_token") if add_eos else None
    single = " ".join(([f"{bos}:0"] if bos else []) + ["$A:0"] + ([f"{eos}:0"] if eos else []))
    pair = single + " " + " ".join(([f"{bos}:1"] if bos else []) + ["$B:1"] + ([f"{eos}:1"] if eos else []))
    specials = [(t, backend.token_to_id(t)) for t in dict.fromkeys(x for x in (bos, eos) if x)]
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def has_tokenizer(reader) -> bool:
    """Whether a gguf.GGUFReader's file carries a tokenizer: llama.cpp's "none" kind, or no kind
    and no vocabulary at all, is a model without one (it takes and gives token ids)."""
    kind = reader.fields.get("tokenizer.ggml.model")
    if kind is None or not kind.types:
        return "tokenizer.ggml.tokens" in reader.fields
    return bytes(kind.parts[kind.data[0]]) != b"none"


def write_tokenizer_dir(reader, out_dir) -> None:
    """Write the tokenizer directory of a gguf.GGUFReader's file into out_dir; Unsupported when
    its tokenizer kind is not built here."""
    meta = read_metadata(reader)
    if "ggml.tokens" not in meta:
        raise Unsupported("the GGUF file carries no tokenizer (no tokenizer.ggml.tokens)")
    arch = reader.fields.get("general.architecture")
    arch = bytes(arch.parts[arch.data[0]]).decode("utf-8") if arch is not None else None
    if meta.get("ggml.model") == "llama" and arch in SENTENCEPIECE_OWN_WAY:
        raise Unsupported(f"the SentencePiece vocabulary of a {arch} GGUF (transformers rebuilds it its own way)")
    backend, config = build(meta)
    os.makedirs(out_dir, exist_ok=True)
    backend.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    template = meta.get("chat_template")
    if template:
        with open(os.path.join(out_dir, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template)
