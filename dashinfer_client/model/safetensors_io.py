"""safetensors without torch: read by mmap into zero-copy numpy views, write with a fixed layout.

Layout of a file: 8-byte little-endian header length, a JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the raw
data; offsets are relative to the end of the header. bf16 has no numpy dtype: it is read and written
as uint16 bit patterns (dashinfer_client.dtypes converts); fp8 e4m3 as uint8 bit patterns
(fp8.py dequantizes them).
"""
import json
import math
import mmap
import os
import struct

import numpy as np

from ..errors import ModelSerializerException

# safetensors dtype code -> numpy storage dtype (BF16 stored as its uint16 bits).
NUMPY_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
    "F8_E4M3": np.uint8,
}
# dtype codes whose numpy storage dtype another code shares: never guessed from an array
_BITS_ONLY = ("BF16", "F8_E4M3")
# dtypes the format has that this reader refuses, with why
_REFUSED = {"F8_E5M2": "fp8 e5m2 is not supported (block-wise FP8 checkpoints store F8_E4M3)"}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit


def itemsize(dtype_code):
    return np.dtype(NUMPY_DTYPES[dtype_code]).itemsize


class SafetensorsFile:
    """One .safetensors file, mapped read-only. get(name) returns a view into the mapping."""

    def __init__(self, path):
        self.path = str(path)
        try:
            size = os.path.getsize(self.path)
        except OSError as e:
            raise ModelSerializerException(f"cannot open safetensors file {self.path}: {e}") from None
        if size < 8:
            raise ModelSerializerException(
                f"truncated safetensors file {self.path}: {size} bytes, not even the 8-byte header length")
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (header_len,) = struct.unpack("<Q", self._map[:8])
        if header_len > _MAX_HEADER:
            raise ModelSerializerException(
                f"bad safetensors header in {self.path}: header length {header_len} is implausible")
        if 8 + header_len > size:
            raise ModelSerializerException(
                f"truncated safetensors file {self.path}: header needs {8 + header_len} bytes, file has {size}")
        try:
            header = json.loads(self._map[8:8 + header_len].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise ModelSerializerException(f"bad safetensors header in {self.path}: not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise ModelSerializerException(f"bad safetensors header in {self.path}: not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        self._data_start = 8 + header_len
        data_size = size - self._data_start
        self._entries = {}
        for name, info in header.items():
            self._entries[name] = self._check_entry(name, info, data_size)

    def _check_entry(self, name, info, data_size):
        where = f"tensor '{name}' in {self.path}"
        try:
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ModelSerializerException(f"bad safetensors header: {where} lacks dtype/shape/data_offsets") from None
        if dtype in _REFUSED:
            raise ModelSerializerException(f"{where} has dtype {dtype}: {_REFUSED[dtype]}")
        if dtype not in NUMPY_DTYPES:
            raise ModelSerializerException(f"bad safetensors header: {where} has unknown dtype {dtype!r}")
        if not all(isinstance(d, int) and d >= 0 for d in shape) or not (isinstance(begin, int) and isinstance(end, int)):
            raise ModelSerializerException(f"bad safetensors header: {where} has a malformed shape or offsets")
        nbytes = math.prod(shape) * itemsize(dtype)
        if not 0 <= begin <= end or end - begin != nbytes:
            raise ModelSerializerException(
                f"bad safetensors header: {where} has offsets [{begin}, {end}] for {nbytes} bytes of {dtype}{shape}")
        if end > data_size:
            raise ModelSerializerException(
                f"truncated safetensors file: {where} ends at data byte {end}, the file holds only {data_size}")
        return dtype, tuple(shape), begin

    def keys(self):
        return list(self._entries)

    def __contains__(self, name):
        return name in self._entries

    def info(self, name):
        """(dtype code, shape) of a tensor without touching its data."""
        dtype, shape, _ = self._entry(name)
        return dtype, shape

    def get(self, name):
        """Read-only numpy view of the tensor (BF16 -> uint16 bits, F8_E4M3 -> uint8 bits)."""
        dtype, shape, begin = self._entry(name)
        np_dtype = NUMPY_DTYPES[dtype]
        count = math.prod(shape)
        return np.frombuffer(self._map, dtype=np_dtype, count=count, offset=self._data_start + begin).reshape(shape)

    def _entry(self, name):
        try:
            return self._entries[name]
        except KeyError:
            raise ModelSerializerException(f"tensor '{name}' is not in {self.path}") from None


class ShardedSafetensors:
    """A checkpoint split over several files by a model.safetensors.index.json: same interface as one file."""

    def __init__(self, index_path):
        self.path = str(index_path)
        try:
            with open(self.path) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelSerializerException(f"bad safetensors index {self.path}: {e!r}") from None
        folder = os.path.dirname(self.path)
        self._files = {}
        self._where = {}
        for name, shard in weight_map.items():
            if shard not in self._files:
                shard_path = os.path.join(folder, shard)
                if not os.path.exists(shard_path):
                    raise ModelSerializerException(
                        f"safetensors index {self.path} names shard {shard} (for tensor '{name}'), which is missing")
                self._files[shard] = SafetensorsFile(shard_path)
            if name not in self._files[shard]:
                raise ModelSerializerException(
                    f"safetensors index {self.path} places tensor '{name}' in {shard}, which does not hold it")
            self._where[name] = self._files[shard]

    def keys(self):
        return list(self._where)

    def __contains__(self, name):
        return name in self._where

    def info(self, name):
        return self._file(name).info(name)

    def get(self, name):
        return self._file(name).get(name)

    def _file(self, name):
        try:
            return self._where[name]
        except KeyError:
            raise ModelSerializerException(f"tensor '{name}' is not in {self.path}") from None


class SafetensorsWriter:
    """Writes a file whose header is fixed up front, then each tensor by name in any order.

    The layout is known before any data is computed, so a converter can stream: one tensor in memory
    at a time, written at its offset. Tensors are laid out by decreasing item size, so every tensor
    starts at a multiple of its own item size (aligned numpy views when mapped again); the library
    forbids gaps between tensors, so this is the best alignment the format allows.
    """

    def __init__(self, path, layout, metadata=None):
        """layout: iterable of (name, dtype code, shape); metadata: {str: str} or None."""
        self.path = str(path)
        blob, self._slots, data_bytes = _plan(list(layout), metadata, self.path)
        self._data_start = 8 + len(blob)
        self.size = self._data_start + data_bytes
        self._pending = set(self._slots)
        self._file = open(self.path, "wb")
        self._file.write(struct.pack("<Q", len(blob)) + blob)
        self._file.truncate(self.size)

    def write(self, name, array):
        dtype, shape, offset = self._slots[name]
        array = np.asarray(array)
        if array.dtype != np.dtype(NUMPY_DTYPES[dtype]) or array.shape != shape:
            raise ValueError(f"tensor '{name}' for {self.path}: expected {dtype}{list(shape)}, "
                             f"got {array.dtype}{list(array.shape)}")
        self._file.seek(self._data_start + offset)
        self._file.write(np.ascontiguousarray(array).data)
        self._pending.discard(name)

    def close(self):
        """Close the file; raises if a tensor of the layout was never written."""
        self._file.close()
        if self._pending:
            raise ValueError(f"{self.path}: tensors never written: {sorted(self._pending)[:5]}")

    def abort(self):
        """Close the file after a failure (the caller removes it)."""
        try:
            self._file.close()
        except OSError:  # flushing what the failure left buffered fails the same way
            pass


def planned_size(layout, metadata=None):
    """The exact size of the file SafetensorsWriter(path, layout, metadata) writes, header included."""
    blob, _, data_bytes = _plan(list(layout), metadata, "the planned file")
    return 8 + len(blob) + data_bytes


def _plan(layout, metadata, where):
    """(header bytes, {name: (dtype, shape, offset)}, data bytes) of a layout."""
    names = [name for name, _, _ in layout]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate tensor names in the layout of {where}")
    order = sorted(range(len(layout)), key=lambda i: -itemsize(layout[i][1]))  # stable sort
    header, slots, offset = {}, {}, 0
    for i in order:
        name, dtype, shape = layout[i]
        nbytes = math.prod(shape) * itemsize(dtype)
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + nbytes]}
        slots[name] = (dtype, tuple(int(d) for d in shape), offset)
        offset += nbytes
    if metadata:
        header = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}, **header}
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-(8 + len(blob)) % 8)  # data starts 8-aligned, as the library writes it
    return blob, slots, offset


