import numpy as np

from dashinfer_server.memory import huge_zeros


def test_huge_zeros_is_a_writable_zeroed_array_of_the_shape():
    for shape, dtype in (((3, 5), np.float32), ((4, 1 << 20), np.uint16), ((1 << 22,), np.int8)):
        a = huge_zeros(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert not a.any()
        a[-1] = 7
        assert a.reshape(-1)[-1] == 7
