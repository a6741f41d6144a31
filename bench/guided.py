"""Guided decoding: what a JSON-schema grammar costs per token, per library, against a decode step.

    PYTHONPATH=. python bench/guided.py [--passes 5] [--no-engine]

For each grammar library that imports here (llguidance, outlines-core, xgrammar) and each
vocabulary (the default model's 49152 tokens, and 151936: the same tokenizer grown to Qwen2's size
by adding 102784 tokens, each the concatenation of two of its tokens, so the token trie has the
shape of a real byte-level BPE vocabulary), it prints:
  tokenizer_ms the library's view of the tokenizer (once per model)
  compile_ms   building the grammar of SCHEMA for that tokenizer (once per request; best of --passes)
  us_per_token computing the allowed-token bitmask and advancing the matcher by one token, along
               the tokens of a document that follows SCHEMA (best pass, averaged over its tokens)
and, measured in the same run, a decode step of the default model on the in-process Engine
(batch 1, bf16) and the numpy application of a bitmask to a logits row, which every library
shares. The ratio column is us_per_token over the decode step. A library missing here is listed
as such: serving installs llguidance only (setup.cfg); the others install with pip for this run.
"""
import argparse
import ctypes
import json
import os
import time

import numpy as np

from bench.timing import best_seconds

SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "object",
                     "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 60},
                                    "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                    "vip": {"type": "boolean"}},
                     "required": ["name", "age", "vip"]},
        "items": {"type": "array", "minItems": 1,
                  "items": {"type": "object",
                            "properties": {"sku": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{4}"},
                                           "quantity": {"type": "integer", "minimum": 1},
                                           "price": {"type": "number"}},
                            "required": ["sku", "quantity", "price"]}},
        "status": {"type": "string", "enum": ["new", "paid", "shipped"]},
        "note": {"type": ["string", "null"]},
    },
    "required": ["customer", "items", "status", "note"],
}
DOCUMENT = {"customer": {"name": "Ada Lovelace of the Analytical Engine Society", "age": 36, "vip": True},
            "items": [{"sku": "ABC-1234", "quantity": 2, "price": 19.5},
                      {"sku": "XYZ-0042", "quantity": 1, "price": 250.0},
                      {"sku": "QRS-9000", "quantity": 12, "price": 3.25}],
            "status": "shipped", "note": "Leave the parcel with the neighbour if nobody answers the door."}
BIG_VOCAB = 151936