def save_file(tensors, path, dtypes=None, metadata=None):
    """Write {name: array} in one go. dtypes: {name: code} where the numpy dtype is ambiguous (BF16, F8_E4M3)."""
    codes = {v: k for k, v in NUMPY_DTYPES.items() if k not in _BITS_ONLY}
    dtypes = dtypes or {}
    layout = [(name, dtypes.get(name) or codes[np.dtype(a.dtype).type], a.shape) for name, a in tensors.items()]
    writer = SafetensorsWriter(path, layout, metadata)
    for name, a in tensors.items():
        writer.write(name, a)
    writer.close()


# A page fault on a file mapping maps the cached pages around it too (the kernel's fault-around,
# 64 KiB by default): reading a tensor maps the tail of the one before it and the head of the one
# after, so the pages dropped with a tensor reach that far on both sides (a later read of a
# neighbour faults its pages back in from the page cache). Where the page cache holds large folios
# the kernel can map more than that (1.25 MiB seen): what is left is a neighbour's, dropped with it.
FAULT_AROUND = 64 << 10


def drop_mapped_pages(t: np.ndarray) -> None:
    """Unmap the pages under `t`, and FAULT_AROUND beyond either end, from this process if it
    views a read-only file mapping (a later read faults them back in from the page cache);
    anything else is left alone."""
    base = t
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap) or t.nbytes == 0:
        return
    start = np.frombuffer(base, np.uint8).ctypes.data
    lo = max(0, (t.ctypes.data - start - FAULT_AROUND) // mmap.PAGESIZE * mmap.PAGESIZE)
    hi = min(len(base), -(-(t.ctypes.data - start + t.nbytes + FAULT_AROUND) // mmap.PAGESIZE) * mmap.PAGESIZE)
    base.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
