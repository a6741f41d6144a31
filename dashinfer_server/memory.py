"""Zero-filled buffers on small pages, whatever numpy would choose.

numpy asks for transparent huge pages on every array of 4 MiB or more. For the KV cache that is
wrong: its blocks are touched one by one as requests grow, and a 2 MiB page makes the first
write of a 24 KiB block resident 2 MiB at once (SmolLM2's warm-up alone: 120 MB instead of 13).
Pages are mapped lazily, by the process that first writes them, so they land on that process's
NUMA node.
"""
import mmap

import numpy as np


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
