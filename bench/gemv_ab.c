/* A/B of two versions of native/linear_avx2_gemv.c's bf16 GEMV (a decode step's linears), in one
 * process, each beside a plain read of the same bytes. A GEMV is bound by the weight stream, and
 * this host's read bandwidth moves by 1.5x within seconds (bench/machine.py --series), so only
 * figures taken moments apart compare. Each round times A, B and `read` (the same team summing
 * the same packed bytes, each thread its GEMV share: what memory gives this stream without the
 * GEMV's arithmetic), each the best of 3 sweeps over COPIES weights that together fill 16x the
 * LLC (every sweep streams from DRAM); the order turns round by round. Printed: each round's
 * GB/s, then the medians over rounds of B/A, A/read and B/read.
 *
 *   git show main:native/linear_avx2_gemv.c > /tmp/a.c
 *   F="-O3 -fopenmp -std=gnu11 -fno-math-errno -Inative"
 *   gcc $F -Ddn_avx2_gemv=gemv_a -Ddn_avx2_gemv_scratch=gemv_scratch_a -c /tmp/a.c -o /tmp/a.o
 *   gcc $F -Ddn_avx2_gemv=gemv_b -Ddn_avx2_gemv_scratch=gemv_scratch_b -c native/linear_avx2_gemv.c -o /tmp/b.o
 *   gcc $F -mavx2 -mfma bench/gemv_ab.c /tmp/a.o /tmp/b.o -o /tmp/gemv_ab -lm
 *   flock /tmp/bench.lock /tmp/gemv_ab M K N ROUNDS [THREADS]
 *
 * The weights are bf16 panels (linear.h) of values near 1, on 2 MiB pages as the engine's are;
 * both versions' outputs are first checked against float64 sums (exit 1 when one is wrong). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "linear_kernels.h"

size_t gemv_scratch_a(const dn_linear_w *w, int64_t m, int nthreads);
size_t gemv_scratch_b(const dn_linear_w *w, int64_t m, int nthreads);
void gemv_a(const dn_linear_call *c, int t, int nt);
void gemv_b(const dn_linear_call *c, int t, int nt);

#define LLC_BYTES ((size_t)32 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

/* Thread t's panels of w summed as floats: the GEMV's share (dn_linear_share), read only. */
__attribute__((target("avx2"))) static float read_share(const dn_linear_w *w, int t, int nt) {
    int64_t p0, p1;
    dn_linear_part share = dn_linear_share(w, 1, 1, t, nt);
    dn_linear_panels(&share, &p0, &p1);
    const float *p = (const float *)dn_linear_panel(w, p0);
    size_t n = (size_t)(p1 - p0) * w->panel_bytes / 4;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return out[0];
}

/* bf16 bits -> float */
static float bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 0 when y [m][n] is x . W^T for the panels at w->data within float32's rounding (float64 sums
 * of the packed bf16 values, linear.h's layout), else 1 with the first wrong output printed: a
 * fast version that computes something else is no version to time. */
