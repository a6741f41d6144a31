"""A GGUF file's layout checked against its size before the `gguf` package reads it.

gguf.GGUFReader trusts the counts and lengths it reads: past the end of the file its reads come
back empty instead of failing, so an array that claims 2^63 items loops for ever, and a tensor
whose data runs past the end becomes a shorter view. This walks the same header (magic, version,
counts, metadata, tensor infos) with every count, length, type and offset checked against the
bytes that are really there, in time and memory proportional to the file, and raises
ModelSerializerException naming the first thing that does not fit. A big-endian file is refused:
the reader would hand its tensors over in the wrong byte order.
"""
import os
import struct

from ..errors import ModelSerializerException

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_UINT32 = 4
MAX_DIMS = 4                # GGML_MAX_DIMS
MAX_ELEMENTS = 2**62        # far past any real tensor, and no overflow in the byte counts
DEFAULT_ALIGNMENT = 32


def check_gguf(path) -> None:
    """Raise ModelSerializerException unless `path` is a GGUF file whose header and tensor data
    fit inside it."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        _Walk(f, size, str(path)).run()


class _Walk:
    def __init__(self, f, size, path):
        self.f, self.size, self.path, self.pos = f, size, path, 0

    def fail(self, what):
        raise ModelSerializerException(f"cannot read GGUF file {self.path}: {what} (at byte {self.pos} of {self.size})")

    def take(self, n):
        if n > self.size - self.pos:
            self.fail(f"truncated: {n} bytes needed, the file ends first")
        data = self.f.read(n)
        self.pos += n
        return data

    def number(self, fmt):
        data = self.take(struct.calcsize(fmt))
        return struct.unpack("<" + fmt, data)[0]

    def string(self, what):
        length = self.number("Q")
        if length > self.size - self.pos:
            self.fail(f"truncated: {what} claims {length} bytes, more than the file holds")
        try:
            return self.take(length).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8")

    def run(self):
        if self.size < 24 or self.take(4) != b"GGUF":
            self.fail("no GGUF magic")
        version = self.number("I")
        if version & 0xFFFF == 0:  # a small version read in the wrong byte order
            # the gguf package would read its tensors in the host's order: every weight and
            # block scale byte-swapped, converted into garbage without an error
            self.fail("it is big-endian (written for a big-endian machine); convert it again on a "
                      "little-endian one (llama.cpp's converter without --bigendian)")
        if version not in (2, 3):
            self.fail(f"version {version} (readable: 2, 3)")
        tensor_count, kv_count = self.number("Q"), self.number("Q")
        if kv_count > (self.size - self.pos) // 13:  # a key length, a type and a 1-byte value at least
            self.fail(f"{kv_count} metadata entries cannot fit")
        if tensor_count > (self.size - self.pos) // 24:  # a name length, n_dims, type, offset at least
            self.fail(f"{tensor_count} tensors cannot fit")
        alignment = DEFAULT_ALIGNMENT
        for _ in range(kv_count):
            key = self.string("a metadata key")
            kind = self.number("I")
            value = self.value(kind, key)
            if key == "general.alignment":
                if kind != _UINT32 or value == 0 or value & (value - 1):
                    self.fail(f"general.alignment {value!r} is not a power of two stored as uint32")
                alignment = value
        tensors = [self.tensor_info() for _ in range(tensor_count)]
        data_start = -(-self.pos // alignment) * alignment
        self.check_data(tensors, data_start, alignment)

    def value(self, kind, key):
        if kind in _SCALARS:
            return self.number(_SCALARS[kind])
        if kind == _STRING:
            self.string(f"the string value of {key}")
            return None
        if kind == _ARRAY:
            item, count = self.number("I"), self.number("Q")
            if item == _ARRAY:
                self.fail(f"{key} is an array of arrays")
            if item not in _SCALARS and item != _STRING:
                self.fail(f"{key} has items of unknown type {item}")
            smallest = 8 if item == _STRING else struct.calcsize(_SCALARS[item])
            if count > (self.size - self.pos) // smallest:
                self.fail(f"{key} claims {count} items, more than the file holds")
            if item == _STRING:
                for _ in range(count):
                    self.string(f"an item of {key}")
            else:
                self.take(count * smallest)
            return None
        self.fail(f"{key} has unknown value type {kind}")

    def tensor_info(self):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        name = self.string("a tensor name")
        n_dims = self.number("I")
        if not 1 <= n_dims <= MAX_DIMS:
            self.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
        dims = [self.number("Q") for _ in range(n_dims)]
        kind, offset = self.number("I"), self.number("Q")
        elements = 1
        for d in dims:
            elements *= d
        if elements > MAX_ELEMENTS:
            self.fail(f"tensor {name} has dimensions {dims}")
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            self.fail(f"tensor {name} has unknown type {kind}")
        if dims[0] % block:
            self.fail(f"tensor {name}: first dimension {dims[0]} is not a multiple of its block of {block}")
        return name, offset, elements // block * block_bytes

    def check_data(self, tensors, data_start, alignment):
        end = data_start
        for name, offset, nbytes in sorted(tensors, key=lambda t: t[1]):
            if offset % alignment:
                self.fail(f"tensor {name} starts at data offset {offset}, not a multiple of {alignment}")
            if data_start + offset < end:
                self.fail(f"tensor {name} overlaps the tensor before it")
            end = data_start + offset + nbytes
            if end > self.size:
                self.fail(f"truncated: tensor {name} needs bytes up to {end}, the file ends first")
