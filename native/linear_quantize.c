/* int8 / uint4 InstantQuant (dashinfer_client/model/quant.py documents the rules): used by the
 * conversion (dashinfer_client/model/_quantize, on threads of its own, no OpenMP) and at load
 * for the output head of a model whose other weights were quantized at serialization (dn_quantize,
 * on the rank's OpenMP team). In double, summing in k order, as tests/quant_reference.py's numpy
 * does, so both give the same codes and scales bit for bit. A group that does not divide k leaves
 * a ragged last group of k mod group channels in each row. */
#include <float.h>
#include <math.h>

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
 * 1 of rint(range / 15 / d) and zc within 1 of rint(-min / scale * 16). Each sc's three zc are
 * summed in one pass over the group, each in k order; x / scale is shared by them, as numpy's
 * `steps` is. */
static void quantize_u4_group(const void *w, int bf16, int64_t at, int64_t group, float d, uint8_t *codes,
                              uint8_t *sc_out, uint8_t *zc_out, double *row_error) {
    double lo, hi, best = INFINITY;
    u4_range(w, bf16, at, group, &lo, &hi);
    double c0 = nearbyint((hi - lo) / 15.0 / (double)d);
    int best_sc = 1, best_zc = 0;
    for (int dc = -1; dc <= 1; dc++) {
        int sc = (int)(c0 + dc < 1 ? 1 : c0 + dc > 255 ? 255 : c0 + dc);
        double scale = (double)(d * (float)sc), z0 = nearbyint(-lo / scale * 16.0), zero[3], err[3] = {0, 0, 0};
        int zc[3];
        for (int j = 0; j < 3; j++) {
            zc[j] = (int)(z0 + j - 1 < 0 ? 0 : z0 + j - 1 > 240 ? 240 : z0 + j - 1);
            zero[j] = zc[j] / 16.0;
        }
        for (int64_t i = 0; i < group; i++) {
            double x = weight_at(w, bf16, at + i), steps = x / scale;
            for (int j = 0; j < 3; j++) {
                double e = (code_of(steps + zero[j], 15) - zero[j]) * scale - x;
                err[j] += e * e;
            }
        }
        for (int j = 0; j < 3; j++)
            if (err[j] < best) best = err[j], best_sc = sc, best_zc = zc[j];
    }
    float scale = d * (float)best_sc;
    for (int64_t i = 0; i < group; i++) {
        float x = weight_at(w, bf16, at + i);
        int q = (int)code_of(x / (double)scale + best_zc / 16.0, 15);
        put_code(codes, 4, at + i, q);
        add_error(row_error, x, (float)q, (float)best_zc / 16.0f, scale);
    }
    *sc_out = (uint8_t)best_sc;
    *zc_out = (uint8_t)best_zc;
}

static int64_t group_len(int64_t k, int64_t group, int64_t g) { return k - g * group < group ? k - g * group : group; }

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

void dn_quantize_rows(const void *w, int bf16, int64_t r0, int64_t r1, int64_t k, int64_t group, int bits,
                      uint8_t *codes, void *scales, void *zeros, float *row_scales, double *error) {
    int64_t ng = (k + group - 1) / group;
    for (int64_t r = r0; r < r1; r++) {
        double *row_error = error ? error + r * 3 : NULL;
        if (row_error) row_error[0] = row_error[1] = row_error[2] = 0;
        float d = 0;
        if (bits == 4) d = row_scales[r] = u4_row_scale(w, bf16, r * k, k, group);
        for (int64_t g = 0; g < ng; g++) {
            int64_t at = r * k + g * group, len = group_len(k, group, g), p = r * ng + g;
            if (bits == 8)
                quantize_i8_group(w, bf16, at, len, codes, (float *)scales + p, (float *)zeros + p, row_error);
            else
                quantize_u4_group(w, bf16, at, len, d, codes, (uint8_t *)scales + p, (uint8_t *)zeros + p,
                                  row_error);
        }
    }
}

#ifdef _OPENMP /* the kernels' extension; the conversion's module has no OpenMP (see linear.h) */
void dn_quantize(const void *w, int bf16, int64_t n, int64_t k, int64_t group, int bits, uint8_t *codes,
                 void *scales, void *zeros, float *row_scales) {
#pragma omp parallel for schedule(static) num_threads(dn_num_threads())
    for (int64_t r = 0; r < n; r++) dn_quantize_rows(w, bf16, r, r + 1, k, group, bits, codes, scales, zeros, row_scales, NULL);
}
#endif
