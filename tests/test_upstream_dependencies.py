"""What DashInfer's own scripts import beside the engine is installed with it: py-cpuinfo (its
v1.3 helper reads the CPU's flags through `import cpuinfo`), and the flags it reads agree with
the kernel path this runtime chose for the same CPU."""
import cpuinfo

from dashinfer_server import kernels as K


def test_cpuinfo_is_installed_and_agrees_with_the_kernel_path():
    flags = set(cpuinfo.get_cpu_info()["flags"])
    isa = K.supported_isa()
    if isa == "avx512":
        assert {"avx512f", "avx512bw"} <= flags
    if isa in ("avx512", "avx2"):
        assert {"avx2", "fma"} <= flags
