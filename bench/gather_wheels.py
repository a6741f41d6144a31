"""Download the wheels a server without internet needs to install this package, into a folder
for bench/server_table.py --wheels (run this where PyPI is reachable, carry the folder over).

    python bench/gather_wheels.py [--dest .wheels] [--python-version 3.12] [--glibc 2.34]

What pip fetches: setup.cfg's install_requires (grpcio, protobuf, mpich, mpi4py, gguf,
llguidance, fastapi, uvicorn, ... and their dependencies), the build's requirements from
pyproject.toml (setuptools, wheel, grpcio-tools) and psutil (the benches' RSS figures), as
binary wheels for that Python on x86-64 Linux. Not torch or transformers: the server's own are
the reference (bench/hf_generate.py), and the venv server_table.py makes sees them.
"""
import argparse
import configparser
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what the benches import beyond install_requires, torch and transformers: bench/server_table.py
# installs these beside the package (engine.py --ranks reads the ranks' RSS with psutil)
BENCH_PACKAGES = ["psutil"]


def requirements() -> list:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    runtime = [line.strip() for line in cfg["options"]["install_requires"].splitlines()
               if line.strip() and not line.strip().startswith("#")]
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        build = re.findall(r'"([^"]+)"', re.search(r"requires\s*=\s*\[([^\]]*)\]", f.read()).group(1))
    return runtime + build + BENCH_PACKAGES


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dest", default=os.path.join(ROOT, ".wheels"))
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--glibc", default="2.34", help="the server's glibc: wheels for it and older ones")
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "pip", "download", "--dest", args.dest, "--only-binary=:all:",
           "--python-version", args.python_version, "--implementation", "cp"]
    # every manylinux tag up to the server's glibc (pip does not widen one tag to the older ones)
    newest = int(args.glibc.split(".")[1])
    for tag in [f"manylinux_2_{minor}_x86_64" for minor in range(newest, 4, -1)] + \
            ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]:
        cmd += ["--platform", tag]
    cmd += requirements()
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    wheels = sorted(f for f in os.listdir(args.dest) if f.endswith(".whl"))
    size = sum(os.path.getsize(os.path.join(args.dest, f)) for f in wheels)
    print(f"{len(wheels)} wheels, {size / 2**20:.0f} MiB in {args.dest}")


if __name__ == "__main__":
    main()
