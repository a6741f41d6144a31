"""The KV arrays of one rank: per layer, K and V of this rank's KV heads, in blocks.

Formats: AsCacheDefault stores the model's own precision (fp32 for an fp32 model, else bf16
bits); AsCacheQuantI8 int8 with a scale per token per head (symmetric); AsCacheQuantU4 uint4
(two per byte) with a scale and a zero point per token per head.

The whole pool is allocated at start_model (zero-filled, so the OS maps its pages lazily): its
size is reserved up front, so a request the pool holds never fails for lack of memory later,
while resident memory grows only with the blocks actually written (freed blocks are handed out
again first, so it settles at the peak number of live tokens). Pages are first touched by the
kernel threads of the rank that writes them, so on a multi-socket server they land on that
rank's NUMA node. Writing the whole pool at start would only move an out-of-memory failure from
a busy moment to start_model, at the price of max_batch x max_length tokens of RAM whatever the
load (1.5 GB for SmolLM2 at 32 x 2048): size the pool with kv_cache_memory_mb instead.

The arrays sit on small pages, whatever numpy would choose: numpy asks for transparent huge
pages on every array of 4 MiB or more, and a 2 MiB page would make the first write of a 24 KiB
block resident 2 MiB at once (SmolLM2's warm-up alone: 120 MB instead of 13).
"""
import mmap

import numpy as np

MODES = ("fp32", "bf16", "int8", "uint4")


def bytes_per_block(mode: str, num_layers: int, num_kv_heads: int, block_size: int,
                    head_dim: int) -> int:
    per_token_head = {"fp32": 4 * head_dim, "bf16": 2 * head_dim, "int8": head_dim + 4,
                      "uint4": head_dim // 2 + 8}[mode]
    return 2 * num_layers * num_kv_heads * block_size * per_token_head


def small_page_zeros(shape, dtype) -> np.ndarray:
    """np.zeros(shape, dtype) in its own anonymous mapping, advised not to use huge pages."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    if count == 0:
        return np.zeros(shape, dtype)
    buf = mmap.mmap(-1, count * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype, count=count).reshape(shape)


class KVCache:
    def __init__(self, mode: str, num_layers: int, num_blocks: int, num_kv_heads: int,
                 block_size: int, head_dim: int):
        if mode not in MODES:
            raise ValueError(f"unknown KV cache format {mode!r}; one of {MODES}")
        self.mode, self.num_blocks, self.block_size = mode, num_blocks, block_size
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        meta = shape[:3]
        zeros = small_page_zeros  # resident memory follows the blocks written
        self.layers = []
        for _ in range(num_layers):
            if mode == "fp32":
                arrays = dict(k_cache=zeros(shape, np.float32), v_cache=zeros(shape, np.float32))
            elif mode == "bf16":
                arrays = dict(k_cache=zeros(shape, np.uint16), v_cache=zeros(shape, np.uint16))
            elif mode == "int8":
                arrays = dict(k_cache=zeros(shape, np.int8), v_cache=zeros(shape, np.int8),
                              k_scale=zeros(meta, np.float32), v_scale=zeros(meta, np.float32))
            else:
                packed = shape[:3] + (head_dim // 2,)
                arrays = dict(k_cache=zeros(packed, np.uint8), v_cache=zeros(packed, np.uint8),
                              k_scale=zeros(meta, np.float32), v_scale=zeros(meta, np.float32),
                              k_zero=zeros(meta, np.float32), v_zero=zeros(meta, np.float32))
            self.layers.append(arrays)
