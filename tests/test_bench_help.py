"""Every bench script answers --help with its usage and runs nothing (machine.py, threads.py and
allreduce.py read sys.argv by hand and ran their whole benchmark instead)."""
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "bench", "*.py"))
                 if '__name__ == "__main__"' in open(p).read())


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage(script):
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, os.path.join("bench", script), "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: "), out.stdout[:500]
