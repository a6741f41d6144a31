"""Builds the C kernels in native/ into dashinfer_server._native (metadata lives in setup.cfg)."""
import glob

from setuptools import Extension, setup

native = Extension(
    "dashinfer_server._native",
    sources=sorted(glob.glob("native/*.c")),
    include_dirs=["native"],
    # Baseline x86-64 code; faster paths are chosen per function (DN_TARGET_*) at run time.
    extra_compile_args=["-O3", "-fopenmp", "-std=gnu11", "-fno-math-errno", "-Wall",
                        "-Wno-unused-function"],
    extra_link_args=["-fopenmp"],
)

setup(ext_modules=[native])
