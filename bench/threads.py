"""The OpenMP wait policy: what a busy step costs and what an idle process burns.

    python bench/threads.py

For each GOMP_SPINCOUNT (0 = sleep at once, shorter and longer spin budgets, ours, unbounded
spinning) a fresh process runs bursts of tiny 2-thread parallel regions separated by a few
microseconds of Python (as a decode step's kernels are), then single regions after a pause of
0.5 and 2 ms of Python (as the first kernel of the next step comes after sampling), then sits
idle for a second. Prints microseconds per region in each case and CPU% while idle.
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import os, time, json
from dashinfer_server import kernels as K
K.load()
K.set_num_threads(2)
n = 20000
for _ in range(2000):
    K.probe_peak(False, 1, 2)  # warm: threads created
t0 = time.perf_counter()
for _ in range(n):
    K.probe_peak(False, 1, 2)
    sum(range(20))  # a little Python between kernels
out = {"busy_us_per_region": round((time.perf_counter() - t0) / n * 1e6, 2)}
for gap_ms in (0.5, 2.0):
    times = []
    for _ in range(200):
        until = time.perf_counter() + gap_ms / 1e3
        while time.perf_counter() < until:
            pass
        t0 = time.perf_counter()
        K.probe_peak(False, 1, 2)
        times.append(time.perf_counter() - t0)
    out[f"us_after_{gap_ms}ms_gap"] = round(sorted(times)[len(times) // 2] * 1e6, 1)
c0, w0 = time.process_time(), time.perf_counter()
time.sleep(1.0)
out["idle_cpu_percent"] = round((time.process_time() - c0) / (time.perf_counter() - w0) * 100, 1)
print(json.dumps(out))
"""

POLICIES = {
    "passive (GOMP_SPINCOUNT=0)": {"GOMP_SPINCOUNT": "0"},
    "10k spins": {"GOMP_SPINCOUNT": "10000"},
    "dashinfer-py (kernels.py default)": {},
    "libgomp default (300k spins)": {"GOMP_SPINCOUNT": "300000"},
    "1M spins": {"GOMP_SPINCOUNT": "1000000"},
    "active (OMP_WAIT_POLICY=active)": {"OMP_WAIT_POLICY": "active"},
}


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options: --help
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, extra in POLICIES.items():
        env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
        env.update(extra)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                             text=True, check=True)
        print(f"{name:36s} {json.loads(out.stdout)}")


if __name__ == "__main__":
    main()
