/* Counts the OpenMP parallel regions and barriers of a process: preloaded (LD_PRELOAD) ahead of
 * libgomp by bench/step_overhead.py, it takes libgomp's GOMP_parallel and GOMP_barrier, counts
 * and times each, and passes it on. Only the thread that forks a region counts it; a barrier
 * counts once per thread that waits in it. Read with ctypes: gomp_count_read(out[4]). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <time.h>

static atomic_long regions, barriers, region_ns, threads_forked;
static void (*real_parallel)(void (*)(void *), void *, unsigned, unsigned);
static void (*real_barrier)(void);

/* libgomp's own definition: the next object's, or, when libgomp came in by a later dlopen (a
 * Python extension's dependency, outside the global scope), that library's. */
static void *real(const char *name, const char *version) {
    void *f = dlvsym(RTLD_NEXT, name, version);
    if (!f) {
        void *gomp = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (gomp) f = dlvsym(gomp, name, version);
    }
    return f;
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    if (!real_parallel) real_parallel = real("GOMP_parallel", "GOMP_4.0");
    long t0 = now_ns();
    real_parallel(fn, data, num_threads, flags);
    atomic_fetch_add(&region_ns, now_ns() - t0);
    atomic_fetch_add(&regions, 1);
    atomic_fetch_add(&threads_forked, num_threads);
}

void GOMP_barrier(void) {
    if (!real_barrier) real_barrier = real("GOMP_barrier", "GOMP_1.0");
    atomic_fetch_add(&barriers, 1);
    real_barrier();
}

/* out: regions, barriers, nanoseconds inside regions (fork to join), sum of num_threads asked
 * (0 means "the default" to libgomp) */
void gomp_count_read(long *out) {
    out[0] = atomic_load(&regions);
    out[1] = atomic_load(&barriers);
    out[2] = atomic_load(&region_ns);
    out[3] = atomic_load(&threads_forked);
}
