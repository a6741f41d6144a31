/* The residual add a norm cannot fuse (a layer without a pre-norm: OLMo 2), and RMSNorm over a
 * row split across tensor-parallel ranks (its sum of squares is completed by an allreduce). */
#pragma once

/* res += x */
void dn_add(float *res, const float *x, long n);

/* out[m * out_stride] = sum of x[m * ld + j]^2 over j < N, for each of M rows. */
void dn_sum_squares(const float *x, int M, int N, long ld, float *out, int out_stride);

/* Row m of x [M, N] times weight / sqrt(sum_sq[m * ss_stride] / count + eps): the RMSNorm of a
 * row whose sum of squares over all count columns (on every rank) is sum_sq. */
void dn_scale_by_rms(float *x, int M, int N, const float *sum_sq, int ss_stride, float count,
                     const float *weight, float eps);
