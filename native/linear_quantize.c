/* int8 / uint4 InstantQuant (dashinfer_client/model/quant.py documents the rules): used by the
 * conversion (dashinfer_client/model/_quantize, on threads of its own, no OpenMP) and at load
 * for the output head of a model whose other weights were quantized at serialization (dn_quantize,
 * on the rank's OpenMP team). In double, summing in k order, as tests/quant_reference.py's numpy
 * does, so both give the same codes and scales bit for bit. A group that does not divide k leaves
 * a ragged last group of k mod group channels in each row. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "linear.h"

static float weight_at(const void *w, int bf16, int64_t i) {
    return bf16 ? dn_bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

static void put_code(uint8_t *codes, int bits, int64_t i, int code) {
    if (bits == 8) codes[i] = (uint8_t)code;
    else if (i % 2 == 0) codes[i / 2] = (uint8_t)code; /* group is even: k is */
    else codes[i / 2] |= (uint8_t)(code << 4);
}

/* clip(rint(v), 0, top), numpy's rounding of a code, for every v but NaN (0 here): adding and
 * subtracting 2^52 rounds a double in [0, 2^52) to the nearest integer, ties to even, as rint
 * does in the default rounding mode, without nearbyint's libm call (x86-64's baseline has no
 * roundsd): this is the quantizer's inner loop. */
static inline double code_of(double v, double top) {
    if (!(v > 0)) return 0;
    return v >= top ? top : (v + 0x1p52) - 0x1p52;
}

/* A row's quantization error, as quant.QuantErrorStats reads it: the weight the kernels see,
 * (code - zero) * scale in float32, minus w, in float32; its square and w's summed in double. */
static void add_error(double *row_error, float x, float code, float zero, float scale) {
    if (!row_error) return;
    float e = (code - zero) * scale - x;
    double a = fabs((double)e);
    row_error[0] += (double)e * e;
    row_error[1] += (double)x * x;
    if (a > row_error[2]) row_error[2] = a;
}

/* int8: scale = (max - min) / 255, zero = -min / scale, both float. */
static void quantize_i8_group(const void *w, int bf16, int64_t at, int64_t group, uint8_t *codes,
                              float *scale_out, float *zero_out, double *row_error) {
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < group; i++) {
        double v = weight_at(w, bf16, at + i);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    float scale = (float)((hi - lo) / 255.0);
    if (!(scale >= FLT_MIN)) scale = 1.0f; /* constant or denormal-range group */
    float zero = (float)(-lo / (double)scale);
    for (int64_t i = 0; i < group; i++) {
        float x = weight_at(w, bf16, at + i);
        int q = (int)code_of(x / (double)scale + (double)zero, 255);
        put_code(codes, 8, at + i, q);
        add_error(row_error, x, (float)q, zero, scale);
    }
    *scale_out = scale;
    *zero_out = zero;
}

static int64_t group_len(int64_t k, int64_t group, int64_t g) { return k - g * group < group ? k - g * group : group; }

/* A uint4 group's range, widened to hold 0: [*lo, *hi]. */
static void u4_range(const void *w, int bf16, int64_t at, int64_t group, double *lo, double *hi) {
    *lo = 0, *hi = 0;
    for (int64_t i = 0; i < group; i++) {
        double v = weight_at(w, bf16, at + i);
        *lo = v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
    }
}

/* uint4 (linear.h's u4): the scale code sc and zero code zc of least squared error, sc within
 * 1 of rint(range / 15 / d) and zc within 1 of rint(-min / scale * 16). Scale candidate dc
 * (-1..1) of a group whose range is [lo, hi]: its code, its scale, and its three zero
 * candidates (codes and values). */
static double u4_candidates(double lo, double hi, float d, int dc, int *sc, int zc[3], double zero[3]) {
    double c0 = nearbyint((hi - lo) / 15.0 / (double)d);
    *sc = (int)(c0 + dc < 1 ? 1 : c0 + dc > 255 ? 255 : c0 + dc);
    double scale = (double)(d * (float)*sc), z0 = nearbyint(-lo / scale * 16.0);
    for (int j = 0; j < 3; j++) {
        zc[j] = (int)(z0 + j - 1 < 0 ? 0 : z0 + j - 1 > 240 ? 240 : z0 + j - 1);
        zero[j] = zc[j] / 16.0;
    }
    return scale;
}

/* The pair of least error, candidates tried in order (dc, then dz), the first of equal errors
 * kept. Each sc's three zc are summed in one pass over the group, each in k order; x / scale is
 * shared by them, as numpy's `steps` is. */
