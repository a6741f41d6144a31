"""Kernel benchmark: this machine's limits, then every kernel family's table.

    python bench/all_kernels.py [--threads 2] [--only linear,attention,elementwise]

Each family module (bench/<family>.py) has rows(limits) -> list of dicts and prints its
own table; this script measures the limits once (printed as JSON), runs them all, and with
--json writes the limits and every row to that file.
"""
import argparse
import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.machine import limits as measure_limits  # noqa: E402

from dashinfer_server import kernels as K  # noqa: E402

FAMILIES = ("linear", "attention", "elementwise")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default=",".join(FAMILIES))
    parser.add_argument("--json", help="also write all rows to this file")
    args = parser.parse_args()

    K.set_num_threads(args.threads)
    limits = measure_limits(args.threads)
    print("machine:", json.dumps({k: round(v, 1) if isinstance(v, float) else v
                                  for k, v in limits.items()}))
    results = {"limits": limits}
    for family in args.only.split(","):
        print(f"\n== {family} ==")
        results[family] = importlib.import_module(f"bench.{family}").rows(limits)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
