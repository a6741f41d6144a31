#pragma once
#include "common.h"

/* Seconds to read n floats of buf reps times with `threads` threads (AVX-512 loads). */
double dn_probe_read(const float *buf, size_t n, int threads, int reps);

/* Flop/s of a register-resident loop: fp32 FMA (bf16 = 0) or vdpbf16ps (bf16 = 1). */
double dn_probe_peak(int bf16, long iters, int threads);
