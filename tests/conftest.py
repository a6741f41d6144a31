import os

import pytest

from dashinfer_server import kernels as K

# the configured thread count throughout, so runs compare bit for bit (cpu_share.py)
os.environ.setdefault("DASHINFER_ADAPTIVE_THREADS", "0")
K.load()  # tests run where pytest started: nothing to place first

_ORDER = ("portable", "avx2", "avx512")
# Every kernel path this CPU can run: tests cover all of them on one machine.
ISAS = _ORDER[: _ORDER.index(K.supported_isa()) + 1]


@pytest.fixture(params=ISAS)
def isa(request):
    """Run the test on one kernel path, then restore the best one."""
    K.set_isa(request.param)
    yield request.param
    K.set_isa(K.supported_isa())
