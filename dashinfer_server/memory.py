"""Large buffers backed by transparent huge pages.

The KV cache is read in blocks scattered over gigabytes and the weights are streamed every
step: with 4 KiB pages both miss the TLB constantly. Where THP is in `madvise` mode (the usual
default) a buffer must ask for huge pages itself. Pages are still touched lazily, by the
process that first writes them, so they land on that process's NUMA node.
"""
import mmap

import numpy as np

HUGE_PAGE = 2 << 20


def huge_zeros(shape, dtype) -> np.ndarray:
    """np.zeros(shape, dtype) in an anonymous mapping advised to use huge pages."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes < HUGE_PAGE:
        return np.zeros(shape, dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(buf, dtype, count=nbytes // np.dtype(dtype).itemsize).reshape(shape)
