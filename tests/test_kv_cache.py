"""kv_cache.small_page_zeros: the zeroed buffers the KV cache is allocated in, on small pages."""
import numpy as np

from dashinfer_server.kv_cache import small_page_zeros


def test_small_page_zeros_is_a_writable_zeroed_array_of_the_shape():
    for shape, dtype in (((3, 5), np.float32), ((4, 1 << 20), np.uint16), ((1 << 22,), np.int8), ((0, 4), np.int8)):
        a = small_page_zeros(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert not a.any()
        if a.size:
            a.reshape(-1)[-1] = 7
            assert a.reshape(-1)[-1] == 7


def test_small_pages_keep_a_first_write_small():
    """One byte written into a fresh 8 MiB small-page buffer makes one 4 KiB page resident, not
    a 2 MiB huge page (what numpy's own zeros may do)."""
    def rss_kb():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    bufs = [small_page_zeros((8 << 20,), np.uint8) for _ in range(16)]
    before = rss_kb()
    for b in bufs:
        b[5 << 20] = 1
    assert rss_kb() - before < 16 * 256  # 16 huge pages would be 32768 KiB
