"""Mutations of model files for tests/test_fuzz_model_files.py: blind ones (byte flips,
truncation, garbage) and ones aimed at each format's fields (safetensors' header length and JSON
header, GGUF's counts, lengths, types, dimensions and offsets, JSON files' values and syntax).

Each mutation takes the file's bytes and a random.Random and returns (new bytes, what it did).
GGUF fields are located by the `gguf` package's own reader on the intact file (the reference
layout); nothing here uses the code under test.
"""
import json
import struct

EVIL_U64 = (0, 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63, 2**64 - 1)
EVIL_U32 = (0, 1, 5, 13, 31, 255, 2**16, 2**31, 2**32 - 1)
EVIL_JSON = (0, -1, 1, 2**31, 2**63, 10**30, 1e308, -1e308, 0.5, "", "x", "F64", "../../etc", "/etc",
             None, True, False, [], {}, [2**40, 2**40, 2**40], [-1, 4], [[1]], {"a": 1})


# ---- blind ------------------------------------------------------------------------------------

def flip_bytes(data, rng):
    out = bytearray(data)
    n = rng.randint(1, 8)
    for _ in range(n):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out), f"{n} random bytes"


def truncate(data, rng):
    cut = rng.choice((0, 1, 7, 8, 23, len(data) // 2, len(data) - 1, rng.randrange(len(data))))
    return data[:cut], f"truncated to {cut} bytes"


def garbage_tail(data, rng):
    return data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))), "garbage appended"


def evil_word(data, rng):
    out = bytearray(data)
    at = rng.randrange(max(1, len(out) - 8))
    value = rng.choice(EVIL_U64)
    out[at:at + 8] = struct.pack("<Q", value)[:len(out) - at]
    return bytes(out), f"u64 {value} written at byte {at}"


BLIND = (flip_bytes, truncate, garbage_tail, evil_word)


# ---- safetensors ------------------------------------------------------------------------------

def _split_safetensors(data):
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _join_safetensors(header, body):
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + body


def header_length(data, rng):
    value = rng.choice(EVIL_U64 + (len(data), len(data) - 8, len(data) - 7))
    return struct.pack("<Q", value) + data[8:], f"header length {value}"


def header_entry(data, rng):
    header, body = _split_safetensors(data)
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    key = rng.choice(("dtype", "shape", "data_offsets", "data_offsets", "shape", None))
    if key is None:
        del header[name]
        return _join_safetensors(header, body), f"tensor {name} removed from the header"
    if key == "data_offsets" and rng.random() < 0.5:  # overlap another tensor, or reach past the end
        other = header[rng.choice(names)]["data_offsets"]
        begin = rng.choice((other[0], other[1] - 4, len(body) - 4, len(body)))
        size = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
        value = [begin, begin + size]
    elif key == "shape" and rng.random() < 0.5:
        value = [rng.choice((2**32, 2**62, 2**63, 0, 3)) for _ in range(rng.randint(1, 4))]
    else:
        value = rng.choice(EVIL_JSON)
    header[name][key] = value
    return _join_safetensors(header, body), f"{name}.{key} = {value!r}"


def header_whole(data, rng):
    header, body = _split_safetensors(data)
    kind = rng.choice(("list", "metadata", "not json", "deep"))
    if kind == "list":
        return _join_safetensors(list(header.items())[:2], body), "header is a JSON list"
    if kind == "metadata":
        header["__metadata__"] = rng.choice(EVIL_JSON)
        return _join_safetensors(header, body), f"__metadata__ = {header['__metadata__']!r}"
    blob = b"[" * 100000 if kind == "deep" else json.dumps(header).encode()[:-3] + b"\xff\xfe"
    return struct.pack("<Q", len(blob)) + blob + body, f"header {kind}"


SAFETENSORS = (header_length, header_entry, header_entry, header_whole)


# ---- GGUF -------------------------------------------------------------------------------------

def gguf_slots(path):
    """[(byte offset, width, what)] of every count, length, type, dimension and offset of a GGUF
    file, as gguf.GGUFReader lays it out."""
    import numpy as np
    from gguf import GGUFReader
    reader = GGUFReader(path)
    base = reader.data.__array_interface__["data"][0]
    slots = []
    for field in list(reader.fields.values()) + [t.field for t in reader.tensors]:
        for i, part in enumerate(field.parts):
            if part.dtype == np.uint8 and part.size != 1:
                continue  # a string's bytes: the blind mutations cover them
            width = part.dtype.itemsize
            start = part.__array_interface__["data"][0] - base
            for k in range(min(part.size, 4)):
                slots.append((start + k * width, width, f"{field.name} part {i}"))
    return slots


def gguf_field(data, rng, slots):
    at, width, what = rng.choice(slots)
    value = rng.choice(EVIL_U64 if width == 8 else EVIL_U32) % (1 << (8 * width))
    out = bytearray(data)
    out[at:at + width] = value.to_bytes(width, "little")
    return bytes(out), f"{what} (byte {at}) = {value}"


# ---- JSON files -------------------------------------------------------------------------------

def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list) and node:
        for i in (0, len(node) - 1):
            yield from _leaves(node[i], path + (i,))
    if path:
        yield path


def json_value(data, rng):
    doc = json.loads(data)
    paths = list(_leaves(doc))
    if not paths:
        return json.dumps(rng.choice(EVIL_JSON)).encode(), "document replaced"
    path = rng.choice(paths)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and rng.random() < 0.25:
        del parent[path[-1]]
        return json.dumps(doc).encode(), f"{'.'.join(map(str, path))} removed"
    parent[path[-1]] = value = rng.choice(EVIL_JSON)
    return json.dumps(doc).encode(), f"{'.'.join(map(str, path))} = {value!r}"


def not_json(data, rng):
    kind = rng.choice(("cut", "empty", "binary", "deep", "list", "number"))
    out = {"cut": data[:max(1, len(data) // 3)], "empty": b"", "binary": b"\xff\xfe\x00GGUF",
           "deep": b"[" * 100000, "list": b"[1, 2]", "number": b"42"}[kind]
    return out, f"JSON {kind}"


JSON = (json_value, json_value, json_value, not_json)
