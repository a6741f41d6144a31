"""Zero-filled buffers whose page size is chosen, not left to numpy.

numpy asks for transparent huge pages on every array of 4 MiB or more. For the KV cache that is
wrong: its blocks are touched one by one as requests grow, and a 2 MiB page makes the first
write of a 24 KiB block resident 2 MiB at once (SmolLM2's warm-up alone: 120 MB instead of 13).
Streamed read-mostly data (packed weights) is where huge pages pay: fewer TLB misses.
Either way pages are mapped lazily, by the process that first writes them, so they land on
that process's NUMA node.
"""
import mmap

import numpy as np


def mapped_zeros(shape, dtype, huge_pages: bool) -> np.ndarray:
    """np.zeros(shape, dtype) in its own anonymous mapping, advised to use huge pages or not."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    if count == 0:
        return np.zeros(shape, dtype)
    buf = mmap.mmap(-1, count * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge_pages else "MADV_NOHUGEPAGE", None)
    if advice is not None:
        buf.madvise(advice)
    return np.frombuffer(buf, dtype, count=count).reshape(shape)
