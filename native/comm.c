/* Shared-memory allreduce between the ranks of one host (see comm.h).
 *
 * Segment: header | ctl[world] (one flag + pid per rank, each on its own 128-byte pair of lines
 * so a rank's writes never invalidate a line another rank spins on) | slots [2][world][capacity].
 *
 * A call is one round per chunk of at most `capacity` floats; round k uses the slots of parity
 * k & 1. Flags count the phases a rank has finished and only grow; all ranks run the same calls
 * with the same sizes, so they agree on every flag target. Reusing a parity is safe without any
 * extra handshake: a rank writes its slot of parity p in round k+2 only after it has seen every
 * peer's flag of round k+1, and each peer raised that flag (a release store) after its last
 * read of round k. */
#define _GNU_SOURCE
#include "comm.h"

#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LINE 128
#define MAGIC 0x6d6d6f63646e6964ull /* "dincomm" */
#define MAX_WORLD 256
#define BLOCK 256   /* floats summed per pass through the ranks: stays in L1 */
#define ALIGN 16    /* floats per cache line: shares and slots start on a line */
#define SPINS_PER_CHECK 4096

typedef struct {
    uint64_t magic;
    uint64_t world;
    uint64_t capacity; /* floats per slot, a multiple of ALIGN */
    char pad[LINE - 24];
} header_t;

typedef struct {
    uint64_t phase; /* phases this rank has finished; written by this rank only */
    int64_t pid;    /* the rank's process, to tell a dead peer from a slow one */
    char pad[LINE - 16];
} ctl_t;

struct dn_comm {
    void *base;
    size_t size;
    int rank, world;
    size_t capacity;
    ctl_t *ctl;      /* [world] */
    float *slots;    /* [2][world][capacity] */
    uint64_t phase;  /* this rank's flag value, kept locally */
    uint64_t rounds; /* rounds done: the parity of the next */
    size_t split;    /* n from which rounds reduce-scatter + allgather */
    int broken;
    uint64_t waits;  /* wait_peers calls, and the seconds they spun: what a rank lost to its */
    double waited;   /* peers (their extra work, or the flag latency), for the benchmarks */
};

static void say(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

static size_t segment_size(int world, size_t capacity) {
    return sizeof(header_t) + (size_t)world * sizeof(ctl_t) + 2 * (size_t)world * capacity * 4;
}

static float *slot(dn_comm *c, int parity, int rank) {
    return c->slots + ((size_t)parity * c->world + rank) * c->capacity;
}

dn_comm *dn_comm_open(const char *name, int rank, int world, size_t capacity, char *err,
                      size_t errlen) {
    if (world < 2 || world > MAX_WORLD || rank < 0 || rank >= world) {
        say(err, errlen, "rank %d of %d is not a group of 2..%d ranks", rank, world, MAX_WORLD);
        return NULL;
    }
    if (capacity == 0 || capacity > ((size_t)1 << 32)) {
        say(err, errlen, "slot capacity %zu is not in 1..2^32 floats", capacity);
        return NULL;
    }
    capacity = (capacity + ALIGN - 1) / ALIGN * ALIGN;
    size_t size = segment_size(world, capacity);
    int fd = rank == 0 ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600)
                       : shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        say(err, errlen, "shm_open(%s) on rank %d: %s", name, rank, strerror(errno));
        return NULL;
    }
    if (rank == 0 && ftruncate(fd, (off_t)size) != 0) {
        say(err, errlen, "ftruncate(%s, %zu): %s", name, size, strerror(errno));
        close(fd);
        shm_unlink(name);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != size) {
        say(err, errlen, "segment %s has %lld bytes, rank %d expects %zu", name,
            (long long)st.st_size, rank, size);
        close(fd);
        return NULL;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        say(err, errlen, "mmap(%s, %zu): %s", name, size, strerror(errno));
        if (rank == 0) shm_unlink(name);
        return NULL;
    }
    header_t *h = base;
    if (rank == 0) {
        h->world = (uint64_t)world;
        h->capacity = capacity;
        __atomic_store_n(&h->magic, MAGIC, __ATOMIC_RELEASE);
    } else if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != MAGIC || h->world != (uint64_t)world ||
               h->capacity != capacity) {
        say(err, errlen, "segment %s was made for %llu ranks x %llu floats, not %d x %zu", name,
            (unsigned long long)h->world, (unsigned long long)h->capacity, world, capacity);
        munmap(base, size);
        return NULL;
    }
    dn_comm *c = calloc(1, sizeof *c);
    if (!c) {
        say(err, errlen, "out of memory");
        munmap(base, size);
        if (rank == 0) shm_unlink(name);
        return NULL;
    }
    c->base = base;
    c->size = size;
    c->rank = rank;
    c->world = world;
    c->capacity = capacity;
    c->ctl = (ctl_t *)((char *)base + sizeof(header_t));
    c->slots = (float *)(c->ctl + world);
    c->split = (size_t)-1;
    c->ctl[rank].pid = getpid();
    /* first touch: a rank's own slots live on its own NUMA node */
    memset(slot(c, 0, rank), 0, capacity * 4);
    memset(slot(c, 1, rank), 0, capacity * 4);
    return c;
}