def byte_decoder() -> dict:
    """GPT-2's byte-level alphabet: printable character -> the byte it stands for."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def grow_vocabulary(tokenizer_json: str, size: int) -> str:
    """The tokenizer with new tokens (each two existing tokens joined) up to `size` ids."""
    spec = json.loads(tokenizer_json)
    vocab = spec["model"]["vocab"]
    special = {t["content"] for t in spec.get("added_tokens", [])}
    pieces = [t for t in vocab if t not in special]
    rng = np.random.default_rng(0)
    next_id = max(vocab.values()) + 1
    while next_id < size:
        a, b = rng.integers(0, len(pieces), 2)
        token = pieces[a] + pieces[b]
        if token not in vocab:
            vocab[token] = next_id
            next_id += 1
    return json.dumps(spec)


class Vocabulary:
    def __init__(self, name, tokenizer_json, size, eos):
        from tokenizers import Tokenizer
        self.name, self.json, self.size, self.eos = name, tokenizer_json, size, eos
        spec = json.loads(tokenizer_json)
        self.special = {t["id"] for t in spec.get("added_tokens", [])}
        decode = byte_decoder()
        self.strings = [""] * size
        for token, i in spec["model"]["vocab"].items():
            self.strings[i] = token
        self.bytes = [bytes(decode[c] for c in s) if i not in self.special else s.encode()
                      for i, s in enumerate(self.strings)]
        self.document = Tokenizer.from_str(tokenizer_json).encode(json.dumps(DOCUMENT)).ids


# ---- one adapter per library: compile(vocab) -> matcher factory; step(matcher, token) ----------

def llguidance_lib():
    import llguidance

    def prepare(v):
        return llguidance.LLTokenizer(v.json, n_vocab=v.size, eos_token=v.eos, slices=llguidance.LLTokenizer.json_slices())

    def compile_(tok):
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
        matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
        return matcher.deep_copy

    def stepper(v):
        bits = np.zeros(-(-v.size // 32) * 4, np.uint8)

        def step(m, token):
            m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.size)
            assert m.consume_token(token), m.get_error()
        return step, bits
    return prepare, compile_, stepper


def outlines_lib():
    import outlines_core

    def prepare(v):
        words = {}
        for i, b in enumerate(v.bytes):
            if i not in v.special and b:
                words.setdefault(b, []).append(i)
        return outlines_core.Vocabulary(v.eos, words)

    def compile_(vocab):
        regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(SCHEMA))
        index = outlines_core.Index(regex, vocab)
        return lambda: outlines_core.Guide(index)

    def stepper(v):
        words = np.zeros(-(-v.size // 32), np.int32)

        def step(g, token):
            g.write_mask_into(words.ctypes.data, words.size, 4)
            g.advance(token, return_tokens=False)
        return step, words.view(np.uint8)
    return prepare, compile_, stepper


def xgrammar_lib():
    import xgrammar

    def prepare(v):
        return xgrammar.TokenizerInfo(v.strings, xgrammar.VocabType.BYTE_LEVEL, vocab_size=v.size,
                                      stop_token_ids=[v.eos])

    def compile_(info):
        compiled = xgrammar.GrammarCompiler(info, cache_enabled=False).compile_json_schema(json.dumps(SCHEMA))
        return lambda: xgrammar.GrammarMatcher(compiled)

    def stepper(v):
        words = np.zeros((1, -(-v.size // 32)), np.int32)

        def step(m, token):
            m.fill_next_token_bitmask(words)
            assert m.accept_token(token)
        return step, words.view(np.uint8).reshape(-1)
    return prepare, compile_, stepper


LIBRARIES = {"llguidance": llguidance_lib, "outlines-core": outlines_lib, "xgrammar": xgrammar_lib}


def measure(lib, v, passes):
    """(tokenizer_ms, compile_ms, us_per_token) of one library on one vocabulary."""
    prepare, compile_, stepper = lib()
    t0 = time.perf_counter()
    prepared = prepare(v)
    tokenizer_ms = (time.perf_counter() - t0) * 1e3
    compile_ms = []
    for _ in range(passes):
        t0 = time.perf_counter()
        new_matcher = compile_(prepared)
        compile_ms.append((time.perf_counter() - t0) * 1e3)
    step, _ = stepper(v)
    best = float("inf")
    for _ in range(passes):
        m = new_matcher()
        t0 = time.perf_counter()
        for token in v.document:
            step(m, token)
        best = min(best, (time.perf_counter() - t0) / len(v.document))
    return tokenizer_ms, min(compile_ms), best * 1e6


class _FixedMask:
    """A matcher whose mask is always the same random half of the vocabulary."""

    def __init__(self, size):
        self.bits = np.random.default_rng(0).integers(0, 256, -(-size // 32) * 4).astype(np.uint8)
        self.bits[0] |= 1  # token 0 (the "eos" below) allowed: the eos substitution runs too

    def unsafe_compute_mask_ptr(self, pointer, size):
        ctypes.memmove(pointer, self.bits.ctypes.data, size)


def apply_us(size) -> float:
    """dashinfer_server.guided.Guide.apply (the mask copy from the matcher, then its application
    to a logits row) with the grammar's own cost taken out."""
    from dashinfer_server.guided import Guide
    guide = Guide(_FixedMask(size), size, 0, [1])
    rows = np.random.default_rng(1).standard_normal((2, size)).astype(np.float32)
    return best_seconds(lambda i: guide.apply(rows[i % 2]), operands=2, calls=200, budget=1.0) * 1e6


