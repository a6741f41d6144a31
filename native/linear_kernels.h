/* What linear.c (the driver) and the per-ISA kernel files share: one call's arguments, the
 * kernel table each ISA file exports, and helpers over the packed layout (see linear.h). */
#pragma once
#include "common.h"
#include "linear.h"

typedef struct {
    const dn_linear_w *w;
    const float *x;      /* [m][k] */
    int64_t m;
    const float *bias;   /* [n] or NULL */
    float *y;            /* [m][n] */
    uint8_t *scratch;    /* scratch_bytes(w, m, nthreads) bytes, 64-byte aligned, shared by the team */
} dn_linear_call;

typedef struct {
    /* Scratch one call needs (converted activations, per-thread weight buffers). */
    size_t (*scratch_bytes)(const dn_linear_w *w, int64_t m, int nthreads);
    /* Called by every thread of one parallel region; may use `#pragma omp barrier`. */
    void (*run)(const dn_linear_call *c, int tid, int nthreads);
} dn_linear_kernels;

extern const dn_linear_kernels dn_linear_portable, dn_linear_avx2, dn_linear_avx512;

/* [*lo, *hi): thread t's contiguous share of n items. */
static inline void dn_split(int64_t n, int t, int nt, int64_t *lo, int64_t *hi) {
    *lo = n * t / nt;
    *hi = n * (t + 1) / nt;
}

static inline const uint8_t *dn_linear_panel(const dn_linear_w *w, int64_t p) {
    return w->data + p * w->panel_bytes;
}

/* How one call divides its work: whole panels per thread when there are enough to balance,
 * else every thread does all panels for a share of the rows (in blocks of `mr` rows). */
static inline void dn_linear_share(const dn_linear_w *w, int64_t m, int mr, int t, int nt,
                                   int64_t *p0, int64_t *p1, int64_t *m0, int64_t *m1) {
    int64_t mblocks = (m + mr - 1) / mr;
    if (w->npanels >= 4 * nt || w->npanels % nt == 0 || mblocks < nt) {
        dn_split(w->npanels, t, nt, p0, p1);
        *m0 = 0, *m1 = m;
    } else {
        *p0 = 0, *p1 = w->npanels;
        dn_split(mblocks, t, nt, m0, m1);
        *m0 *= mr;
        *m1 = *m1 * mr < m ? *m1 * mr : m;
    }
}