static int wrong(const dn_linear_w *w, const float *x, int64_t m, const float *y, const char *name) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < w->n; j++) {
            const uint16_t *panel = (const uint16_t *)dn_linear_panel(w, j / DN_LINEAR_NR);
            double want = 0, size = 0;
            for (int64_t i = 0; i < w->k; i++) {
                double t = (double)bf16(panel[((i / 2) * DN_LINEAR_NR + j % DN_LINEAR_NR) * 2 + i % 2]) * x[r * w->k + i];
                want += t, size += fabs(t);
            }
            if (fabs(y[r * w->n + j] - want) > 1e-5 * size + 1e-30) {
                fprintf(stderr, "%s: y[%ld][%ld] = %g, not %g\n", name, (long)r, (long)j, y[r * w->n + j], want);
                return 1;
            }
        }
    return 0;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s M K N ROUNDS [THREADS]\n", argv[0]);
        return 2;
    }
    int64_t m = atol(argv[1]), k = atol(argv[2]), n = atol(argv[3]);
    int rounds = atoi(argv[4]), nt = argc > 5 ? atoi(argv[5]) : 2;
    if (m < 1 || m > 4 || k < 2 || k % 2 || n < DN_LINEAR_NR || n % DN_LINEAR_NR || rounds < 1 || rounds > 1000) {
        fprintf(stderr, "M 1..4, K even, N a multiple of %d, ROUNDS 1..1000\n", DN_LINEAR_NR);
        return 2;
    }
    dn_linear_w w = {DN_W_BF16, n, k, 0, k, n / DN_LINEAR_NR, (int64_t)k * DN_LINEAR_NR * 2, 1.0f, NULL};
    size_t wbytes = (size_t)w.npanels * w.panel_bytes, stride = (wbytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    int copies = (int)((16 * LLC_BYTES + wbytes - 1) / wbytes);
    uint8_t *weights = aligned_alloc(HUGE_PAGE, stride * copies);
    madvise(weights, stride * copies, MADV_HUGEPAGE);
    for (size_t i = 0; i < stride * copies / 2; i++) ((uint16_t *)weights)[i] = (uint16_t)(0x3f80 + i % 13);
    float *x = aligned_alloc(64, 64 * ((m * k * 4 + 63) / 64)), *y = aligned_alloc(64, 64 * ((m * n * 4 + 63) / 64));
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)(i % 7) * 0.1f;
    size_t need = gemv_scratch_a(&w, m, nt) > gemv_scratch_b(&w, m, nt) ? gemv_scratch_a(&w, m, nt) : gemv_scratch_b(&w, m, nt);
    uint8_t *scratch = aligned_alloc(64, (need + 64) / 64 * 64);
    void (*const run[2])(const dn_linear_call *, int, int) = {gemv_a, gemv_b};
    double *gbs = malloc(sizeof(double) * 3 * rounds), *ratio = malloc(sizeof(double) * 3 * rounds);
    for (int v = 0; v < 2; v++) {
        w.data = weights;
        dn_linear_call call = {&w, x, m, NULL, y, scratch, NULL, DN_ACT_SILU};
#pragma omp parallel num_threads(nt)
        run[v](&call, omp_get_thread_num(), omp_get_num_threads());
        if (wrong(&w, x, m, y, v ? "B" : "A")) return 1;
    }
    float sink = 0;
    printf("M=%ld K=%ld N=%ld threads=%d, %d copies of %.1f MiB\n", (long)m, (long)k, (long)n, nt, copies,
           wbytes / 1048576.0);
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 3; i++) {
            int v = r % 2 ? 2 - i : i;
            double best = 1e30;
            for (int sweep = 0; sweep < 3; sweep++) {
                double t0 = omp_get_wtime();
                for (int c = 0; c < copies; c++) {
                    w.data = weights + c * stride;
                    dn_linear_call call = {&w, x, m, NULL, y, scratch, NULL, DN_ACT_SILU};
#pragma omp parallel num_threads(nt) reduction(+ : sink)
                    if (v < 2) run[v](&call, omp_get_thread_num(), omp_get_num_threads());
                    else sink += read_share(&w, omp_get_thread_num(), omp_get_num_threads());
                }
                double t = omp_get_wtime() - t0;
                if (t < best) best = t;
            }
            gbs[3 * r + v] = wbytes * (double)copies / best / 1e9;
        }
        printf("round %2d: A %5.1f GB/s  B %5.1f GB/s  read %5.1f GB/s\n", r, gbs[3 * r], gbs[3 * r + 1], gbs[3 * r + 2]);
        ratio[r] = gbs[3 * r + 1] / gbs[3 * r];
        ratio[rounds + r] = gbs[3 * r] / gbs[3 * r + 2];
        ratio[2 * rounds + r] = gbs[3 * r + 1] / gbs[3 * r + 2];
    }
    double lo = 1e30, hi = 0;
    for (int r = 0; r < rounds; r++) lo = ratio[r] < lo ? ratio[r] : lo, hi = ratio[r] > hi ? ratio[r] : hi;
    printf("median over %d rounds: B/A %.3f (rounds %.3f-%.3f)  A/read %.3f  B/read %.3f\n", rounds,
           median(ratio, rounds), lo, hi, median(ratio + rounds, rounds), median(ratio + 2 * rounds, rounds));
    return sink == 12345.0f; /* keeps the reads alive */
}