def decode_step_us(model_dir, prefix, response_format=None, tokens=120):
    """(microseconds per decode step, tokens generated) of one greedy request of up to `tokens`
    tokens on the in-process Engine, the best of 3."""
    from dashinfer_client import AsModelRuntimeConfigBuilder, ASGenerationConfigBuilder
    from dashinfer_server.engine import Engine
    engine = Engine()
    cfg = AsModelRuntimeConfigBuilder().model_name("bench").model_dir(model_dir, prefix).max_batch(1) \
        .max_length(512).build()
    engine.install_model(cfg)
    engine.start_model("bench")
    try:
        gen = ASGenerationConfigBuilder().update({"do_sample": False, "max_length": 16 + tokens,
                                                  "early_stopping": False,
                                                  "response_format": response_format})
        best = 0.0
        for _ in range(3):
            _, handle, queue = engine.start_request_ids("bench", None, list(range(100, 116)), gen)
            engine.sync_request("bench", handle)
            info = queue.RequestStatInfo()
            best = max(best, info.generate_tps)
            engine.release_request("bench", handle)
        return 1e6 / best, info.generated_token_length
    finally:
        engine.release_model("bench")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--libs", default=",".join(LIBRARIES), help="comma-separated, of " + ", ".join(LIBRARIES))
    parser.add_argument("--no-engine", action="store_true", help="skip the decode step of the default model")
    args = parser.parse_args()
    from dashinfer_client import default_model
    model_dir, prefix = default_model.ensure_default_model("bfloat16", progress=False)
    with open(os.path.join(model_dir, prefix + ".tokenizer", "tokenizer.json"), encoding="utf-8") as f:
        base = f.read()
    from dashinfer_client import DashInferModel
    eos_id = DashInferModel(model_dir, prefix).get_tokenizer().eos_token_id
    vocabs = [Vocabulary("default-49152", base, 49152, eos_id),
              Vocabulary(f"grown-{BIG_VOCAB}", grow_vocabulary(base, BIG_VOCAB), BIG_VOCAB, eos_id)]
    step, generated = (None, 0) if args.no_engine else decode_step_us(model_dir, prefix)
    print(f"document: {len(vocabs[0].document)} tokens; decode step of the default model "
          f"(Engine, batch 1, {generated} tokens): {'-' if step is None else f'{step:.0f} us'}")
    print(f"{'library':14s} {'vocab':14s} {'tokenizer_ms':>12s} {'compile_ms':>11s} {'us_per_token':>13s} "
          f"{'ratio':>7s}")
    for name in args.libs.split(","):
        for v in vocabs:
            try:
                tokenizer_ms, compile_ms, us = measure(LIBRARIES[name], v, args.passes)
            except ImportError as e:
                print(f"{name:14s} {v.name:14s} not installed ({e})")
                break
            ratio = f"{us / step:7.3f}" if step else "      -"
            print(f"{name:14s} {v.name:14s} {tokenizer_ms:12.1f} {compile_ms:11.1f} {us:13.1f} {ratio}")
            print(json.dumps({"library": name, "vocab": v.size, "tokenizer_ms": round(tokenizer_ms, 1),
                              "compile_ms": round(compile_ms, 2), "us_per_token": round(us, 2),
                              "decode_step_us": step and round(step, 1)}))
    for v in vocabs:
        us = apply_us(v.size)
        ratio = f"{us / step:7.3f}" if step else "      -"
        print(f"{'Guide.apply':14s} {v.name:14s} {'':12s} {'':11s} {us:13.1f} {ratio}")
    if step:
        guided, n = decode_step_us(model_dir, prefix, {"type": "json_schema", "json_schema": {"schema": SCHEMA}})
        print(f"decode step under SCHEMA (Engine, llguidance, {n} tokens): {guided:.0f} us, "
              f"{guided / step:.3f} x the unguided step")


if __name__ == "__main__":
    main()


