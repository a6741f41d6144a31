"""The C kernels of native/ (dashinfer_server._native), loaded with the threading policy set.

DASHINFER_ISA=portable|avx2|avx512 caps the kernel path (tests run every path on one machine).
"""
import os

# libgomp reads its wait policy once, when it is loaded with the extension. A decode step is
# hundreds of short parallel kernels, and waking a sleeping thread costs ~35 us on this VM, so
# threads spin between kernels. 30k spins last ~0.5-1 ms here: longer than the Python between
# two decode steps, so a busy engine never sleeps, yet short enough that a spinning thread soon
# yields its core to the gRPC and client threads that need it after a step (1M spins, ~30 ms,
# made a ClientEngine beside one busy process up to 25 ms a token instead of 0.3-5). An idle
# server sleeps. Measured in bench/threads.py.
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "30000"

from ._native import *  # noqa: E402,F401,F403
from . import _native  # noqa: E402

if os.environ.get("DASHINFER_ISA"):
    _native.set_isa(os.environ["DASHINFER_ISA"])
