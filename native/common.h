/* Shared by every kernel family: ISA selection, thread count, bf16 conversion. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Kernel paths, best last. DN_ISA_AVX512 means AVX-512 F/BW/VL/DQ + BF16 (vdpbf16ps):
 * an AVX-512 CPU without BF16 runs the AVX2 path. */
typedef enum { DN_ISA_PORTABLE = 0, DN_ISA_AVX2 = 1, DN_ISA_AVX512 = 2 } dn_isa_t;

dn_isa_t dn_isa(void);           /* the path kernels take now */
dn_isa_t dn_isa_supported(void); /* the best path this CPU runs and this build has */
dn_isa_t dn_isa_cpu(void);       /* the best path this CPU runs, built or not */
int dn_set_isa(dn_isa_t isa);    /* 0, or -1 when the CPU lacks it */

int dn_num_threads(void);        /* OpenMP threads a kernel uses */
void dn_set_num_threads(int n);

/* The team a parallel region forks for `workers` units of work: one thread, or every kernel
 * thread, never a size in between. libgomp ends the pool threads a smaller team leaves out and
 * creates them again for the next larger one; on a 16-core VM that churn (a 4-thread k/v
 * projection between 16-thread ones) halved decode. Workers past the units idle in the region. */
static inline int dn_team(int64_t workers) { return workers > 1 ? dn_num_threads() : 1; }
/* The team of a kernel whose `work` runs on the calling thread below `serial_limit` (a region
 * costs more than small work), else on every kernel thread. */
static inline int dn_team_for(int64_t work, int64_t serial_limit) { return work < serial_limit ? 1 : dn_num_threads(); }

/* A 64-byte aligned buffer of at least n bytes that belongs to the calling thread (so Python
 * threads can run kernels at once), one per slot, grown on demand and kept for the next call;
 * freed when the thread exits. NULL when out of memory. */
typedef enum {
    DN_SCRATCH_LINEAR = 0, DN_SCRATCH_ATTENTION = 1, DN_SCRATCH_MOE = 2, DN_SCRATCH_SAMPLE = 3, DN_SCRATCH_SLOTS = 4
} dn_scratch_slot;
void *dn_scratch(dn_scratch_slot slot, size_t n);

static inline float dn_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch and numpy references do; NaN stays NaN. */
static inline uint16_t dn_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Per-function targets: gcc 12 does not know every CPU here, so no -march=native. */
#define DN_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define DN_TARGET_AVX512 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
