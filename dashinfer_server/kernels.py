"""The C kernels of native/ (dashinfer_server._native), loaded by load() with the threading policy set.

The load-order rule: libgomp reads its settings (OMP_NUM_THREADS, the wait policy below) once,
when it is loaded with the extension, so a server rank first binds itself to its NUMA node
(group.init_group -> topology) and only then calls load(); the in-process Engine loads in its
LocalGroup. Importing this module loads nothing: import it anywhere, and its kernels
(K.linear, K.attention, ...) exist once load() has run; using one before is a KernelsNotLoaded
error that says so.

DASHINFER_ISA=portable|avx2|avx512 caps the kernel path (tests run every path on one machine).
The build may lack the avx512 path (DASHINFER_BUILD_ISA=native on a CPU without it): load() then
warns on a CPU that could run it, and the avx2 path serves.
DASHINFER_AMX=off|tiles|emulated: how bf16 GEMMs of 5 rows or more run; by default on AMX tiles
where the CPU has them, else off (the ISA path's kernels). `emulated` runs the AMX driver with the
tile multiply in plain C on any CPU (slow: for tests on CPUs without AMX).
"""
import importlib
import logging
import os
import sys

from dashinfer_client import settings


log = logging.getLogger("dashinfer_server")


class KernelsNotLoaded(RuntimeError):
    """A kernel was used before dashinfer_server.kernels.load()."""


_native = None  # the extension module, once loaded


def load():
    """Load the kernels once (later calls return at once); returns this module. Call it after
    the process is placed (topology.place_rank): the OpenMP runtime keeps the settings it
    finds now."""
    global _native
    if _native is not None:
        return sys.modules[__name__]
    # A decode step is hundreds of short parallel kernels, and waking a sleeping thread costs
    # ~35 us on this VM, so threads spin between kernels. 30k spins last ~0.5-1 ms here: longer
    # than the Python between two decode steps, so a busy engine never sleeps, yet short enough
    # that a spinning thread soon yields its core to the gRPC and client threads that need it
    # after a step (1M spins, ~30 ms, made a ClientEngine beside one busy process up to 25 ms a
    # token instead of 0.3-5). An idle server sleeps. Measured in bench/threads.py.
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "30000"
    native = importlib.import_module("._native", __package__)
    globals().update({name: getattr(native, name) for name in dir(native) if not name.startswith("_")})
    if native.cpu_isa() != native.supported_isa():
        log.warning("this CPU runs the %s kernels, but this build left them out (DASHINFER_BUILD_ISA="
                    "native on a CPU without them): the %s path serves; reinstall here, or with "
                    "DASHINFER_BUILD_ISA=all, to use them", native.cpu_isa(), native.supported_isa())
    if settings.get("DASHINFER_ISA"):
        native.set_isa(settings.get("DASHINFER_ISA"))
    if settings.get("DASHINFER_AMX"):
        native.set_amx(settings.get("DASHINFER_AMX"))
    _native = native
    return sys.modules[__name__]


def loaded() -> bool:
    return _native is not None


def __getattr__(name):
    """Only called for names the module lacks: a kernel before load(), or a real typo."""
    if _native is None and not name.startswith("__"):
        raise KernelsNotLoaded(f"dashinfer_server.kernels.{name} used before kernels.load(): load "
                               f"the kernels once the process is placed (see the module's docstring)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
