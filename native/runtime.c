/* ISA detection, the thread count and per-thread scratch. */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "common.h"

static dn_isa_t detected = (dn_isa_t)-1;
static dn_isa_t current = (dn_isa_t)-1;
static int threads = 0;

dn_isa_t dn_isa_cpu(void) {
    static dn_isa_t cpu = (dn_isa_t)-1;
    if ((int)cpu >= 0) return cpu;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bf16"))
        cpu = DN_ISA_AVX512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        cpu = DN_ISA_AVX2;
    else
        cpu = DN_ISA_PORTABLE;
    return cpu;
}

dn_isa_t dn_isa_supported(void) {
    if ((int)detected >= 0) return detected;
    detected = dn_isa_cpu();
#ifdef DN_NO_AVX512 /* setup.py left the AVX-512 files out (avx512_left_out.c) */
    if (detected == DN_ISA_AVX512) detected = DN_ISA_AVX2;
#endif
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

typedef struct {
    void *p[DN_SCRATCH_SLOTS];
    size_t n[DN_SCRATCH_SLOTS];
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg) {
    scratch_t *s = arg;
    for (int i = 0; i < DN_SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

void *dn_scratch(dn_scratch_slot slot, size_t n) {
    pthread_once(&scratch_once, scratch_init);
    scratch_t *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        pthread_setspecific(scratch_key, s);
    }
    if (s->n[slot] < n) {
        free(s->p[slot]);
        s->n[slot] = (n + 65535) & ~(size_t)65535; /* grow in steps: fewer reallocations */
        if (posix_memalign(&s->p[slot], 64, s->n[slot]) != 0) s->p[slot] = NULL, s->n[slot] = 0;
    }
    return s->p[slot];
}
