"""bench/step_overhead.py's region counter (bench/gomp_count.c, preloaded ahead of libgomp)
against an OpenMP program whose regions and barriers are known from its source."""
import os
import subprocess

from bench.step_overhead import build_shim

PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    long n = 0, counts[4];
    for (int i = 0; i < 5; i++) {
#pragma omp parallel num_threads(2) reduction(+ : n)
        {
            n += 1;
#pragma omp barrier
        }
    }
    void (*read)(long *) = (void (*)(long *))dlsym(RTLD_DEFAULT, "gomp_count_read");
    if (!read) return 2;
    read(counts);
    printf("%ld %ld %ld %ld\n", n, counts[0], counts[1], counts[3]);
    return 0;
}
"""


def test_the_shim_counts_regions_and_barriers(tmp_path):
    shim = build_shim(str(tmp_path))
    src, exe = tmp_path / "regions.c", tmp_path / "regions"
    src.write_text(PROGRAM)
    subprocess.run(["gcc", "-fopenmp", str(src), "-o", str(exe), "-ldl"], check=True)
    out = subprocess.run([str(exe)], env=dict(os.environ, LD_PRELOAD=shim, OMP_DYNAMIC="false"),
                         capture_output=True, text=True, check=True).stdout.split()
    # 5 regions of 2 threads, one explicit barrier in each, waited at by both threads
    assert [int(v) for v in out] == [10, 5, 10, 10]
