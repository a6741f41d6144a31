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

/* Dequantize rows [k0, k0+kc) of a panel `width` wide into dst[kc][width] floats, exactly
 * w = (q - zero) * scale for i8/u4 (f32 panels are used in place, never copied).
 * Compiled into each file that includes it, with that file's target ISA. */
static inline void dn_linear_dequant_f32(const dn_linear_w *w, const uint8_t *panel, int width,
                                         int64_t k0, int64_t kc, float *dst) {
    if (w->wtype == DN_W_BF16) {
        const uint16_t *src = (const uint16_t *)panel; /* [kp/2][width][2] */
        for (int64_t k = k0; k < k0 + kc; k++) {
            const uint16_t *row = src + (k / 2) * width * 2 + (k & 1);
            float *d = dst + (k - k0) * width;
            for (int c = 0; c < width; c++) d[c] = dn_bf16_to_f32(row[2 * c]);
        }
        return;
    }
    int64_t gb = dn_linear_group_bytes(w->wtype, w->group, width);
    for (int64_t k = k0; k < k0 + kc; k++) {
        int64_t g = k / w->group, kk = k - g * w->group;
        const uint8_t *blk = panel + g * gb;
        const float *scale = (const float *)blk, *zero = scale + width;
        const uint8_t *codes = blk + 8 * width;
        float *d = dst + (k - k0) * width;
        if (w->wtype == DN_W_I8) {
            const uint8_t *row = codes + (kk / 2) * width * 2 + (kk & 1);
            for (int c = 0; c < width; c++) d[c] = ((float)row[2 * c] - zero[c]) * scale[c];
        } else {
            const uint8_t *row = codes + (kk / 2) * width + (kk & 1);
            for (int c = 0; c < width; c++) {
                int cc = c & 15;
                uint8_t b = row[(c - cc) + 2 * (cc & 7)];
                int q = cc < 8 ? b & 15 : b >> 4;
                d[c] = ((float)q - zero[c]) * scale[c];
            }
        }
    }
}
