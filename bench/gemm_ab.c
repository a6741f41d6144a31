/* A/B of two versions of native/linear_avx2.c's bf16 GEMM, interleaved in one process, timed by
 * CPU time: on a shared 2-cpu host the wall clock of a 10 ms call swings by 2x with the
 * neighbours' load, while the CPU time this process got swings far less (what remains is the
 * host's SMT siblings and cache sharing). Each round runs A and B (which goes first alternates:
 * the second of a pair ran ~2% faster in A/A runs) and the 12-accumulator FMA loop of
 * native/probe.c; the best round of each is printed as a fraction of that peak, and the median of
 * the rounds' B/A time ratios, which drifts less with the load than either best. Each call reads
 * the next of enough copies of the weights to fill 2x the LLC, so they come from DRAM as in a
 * prefill step (warm weights from L3 hid the cost of waiting on them). B's output must match A's.
 *
 *   git show main:native/linear_avx2.c > /tmp/a.c
 *   F="-O3 -fopenmp -std=gnu11 -fno-math-errno -Inative"
 *   gcc $F -Ddn_linear_avx2=kernels_a -c /tmp/a.c -o /tmp/a.o
 *   gcc $F -Ddn_linear_avx2=kernels_b -c native/linear_avx2.c -o /tmp/b.o
 *   gcc $F -mavx2 -mfma bench/gemm_ab.c /tmp/a.o /tmp/b.o -o /tmp/gemm_ab
 *   flock /tmp/bench.lock /tmp/gemm_ab M K N ROUNDS [THREADS]
 *
 * With THREADS > 1 the wall clock is used (CPU time would count the team's barrier spins). The
 * weights are packed here (bf16 panels, linear.h) with values near 1, x near 0.3; M > GEMV_MAX_M. */
#include <math.h>
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "linear_kernels.h"

#define LLC_BYTES (32 << 20)

extern const dn_linear_kernels kernels_a, kernels_b;

/* the GEMM never calls the GEMV at M > GEMV_MAX_M */
size_t dn_avx2_gemv_scratch(const dn_linear_w *w, int64_t m, int nthreads) { return 0; }
void dn_avx2_gemv(const dn_linear_call *c, int t, int nt) { abort(); }

static double seconds(int wall) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return wall ? omp_get_wtime() : t.tv_sec + t.tv_nsec * 1e-9;
}

/* flops of `iters` steps of 12 independent 8-lane FMAs */
__attribute__((target("avx2,fma"))) static double fma_loop(long iters) {
    __m256 a[12], x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1.0000001f);
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps((float)j);
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], y, x);
    float out[8], s = 0;
    for (int j = 0; j < 12; j++) {
        _mm256_storeu_ps(out, a[j]);
        s += out[0];
    }
    return s == 0.125f ? 0 : iters * 12.0 * 16;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s M K N ROUNDS [THREADS]\n", argv[0]);
        return 2;
    }
    int64_t m = atol(argv[1]), k = atol(argv[2]), n = atol(argv[3]);
    int rounds = atoi(argv[4]), nt = argc > 5 ? atoi(argv[5]) : 1, wall = nt > 1;
    dn_linear_w w = {DN_W_BF16, n, k, 0, (k + 1) / 2 * 2, (n + DN_LINEAR_NR - 1) / DN_LINEAR_NR, 0, 1.0f, NULL};
    w.panel_bytes = w.kp * DN_LINEAR_NR * 2;
    size_t wbytes = ((size_t)w.npanels * w.panel_bytes + 4095) / 4096 * 4096;
    int copies = (int)(2 * (size_t)LLC_BYTES / wbytes + 1);
    uint16_t *panels = aligned_alloc(4096, wbytes * copies);
    for (size_t i = 0; i < wbytes / 2; i++) panels[i] = (uint16_t)(0x3f80 + i % 13); /* 1.0 .. 1.1 */
    for (int i = 1; i < copies; i++) memcpy((char *)panels + i * wbytes, panels, wbytes);
    float *x = aligned_alloc(64, m * k * 4), *y = aligned_alloc(64, m * n * 4), *ya = malloc(m * n * 4);
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)(i % 7) * 0.1f;
    const dn_linear_kernels *kern[2] = {&kernels_a, &kernels_b};
    size_t need = kern[0]->scratch_bytes(&w, m, nt);
    if (kern[1]->scratch_bytes(&w, m, nt) > need) need = kern[1]->scratch_bytes(&w, m, nt);
    uint8_t *scratch = aligned_alloc(64, (need + 63) / 64 * 64);
    double best[2] = {1e30, 1e30}, peak = 0, *ratio = malloc(rounds * sizeof(double));
    for (int round = 0, copy = 0; round < rounds; round++) {
        double t[2];
        for (int i = 0; i < 2; i++) {
            int v = (round + i) % 2;
            w.data = (const uint8_t *)panels + (size_t)(copy++ % copies) * wbytes;
            dn_linear_call c = {&w, x, m, NULL, y, scratch, NULL, DN_ACT_SILU};
            double t0 = seconds(wall);
#pragma omp parallel num_threads(nt)
            kern[v]->run(&c, omp_get_thread_num(), omp_get_num_threads());
            t[v] = seconds(wall) - t0;
            if (t[v] < best[v]) best[v] = t[v];
            if (round > 0) continue;
            if (v == 0) memcpy(ya, y, m * n * 4);
            for (int64_t j = 0; v == 1 && j < m * n; j++)
                if (fabsf(y[j] - ya[j]) > 1e-5f * (1 + fabsf(ya[j]))) {
                    fprintf(stderr, "B differs from A at row %ld column %ld: %g vs %g\n", (long)(j / n),
                            (long)(j % n), y[j], ya[j]);
                    return 1;
                }
        }
        ratio[round] = t[1] / t[0];
        double flops = 0, t0 = seconds(wall);
#pragma omp parallel num_threads(nt) reduction(+ : flops)
        flops += fma_loop(2000000);
        double rate = flops / (seconds(wall) - t0);
        if (rate > peak) peak = rate;
    }
    double flops = 2.0 * m * n * k;
    qsort(ratio, rounds, sizeof(double), by_value);
    printf("M=%ld K=%ld N=%ld threads=%d (%s)  A %.2f ms %.3f of peak  B %.2f ms %.3f of peak  "
           "(FMA peak %.1f GFLOP/s)  B/A time: median %.3f [%.3f, %.3f]\n", (long)m, (long)k, (long)n, nt,
           wall ? "wall" : "cpu time", best[0] * 1e3, flops / best[0] / peak, best[1] * 1e3,
           flops / best[1] / peak, peak / 1e9, ratio[rounds / 2], ratio[0], ratio[rounds - 1]);
    return 0;
}
