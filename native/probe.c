/* Machine-limit probes for the benchmarks: streaming read bandwidth and FMA / bf16-dot peak. */
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "probe.h"

DN_TARGET_AVX512 static float read_avx512(const float *p, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 64 <= n; i += 64) { /* p is 64-byte aligned, n a multiple of 64 */
        s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* One parallel region for all passes, so no pass pays for waking the team; each thread
 * first-touches the share it then reads (its pages where it runs, huge pages where the kernel
 * gives them), the team starts every pass together at a barrier, and a pass lasts until its
 * slowest thread is done. The best pass is the machine's figure: on a shared host a pass during
 * which another process took a core is slower, never faster (the old probe timed 3 passes
 * together over a numpy buffer and reported about one core's bandwidth for two threads). */
double dn_probe_read(size_t bytes, int threads, int passes) {
    size_t n = bytes / 4 / 64 * 64, huge = (size_t)2 << 20;
    float *buf = NULL;
    if (n == 0 || posix_memalign((void **)&buf, huge, (n * 4 + huge - 1) / huge * huge) != 0) return -1;
    madvise(buf, (n * 4 + huge - 1) / huge * huge, MADV_HUGEPAGE);
    double best = 1e30, t0 = 0;
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = n / 64 * t / nt * 64, hi = n / 64 * (t + 1) / nt * 64;
        for (size_t i = lo; i < hi; i++) buf[i] = 1.0f;
        for (int r = 0; r < passes; r++) {
#pragma omp barrier
#pragma omp master
            t0 = omp_get_wtime();
            sink += read_avx512(buf + lo, hi - lo);
#pragma omp barrier
#pragma omp master
            {
                double dt = omp_get_wtime() - t0;
                if (dt < best) best = dt;
            }
        }
    }
    free(buf);
    return sink == 12345.678f ? -best : best; /* keeps the reads alive */
}

/* Independent accumulators hide the FMA latency; returns flops done. */
DN_TARGET_AVX512 static double fma_loop(long iters, float seed) {
    __m512 a[12], x = _mm512_set1_ps(seed), y = _mm512_set1_ps(1.0000001f);
    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_ps((float)j);
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = _mm512_fmadd_ps(a[j], y, x);
    float s = 0;
    for (int j = 0; j < 12; j++) s += _mm512_reduce_add_ps(a[j]);
    return s == 0.125f ? 0 : (double)iters * 12 * 16 * 2;
}

DN_TARGET_AVX512 static double dpbf16_loop(long iters, float seed) {
    __m512 a[12];
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3c00);
    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_ps(seed + (float)j);
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = _mm512_dpbf16_ps(a[j], x, y);
    float s = 0;
    for (int j = 0; j < 12; j++) s += _mm512_reduce_add_ps(a[j]);
    return s == 0.125f ? 0 : (double)iters * 12 * 32 * 2;
}

double dn_probe_peak(int bf16, long iters, int threads) {
    double flops = 0, t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += bf16 ? dpbf16_loop(iters, 1.0f) : fma_loop(iters, 1.0f);
    return flops / (omp_get_wtime() - t0);
}
