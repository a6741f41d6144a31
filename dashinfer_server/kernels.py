"""The C kernels of native/ (dashinfer_server._native), loaded with the threading policy set.

DASHINFER_ISA=portable|avx2|avx512 caps the kernel path (tests run every path on one machine).
"""
import os

# libgomp reads its wait policy once, when it is loaded with the extension. A decode step is
# hundreds of short parallel kernels, and waking a sleeping thread costs ~35 us on this VM, so
# threads spin between kernels; after ~GOMP_SPINCOUNT spins (a few ms) they sleep, so an idle
# server does not burn its cores. Measured in bench/threads.py.
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "1000000"

from ._native import *  # noqa: E402,F401,F403
from . import _native  # noqa: E402

if os.environ.get("DASHINFER_ISA"):
    _native.set_isa(os.environ["DASHINFER_ISA"])
