"""Builds the C kernels in native/ into dashinfer_server._native, the conversion's quantizer into
dashinfer_client.model._quantize, and the gRPC stubs of proto/dashinfer.proto into
dashinfer_client/proto/ (metadata lives in setup.cfg)."""
import glob
import os
import re
import types
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "proto")
STUB_DIR = os.path.join(HERE, "dashinfer_client", "proto")

def _settings():
    """dashinfer_client/settings.py, loaded by path: the package is not importable while it builds."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "dashinfer_settings", os.path.join(HERE, "dashinfer_client", "settings.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What the avx512 path needs (native/runtime.c's dn_isa_cpu), as /proc/cpuinfo names the flags.
AVX512_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
AVX512_LEFT_OUT = "native/avx512_left_out.c"
# The conversion's quantizer module, built apart without OpenMP (see the file), from these sources.
CONVERSION_QUANTIZE = ("native/conversion_quantize.c", "native/linear_quantize.c", "native/pyarg.c")


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The first cpu's flags (the kernels' dispatch assumes every cpu has the same)."""
    with open(cpuinfo) as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def native_sources(build_isa, flags):
    """(C files, macros) for DASHINFER_BUILD_ISA: `all` compiles every ISA variant; `native`
    leaves out the AVX-512 files (half the compile time) on a CPU that cannot run them, and
    compiles their stand-ins instead."""
    sources = [s for s in sorted(glob.glob("native/*.c")) if s not in (AVX512_LEFT_OUT, CONVERSION_QUANTIZE[0])]
    if build_isa == "all" or AVX512_FLAGS <= flags:
        return sources, []
    kept = [s for s in sources if "avx512" not in os.path.basename(s) and "vnni" not in os.path.basename(s)]
    return kept + [AVX512_LEFT_OUT], [("DN_NO_AVX512", "1")]


def native_extension():
    sources, macros = native_sources(_settings().get("DASHINFER_BUILD_ISA"), cpu_flags())
    return Extension(
        "dashinfer_server._native",
        sources=sources,
        depends=sorted(glob.glob("native/*.h")),  # a header's edit rebuilds the extension too
        define_macros=macros,
        include_dirs=["native"],
        # Baseline x86-64 code; faster paths are chosen per function (DN_TARGET_*) at run time.
        # -g0 overrides Python's -g: debug info was 40% of the build's CPU time (the decode tiles:
        # 121 s with it, 73 without) and changes no generated code.
        extra_compile_args=["-O3", "-g0", "-fopenmp", "-std=gnu11", "-fno-math-errno", "-Wall",
                            "-Wno-unused-function"],
        extra_link_args=["-fopenmp"],
    )


def conversion_quantize_extension():
    return Extension(
        "dashinfer_client.model._quantize",
        sources=list(CONVERSION_QUANTIZE),
        depends=sorted(glob.glob("native/*.h")),
        include_dirs=["native"],
        extra_compile_args=["-O3", "-g0", "-pthread", "-std=gnu11", "-fno-math-errno", "-Wall",
                            "-Wno-unused-function"],
        extra_link_args=["-pthread"],
    )


def generate_stubs():
    """proto/*.proto -> dashinfer_client/proto/*_pb2.py and *_pb2_grpc.py (grpcio-tools' protoc).

    protoc writes `import dashinfer_pb2`, which only works with the stub directory on sys.path;
    the stubs are made package-relative (`from . import dashinfer_pb2`)."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as e:
        raise RuntimeError("building dashinfer-py needs grpcio-tools (pip install grpcio-tools) to "
                           "generate the gRPC stubs from proto/") from e
    protos = sorted(glob.glob(os.path.join(PROTO_DIR, "*.proto")))
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for proto in protos:
        args = ["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{well_known}", f"--python_out={STUB_DIR}",
                f"--grpc_python_out={STUB_DIR}", proto]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
    modules = [os.path.splitext(os.path.basename(p))[0] + "_pb2" for p in protos]
    for path in glob.glob(os.path.join(STUB_DIR, "*_pb2*.py")):
        with open(path) as f:
            text = f.read()
        for module in modules:
            text = re.sub(rf"^import {module} as ", f"from . import {module} as ", text, flags=re.M)
        with open(path, "w") as f:
            f.write(text)


class BuildPy(build_py):
    def run(self):
        generate_stubs()
        super().run()


def compile_in_parallel(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                        extra_preargs=None, extra_postargs=None, depends=None):
    """CCompiler.compile with the sources of one extension compiled at once, one job per core
    (DASHINFER_BUILD_JOBS to choose): distutils compiles them one by one, and `-j` only runs
    whole extensions side by side."""
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

    def one(obj):
        src, ext = build[obj]
        self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)
    jobs = _settings().get("DASHINFER_BUILD_JOBS") or os.cpu_count() or 1
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, objects))
    return objects


class BuildExt(build_ext):
    def run(self):
        generate_stubs()  # `setup.py build_ext --inplace` is the development build
        super().run()

    def build_extensions(self):
        self.compiler.compile = types.MethodType(compile_in_parallel, self.compiler)
        super().build_extensions()


if __name__ == "__main__":  # pip's build backend runs it so; tests import native_sources
    setup(ext_modules=[native_extension(), conversion_quantize_extension()], cmdclass={"build_py": BuildPy, "build_ext": BuildExt})
