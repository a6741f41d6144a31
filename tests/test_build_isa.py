"""DASHINFER_BUILD_ISA: which C files setup.py compiles for a CPU, and the runtime's view of a
build that left the avx512 path out. The CPU's flags come from the kernel (/proc/cpuinfo) and,
for other CPUs, from flag lists of real machines; the C side detects with cpuid."""
import importlib.util
import logging
import os

import pytest

from dashinfer_server import kernels as K

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AVX512_FILES = {"native/attention_decode_avx512.c", "native/attention_prefill_avx512.c",
                "native/attention_prefill_dpbf16_avx512.c",
                "native/linear_avx512.c", "native/linear_avx512_gemv.c",
                "native/linear_mxfp4_avx512.c", "native/linear_q8_vnni.c"}
# /proc/cpuinfo flags (the ones that matter here) of a Sapphire Rapids Xeon, an AMD EPYC 7003
# (Zen 3: AVX2, no AVX-512) and a Skylake-SP Xeon (AVX-512 without BF16: the avx2 path)
SAPPHIRE_RAPIDS = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw",
                   "avx512vl", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"}
ZEN3 = {"sse4_2", "avx", "avx2", "fma", "f16c", "vaes", "vpclmulqdq"}
SKYLAKE_SP = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}


@pytest.fixture(scope="module")
def setup_py():
    spec = importlib.util.spec_from_file_location("dashinfer_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    cwd = os.getcwd()
    os.chdir(ROOT)  # setup.py globs native/ relative to the checkout, as pip runs it
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        os.chdir(cwd)


def _every_c_file():
    """The kernels' extension's candidates: every C file but the conversion quantizer's module."""
    return {f"native/{name}" for name in os.listdir(os.path.join(ROOT, "native"))
            if name.endswith(".c") and name != "conversion_quantize.c"}


def test_native_build_on_an_avx512_bf16_cpu_compiles_every_variant(setup_py):
    sources, macros = setup_py.native_sources("native", SAPPHIRE_RAPIDS)
    assert set(sources) == _every_c_file() - {"native/avx512_left_out.c"}
    assert macros == []


@pytest.mark.parametrize("flags", [ZEN3, SKYLAKE_SP], ids=["zen3", "skylake-sp"])
def test_native_build_without_the_avx512_path_leaves_its_files_out(setup_py, flags):
    sources, macros = setup_py.native_sources("native", flags)
    assert set(sources) == _every_c_file() - AVX512_FILES
    assert macros == [("DN_NO_AVX512", "1")]


def test_all_compiles_every_variant_on_any_cpu(setup_py):
    sources, macros = setup_py.native_sources("all", ZEN3)
    assert set(sources) == _every_c_file() - {"native/avx512_left_out.c"}
    assert macros == []


def test_the_conversion_quantizer_is_built_without_openmp(setup_py):
    """Loading it must not start libgomp in a process not yet placed (native/conversion_quantize.c)."""
    ext = setup_py.conversion_quantize_extension()
    assert ext.name == "dashinfer_client.model._quantize"
    assert set(ext.sources) == {"native/conversion_quantize.c", "native/linear_quantize.c", "native/pyarg.c"}
    assert not any("openmp" in arg for arg in ext.extra_compile_args + ext.extra_link_args)
    assert "-fopenmp" in setup_py.native_extension().extra_compile_args


def test_the_build_has_what_this_cpu_runs(setup_py):
    """This checkout was built here (natively or with `all`): the path the kernels take is the
    best the CPU's flags allow, as the kernel reports them."""
    flags = setup_py.cpu_flags()
    expected = ("avx512" if setup_py.AVX512_FLAGS <= flags
                else "avx2" if {"avx2", "fma"} <= flags else "portable")
    assert K.cpu_isa() == expected
    assert K.supported_isa() == expected


class _BuiltWithoutAvx512:
    """The extension as a native build on an AVX2 machine looks, run on an AVX-512 BF16 CPU."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def cpu_isa(self):
        return "avx512"

    def supported_isa(self):
        return "avx2"


def test_load_warns_when_the_build_lacks_a_path_this_cpu_runs(monkeypatch, caplog):
    real = K._native
    for name in ("_native", "cpu_isa", "supported_isa"):  # load() rebinds them: restored after
        monkeypatch.setattr(K, name, getattr(K, name))
    monkeypatch.setattr(K, "_native", None)
    monkeypatch.setattr(K.importlib, "import_module", lambda name, package=None: _BuiltWithoutAvx512(real))
    with caplog.at_level(logging.WARNING, logger="dashinfer_server"):
        K.load()
    assert any("avx512 kernels" in r.getMessage() and "DASHINFER_BUILD_ISA=all" in r.getMessage()
               for r in caplog.records)
