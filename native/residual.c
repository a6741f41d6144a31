/* residual.h: plain loops the compiler vectorizes; each runs on the OpenMP threads when the rows
 * are many (prefill) and on the calling thread at decode. */
#include "residual.h"

#include <math.h>

#include "common.h"

#define SERIAL_FLOATS 16384

void dn_add(float *res, const float *x, long n) {
    int nt = dn_team_for(n, SERIAL_FLOATS);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long i = 0; i < n; i++) res[i] += x[i];
}

void dn_sum_squares(const float *x, int M, int N, long ld, float *out, int out_stride) {
    int nt = dn_team_for((int64_t)M * N, SERIAL_FLOATS);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int m = 0; m < M; m++) {
        const float *row = x + (long)m * ld;
        float s = 0.0f;
        for (int j = 0; j < N; j++) s += row[j] * row[j];
        out[(long)m * out_stride] = s;
    }
}

void dn_scale_by_rms(float *x, int M, int N, const float *sum_sq, int ss_stride, float count,
                     const float *weight, float eps) {
    int nt = dn_team_for((int64_t)M * N, SERIAL_FLOATS);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int m = 0; m < M; m++) {
        float *row = x + (long)m * N;
        float inv = 1.0f / sqrtf(sum_sq[(long)m * ss_stride] / count + eps);
        for (int j = 0; j < N; j++) row[j] = row[j] * inv * weight[j];
    }
}
