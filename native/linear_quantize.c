/* int8 / uint4 weight quantization at load time (the output head of a model whose other weights
 * were quantized at serialization): the same rule as dashinfer_client/model/quant.py, in double
 * like its numpy, so both give the same codes, scales and zeros bit for bit. */
#include <math.h>
#include <omp.h>

#include "common.h"
#include "linear.h"

static float weight_at(const void *w, int bf16, int64_t i) {
    return bf16 ? dn_bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

void dn_quantize(const void *w, int bf16, int64_t n, int64_t k, int64_t group, int bits, uint8_t *codes,
                 float *scales, float *zeros) {
    int64_t ng = k / group;
    const double levels = bits == 4 ? 15.0 : 255.0;
#pragma omp parallel for schedule(static) num_threads(dn_num_threads())
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < ng; g++) {
            int64_t at = r * k + g * group;
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t i = 0; i < group; i++) {
                double v = weight_at(w, bf16, at + i);
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
            float scale = (float)((hi - lo) / levels);
            if (!(scale >= 1.17549435e-38f)) scale = 1.0f; /* constant or denormal-range group */
            float zero = (float)(-lo / (double)scale);
            for (int64_t i = 0; i < group; i++) {
                double q = nearbyint(weight_at(w, bf16, at + i) / (double)scale + (double)zero);
                uint8_t code = (uint8_t)(q < 0 ? 0 : q > levels ? levels : q);
                if (bits == 8) codes[at + i] = code;
                else if ((at + i) % 2 == 0) codes[(at + i) / 2] = code; /* group is even: k is */
                else codes[(at + i) / 2] |= (uint8_t)(code << 4);
            }
            scales[r * ng + g] = scale;
            zeros[r * ng + g] = zero;
        }
}
