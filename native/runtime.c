/* ISA detection and the thread count. */
#include <omp.h>
#include <stdlib.h>

#include "common.h"

static dn_isa_t detected = (dn_isa_t)-1;
static dn_isa_t current = (dn_isa_t)-1;
static int threads = 0;

dn_isa_t dn_isa_supported(void) {
    if ((int)detected >= 0) return detected;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bf16"))
        detected = DN_ISA_AVX512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        detected = DN_ISA_AVX2;
    else
        detected = DN_ISA_PORTABLE;
    return detected;
}

dn_isa_t dn_isa(void) {
    if ((int)current < 0) current = dn_isa_supported();
    return current;
}

int dn_set_isa(dn_isa_t isa) {
    if (isa < DN_ISA_PORTABLE || isa > dn_isa_supported()) return -1;
    current = isa;
    return 0;
}

int dn_num_threads(void) {
    if (threads <= 0) threads = omp_get_max_threads();
    return threads;
}

void dn_set_num_threads(int n) { threads = n > 0 ? n : omp_get_max_threads(); }
