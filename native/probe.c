/* Machine-limit probes for the benchmarks: streaming read bandwidth and FMA / bf16-dot peak. */
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "amx.h"
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

DN_TARGET_AVX2 static float read_avx2(const float *p, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 64 <= n; i += 64) /* two cache lines an iteration, like read_avx512 */
        for (int j = 0; j < 64; j += 32) {
            s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i + j));
            s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + j + 8));
            s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + j + 16));
            s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + j + 24));
        }
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
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
    const int avx512 = dn_isa_supported() == DN_ISA_AVX512;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = n / 64 * t / nt * 64, hi = n / 64 * (t + 1) / nt * 64;
        for (size_t i = lo; i < hi; i++) buf[i] = 1.0f;
        for (int r = 0; r < passes; r++) {
#pragma omp barrier
#pragma omp master
            t0 = omp_get_wtime();
            sink += avx512 ? read_avx512(buf + lo, hi - lo) : read_avx2(buf + lo, hi - lo);
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

/* vdpbf16ps on `ACC` independent accumulators, reading four source registers in turn rather
 * than one pair in every instruction: 12 cover a latency of 6 at two a cycle (Zen 4), 24 a
 * latency of 12 (an Intel core whose vdpbf16ps is two dependent uops). The probe takes the best.
 * Fully unrolled, or gcc keeps the accumulators in memory. */
#define DPBF16_LOOP(ACC)                                                                          \
    DN_TARGET_AVX512 static double dpbf16_loop_##ACC(long iters, float seed) {                     \
        __m512 a[ACC];                                                                             \
        const __m512bh x0 = (__m512bh)_mm512_set1_epi16(0x3f80), x1 = (__m512bh)_mm512_set1_epi16(0x3f81); \
        const __m512bh y0 = (__m512bh)_mm512_set1_epi16(0x3c00), y1 = (__m512bh)_mm512_set1_epi16(0x3c01); \
        _Pragma("GCC unroll 24") for (int j = 0; j < ACC; j++) a[j] = _mm512_set1_ps(seed + (float)j); \
        for (long i = 0; i < iters; i++) {                                                         \
            _Pragma("GCC unroll 24") for (int j = 0; j < ACC; j++)                                \
                a[j] = _mm512_dpbf16_ps(a[j], j & 1 ? x1 : x0, j & 2 ? y1 : y0);                   \
        }                                                                                          \
        float s = 0;                                                                               \
        for (int j = 0; j < ACC; j++) s += _mm512_reduce_add_ps(a[j]);                             \
        return s == 0.125f ? 0 : (double)iters * ACC * 32 * 2;                                     \
    }
DPBF16_LOOP(12)
DPBF16_LOOP(24)

/* 12 accumulators of 8 lanes (of 16 ymm registers). */
DN_TARGET_AVX2 static double fma_loop_avx2(long iters, float seed) {
    __m256 a[12], x = _mm256_set1_ps(seed), y = _mm256_set1_ps(1.0000001f);
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps((float)j);
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], y, x);
    float s = 0, out[8];
    for (int j = 0; j < 12; j++) {
        _mm256_storeu_ps(out, a[j]);
        s += out[0] + out[7];
    }
    return s == 0.125f ? 0 : (double)iters * 12 * 8 * 2;
}

double dn_probe_peak(int bf16, long iters, int threads) {
    /* without AVX-512 BF16, bf16 weights run as fp32 FMAs on the AVX2 path: that is their peak */
    const int avx512 = dn_isa_supported() == DN_ISA_AVX512;
    double flops = 0, t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += !avx512     ? fma_loop_avx2(iters, 1.0f)
             : bf16 == 2 ? dpbf16_loop_24(iters / 2, 1.0f)
             : bf16 == 1 ? dpbf16_loop_12(iters, 1.0f)
                         : fma_loop(iters, 1.0f);
    return flops / (omp_get_wtime() - t0);
}

/* tdpbf16ps on four accumulator tiles from two a and two b tiles loaded once: 16 x 16 x 32
 * multiply-adds each, the tile unit's steady rate. */
__attribute__((target("amx-tile,amx-bf16"))) static double amx_loop(long iters) {
    static const uint16_t zeros[16 * 32] __attribute__((aligned(64))) = {0};
    float c[16 * 16] __attribute__((aligned(64)));
    dn_amx_tile_ops.begin();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, zeros, 64);
    _tile_loadd(5, zeros, 64);
    _tile_loadd(6, zeros, 64);
    _tile_loadd(7, zeros, 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    dn_amx_tile_ops.end();
    return c[0] == 0.125f ? 0 : (double)iters * 4 * 16 * 16 * 32 * 2;
}

double dn_probe_amx_peak(long iters, int threads) {
    if (!dn_amx_available()) return -1;
    double flops = 0, t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += amx_loop(iters);
    return flops / (omp_get_wtime() - t0);
}