int dn_comm_unlink(const char *name) { return shm_unlink(name); }

void dn_comm_close(dn_comm *c) {
    if (!c) return;
    munmap(c->base, c->size);
    free(c);
}

void dn_comm_set_split_threshold(dn_comm *c, size_t n) { c->split = n; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Finish a phase: every write before this store is visible to a peer that sees the flag. */
static void publish(dn_comm *c) {
    __atomic_store_n(&c->ctl[c->rank].phase, ++c->phase, __ATOMIC_RELEASE);
}

/* Spin until every peer has finished phase c->phase. Every SPINS_PER_CHECK spins (~0.1 ms)
 * look at the clock and at whether the peer process still exists, and yield the cpu once. */
static int wait_peers(dn_comm *c, double timeout_s, char *err, size_t errlen) {
    const uint64_t target = c->phase;
    const double t0 = now();
    c->waits++;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        const uint64_t *flag = &c->ctl[r].phase;
        double deadline = 0;
        for (unsigned spins = 1; __atomic_load_n(flag, __ATOMIC_ACQUIRE) < target; spins++) {
            _mm_pause();
            if (spins % SPINS_PER_CHECK) continue;
            pid_t pid = (pid_t)c->ctl[r].pid;
            if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
                say(err, errlen, "rank %d (pid %d) has died", r, (int)pid);
                return -1;
            }
            double t = now();
            if (deadline == 0) {
                deadline = t + timeout_s;
            } else if (t > deadline) {
                say(err, errlen, "rank %d did not arrive within %.1f s", r, timeout_s);
                return -1;
            }
            /* a long wait: let a peer that shares this cpu (more ranks than cores) run */
            sched_yield();
        }
    }
    c->waited += now() - t0;
    return 0;
}

/* out [n] = src[0] + src[1] + ... + src[w-1], added in rank order so every rank gets the same
 * bits; out may be one of the sources. */
static void sum_ranks(float *out, const float *const *src, int w, size_t n) {
    float acc[BLOCK];
    for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
        size_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        const float *a = src[0] + i0, *b = src[1] + i0;
        for (size_t j = 0; j < m; j++) acc[j] = a[j] + b[j];
        for (int r = 2; r < w; r++) {
            const float *s = src[r] + i0;
            for (size_t j = 0; j < m; j++) acc[j] += s[j];
        }
        memcpy(out + i0, acc, m * 4);
    }
}

/* Every rank adds every vector: one phase. For short vectors, where the flag latency is all. */
static int round_whole(dn_comm *c, float *x /* [m] */, size_t m, int p, double timeout_s,
                       char *err, size_t errlen) {
    memcpy(slot(c, p, c->rank), x, m * 4);
    publish(c);
    if (wait_peers(c, timeout_s, err, errlen)) return -1;
    const float *src[MAX_WORLD];
    for (int r = 0; r < c->world; r++) src[r] = r == c->rank ? x : slot(c, p, r);
    sum_ranks(x, src, c->world, m);
    return 0;
}

/* Rank r's share [*a, *b) of m floats, borders on cache lines. */
static void share(size_t m, int r, int w, size_t *a, size_t *b) {
    size_t lines = (m + ALIGN - 1) / ALIGN, per = lines / w, extra = lines % w;
    size_t start = ((size_t)r * per + ((size_t)r < extra ? (size_t)r : extra)) * ALIGN;
    size_t stop = start + (per + ((size_t)r < extra)) * ALIGN;
    *a = start < m ? start : m;
    *b = stop < m ? stop : m;
}

