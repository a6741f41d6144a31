#pragma once
#include "common.h"

/* Seconds to read n floats of buf reps times with `threads` threads (AVX-512 loads). */
/* Best seconds of one pass of `threads` threads streaming `bytes` (a buffer of their own), over
 * `passes` passes; -1 when the buffer cannot be allocated. */
double dn_probe_read(size_t bytes, int threads, int passes);

/* Flop/s of a register-resident loop: fp32 FMA (bf16 = 0) or vdpbf16ps (bf16 = 1). */
double dn_probe_peak(int bf16, long iters, int threads);