static void u4_choose(const void *w, int bf16, int64_t at, int64_t group, float d, int *best_sc, int *best_zc) {
    double lo, hi, best = INFINITY;
    u4_range(w, bf16, at, group, &lo, &hi);
    *best_sc = 1, *best_zc = 0;
    for (int dc = -1; dc <= 1; dc++) {
        int sc, zc[3];
        double zero[3], err[3] = {0, 0, 0}, scale = u4_candidates(lo, hi, d, dc, &sc, zc, zero);
        for (int64_t i = 0; i < group; i++) {
            double x = weight_at(w, bf16, at + i), steps = x / scale;
            for (int j = 0; j < 3; j++) {
                double e = (code_of(steps + zero[j], 15) - zero[j]) * scale - x;
                err[j] += e * e;
            }
        }
        for (int j = 0; j < 3; j++)
            if (err[j] < best) best = err[j], *best_sc = sc, *best_zc = zc[j];
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define U4_LANES 4
/* u4_choose for 4 groups of one row at once, a group a lane: every lane does the scalar code's
 * operations in its order (no FMA: AVX alone), so the choice is the same bit for bit. xt: the
 * groups' weights, k-major [group][4]. */
__attribute__((target("avx"))) static void u4_choose4(const double *xt, const double lo[4], const double hi[4],
                                                      int64_t group, float d, int best_sc[4], int best_zc[4]) {
    double best[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    for (int l = 0; l < 4; l++) best_sc[l] = 1, best_zc[l] = 0;
    const __m256d shift = _mm256_set1_pd(0x1p52), top = _mm256_set1_pd(15), nil = _mm256_setzero_pd();
    for (int dc = -1; dc <= 1; dc++) {
        int sc[4], zc[3][4], lane_zc[3];
        double scale[4], zero[3][4], lane_zero[3], err[3][4];
        for (int l = 0; l < 4; l++) {
            scale[l] = u4_candidates(lo[l], hi[l], d, dc, &sc[l], lane_zc, lane_zero);
            for (int j = 0; j < 3; j++) zc[j][l] = lane_zc[j], zero[j][l] = lane_zero[j];
        }
        __m256d s = _mm256_loadu_pd(scale), z[3], e2[3];
        for (int j = 0; j < 3; j++) z[j] = _mm256_loadu_pd(zero[j]), e2[j] = _mm256_setzero_pd();
        for (int64_t i = 0; i < group; i++) {
            __m256d x = _mm256_loadu_pd(xt + i * 4), steps = _mm256_div_pd(x, s);
            for (int j = 0; j < 3; j++) {
                /* code_of: round as (v + 2^52) - 2^52; max with 0 first turns NaN and v <= 0 into 0 */
                __m256d q = _mm256_sub_pd(_mm256_add_pd(_mm256_add_pd(steps, z[j]), shift), shift);
                q = _mm256_min_pd(_mm256_max_pd(q, nil), top);
                __m256d e = _mm256_sub_pd(_mm256_mul_pd(_mm256_sub_pd(q, z[j]), s), x);
                e2[j] = _mm256_add_pd(e2[j], _mm256_mul_pd(e, e));
            }
        }
        for (int j = 0; j < 3; j++) _mm256_storeu_pd(err[j], e2[j]);
        for (int l = 0; l < 4; l++)
            for (int j = 0; j < 3; j++)
                if (err[j][l] < best[l]) best[l] = err[j][l], best_sc[l] = sc[l], best_zc[l] = zc[j][l];
    }
}

static int u4_lanes_here(void) { return __builtin_cpu_supports("avx") ? U4_LANES : 1; }
#else
#define U4_LANES 1
static int u4_lanes_here(void) { return 1; }
#endif

/* A group's codes and its two code bytes, for the chosen (sc, zc). */
static void u4_write(const void *w, int bf16, int64_t at, int64_t group, float d, int sc, int zc, uint8_t *codes,
                     uint8_t *sc_out, uint8_t *zc_out, double *row_error) {
    float scale = d * (float)sc;
    for (int64_t i = 0; i < group; i++) {
        float x = weight_at(w, bf16, at + i);
        int q = (int)code_of(x / (double)scale + zc / 16.0, 15);
        put_code(codes, 4, at + i, q);
        add_error(row_error, x, (float)q, (float)zc / 16.0f, scale);
    }
    *sc_out = (uint8_t)sc;
    *zc_out = (uint8_t)zc;
}

/* A uint4 row's groups: 4 whole groups at once where the CPU has AVX and xt (scratch of 4 *
 * group doubles) was given, one at a time otherwise (and the ragged last group). */
static void quantize_u4_row(const void *w, int bf16, int64_t at, int64_t k, int64_t group, float d, double *xt,
                            uint8_t *codes, uint8_t *scales, uint8_t *zeros, double *row_error) {
    int64_t ng = (k + group - 1) / group, g = 0;
    int sc[4], zc[4];
#if U4_LANES > 1
    for (; xt && u4_lanes_here() == U4_LANES && (g + U4_LANES) * group <= k; g += U4_LANES) {
        double lo[4], hi[4];
        for (int l = 0; l < U4_LANES; l++) {
            int64_t from = at + (g + l) * group;
            u4_range(w, bf16, from, group, &lo[l], &hi[l]);
            for (int64_t i = 0; i < group; i++) xt[i * 4 + l] = weight_at(w, bf16, from + i);
        }
        u4_choose4(xt, lo, hi, group, d, sc, zc);
        for (int l = 0; l < U4_LANES; l++)
            u4_write(w, bf16, at + (g + l) * group, group, d, sc[l], zc[l], codes, scales + g + l, zeros + g + l,
                     row_error);
    }
#endif
    for (; g < ng; g++) {
        int64_t len = group_len(k, group, g);
        u4_choose(w, bf16, at + g * group, len, d, &sc[0], &zc[0]);
        u4_write(w, bf16, at + g * group, len, d, sc[0], zc[0], codes, scales + g, zeros + g, row_error);
    }
}

/* A uint4 row's scale: the largest group step over 255 (1 for a row of zeros). */
static float u4_row_scale(const void *w, int bf16, int64_t at, int64_t k, int64_t group) {
    double top = 0, lo, hi;
    for (int64_t g = 0; g * group < k; g++) {
        u4_range(w, bf16, at + g * group, group_len(k, group, g), &lo, &hi);
        double step = (hi - lo) / 15.0;
        top = step > top ? step : top;
    }
    float d = (float)(top / 255.0);
    return d >= FLT_MIN ? d : 1.0f;
}

/* 1 when every weight of [at, at + k) is finite: an exponent of all ones is infinity or NaN. On the
 * integer bits, so the compiler vectorizes it; the row is in cache for the quantization after. */
static int row_is_finite(const void *w, int bf16, int64_t at, int64_t k) {
    int special = 0;
    if (bf16) {
        const uint16_t *u = (const uint16_t *)w + at;
        for (int64_t i = 0; i < k; i++) special |= (u[i] & 0x7F80) == 0x7F80;
    } else {
        const uint32_t *u = (const uint32_t *)w + at;
        for (int64_t i = 0; i < k; i++) special |= (u[i] & 0x7F800000u) == 0x7F800000u;
    }
    return !special;
}

int64_t dn_quantize_rows(const void *w, int bf16, int64_t r0, int64_t r1, int64_t k, int64_t group, int bits,
                         uint8_t *codes, void *scales, void *zeros, float *row_scales, double *error) {
    int64_t ng = (k + group - 1) / group;
    double *xt = bits == 4 && U4_LANES > 1 ? malloc((size_t)(U4_LANES * group) * sizeof(double)) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        if (!row_is_finite(w, bf16, r * k, k)) {
            free(xt);
            return r;
        }
        double *row_error = error ? error + r * 3 : NULL;
        if (row_error) row_error[0] = row_error[1] = row_error[2] = 0;
        if (bits == 4) {
            float d = row_scales[r] = u4_row_scale(w, bf16, r * k, k, group);
            quantize_u4_row(w, bf16, r * k, k, group, d, xt, codes, (uint8_t *)scales + r * ng,
                            (uint8_t *)zeros + r * ng, row_error);
            continue;
        }
        for (int64_t g = 0; g < ng; g++)
            quantize_i8_group(w, bf16, r * k + g * group, group_len(k, group, g), codes, (float *)scales + r * ng + g,
                              (float *)zeros + r * ng + g, row_error);
    }
    free(xt);
    return -1;
}

#ifdef _OPENMP /* the kernels' extension; the conversion's module has no OpenMP (see linear.h) */
#include <omp.h>

int64_t dn_quantize(const void *w, int bf16, int64_t n, int64_t k, int64_t group, int bits, uint8_t *codes,
                    void *scales, void *zeros, float *row_scales) {
    int64_t first_bad = -1;
#pragma omp parallel num_threads(dn_num_threads())
    {
        int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t bad = dn_quantize_rows(w, bf16, n * t / nt, n * (t + 1) / nt, k, group, bits, codes, scales, zeros,
                                       row_scales, NULL);
#pragma omp critical
        if (bad >= 0 && (first_bad < 0 || bad < first_bad)) first_bad = bad;
    }
    return first_bad;
}
#endif