/* Reduce-scatter + allgather: each rank adds one share of every vector, writes the sum back
 * into its own slot, and copies the other shares from their owners' slots. Two phases, but
 * every rank reads and adds 1/world of the data per peer. */
static int round_split(dn_comm *c, float *x /* [m] */, size_t m, int p, double timeout_s,
                       char *err, size_t errlen) {
    float *mine = slot(c, p, c->rank);
    size_t a, b;
    share(m, c->rank, c->world, &a, &b);
    memcpy(mine, x, a * 4); /* peers read their shares of x; this rank's own share stays in x */
    memcpy(mine + b, x + b, (m - b) * 4);
    publish(c);
    if (wait_peers(c, timeout_s, err, errlen)) return -1;
    const float *src[MAX_WORLD];
    for (int r = 0; r < c->world; r++) src[r] = (r == c->rank ? x : slot(c, p, r)) + a;
    sum_ranks(x + a, src, c->world, b - a);
    memcpy(mine + a, x + a, (b - a) * 4);
    publish(c);
    if (wait_peers(c, timeout_s, err, errlen)) return -1;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        size_t ra, rb;
        share(m, r, c->world, &ra, &rb);
        memcpy(x + ra, slot(c, p, r) + ra, (rb - ra) * 4);
    }
    return 0;
}

int dn_comm_allreduce(dn_comm *c, float *x, size_t n, double timeout_s, char *err,
                      size_t errlen) {
    if (c->broken) {
        say(err, errlen, "the group is broken by an earlier failure");
        return -1;
    }
    for (size_t done = 0; done < n; done += c->capacity) {
        size_t m = n - done < c->capacity ? n - done : c->capacity;
        int p = (int)(c->rounds++ & 1);
        int rc = n >= c->split ? round_split(c, x + done, m, p, timeout_s, err, errlen)
                               : round_whole(c, x + done, m, p, timeout_s, err, errlen);
        if (rc) {
            c->broken = 1;
            return -1;
        }
    }
    return 0;
}

size_t dn_comm_capacity(const dn_comm *c) { return c->capacity; }
void dn_comm_waits(const dn_comm *c, uint64_t *waits, double *seconds) {
    *waits = c->waits;
    *seconds = c->waited;
}
int dn_comm_rank(const dn_comm *c) { return c->rank; }
int dn_comm_world(const dn_comm *c) { return c->world; }

/* Rounds of as many whole rows as fit a slot: the workers copy their rows of the round into
 * their slots, everyone publishes and waits (so parities are reused as in an allreduce), and
 * rank 0 copies each slot's rows into its columns of out. */
int dn_comm_gather_columns(dn_comm *c, const float *local, float *out, size_t rows,
                           const int32_t *starts, double timeout_s, char *err, size_t errlen) {
    if (c->broken) {
        say(err, errlen, "the group is broken by an earlier failure");
        return -1;
    }
    const size_t width = (size_t)starts[c->world];
    const size_t mine = (size_t)(starts[c->rank + 1] - starts[c->rank]);
    size_t widest = 1;
    for (int r = 0; r < c->world; r++) {
        size_t w = (size_t)(starts[r + 1] - starts[r]);
        widest = w > widest ? w : widest;
    }
    if (widest > c->capacity) {
        say(err, errlen, "a shard of %zu columns does not fit a slot of %zu floats", widest, c->capacity);
        return -1;
    }
    const size_t per_round = c->capacity / widest;
    for (size_t r0 = 0; r0 < rows; r0 += per_round) {
        size_t m = rows - r0 < per_round ? rows - r0 : per_round;
        int p = (int)(c->rounds++ & 1);
        if (c->rank) memcpy(slot(c, p, c->rank), local + r0 * mine, m * mine * 4);
        publish(c);
        if (wait_peers(c, timeout_s, err, errlen)) {
            c->broken = 1;
            return -1;
        }
        if (c->rank) continue;
        for (int q = 0; q < c->world; q++) {
            size_t cols = (size_t)(starts[q + 1] - starts[q]);
            const float *src = q ? slot(c, p, q) : local + r0 * cols;
            for (size_t i = 0; i < m; i++)
                memcpy(out + (r0 + i) * width + starts[q], src + i * cols, cols * 4);
        }
    }
    return 0;
}
