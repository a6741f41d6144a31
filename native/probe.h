#pragma once
#include "common.h"

/* Seconds to read n floats of buf reps times with `threads` threads (AVX-512 loads). */
/* Best seconds of one pass of `threads` threads streaming `bytes` (a buffer of their own), over
 * `passes` passes; -1 when the buffer cannot be allocated. */
double dn_probe_read(size_t bytes, int threads, int passes);

/* Flop/s of a register-resident loop: fp32 FMA (bf16 = 0) or vdpbf16ps on 12 (bf16 = 1) or 24
 * (bf16 = 2) accumulators; on a CPU without AVX-512 BF16, the AVX2 fp32 FMA loop whatever bf16
 * says (bf16 weights run as fp32 FMAs there). dn_probe_read and this need AVX2. */
double dn_probe_peak(int bf16, long iters, int threads);

/* Flop/s of tdpbf16ps on four accumulator tiles, iters x 4 instructions a thread; -1 without
 * AMX (dn_amx_available). */
double dn_probe_amx_peak(long iters, int threads);
