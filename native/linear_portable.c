/* Linear layer in portable C: the reference path every CPU runs. Each panel is dequantized to
 * fp32 KC rows at a time, then accumulated into y row by row (fp32 throughout). */
#include "linear_kernels.h"

#define KC 64 /* k rows per dequantized slice: 64 x 64 floats = 16 KB */

/* Rows [k0, k0+kc) of a bf16/i8/u4/mxfp4 panel `width` wide as fp32 dst[kc][width], exactly
 * w = (q - zero) * scale for i8/u4, e2m1(q) * 2^(e - 127) for mxfp4 (linear_kernels.h): the
 * packed layout (linear.h) read the plain way. */
static void dequant_f32(const dn_linear_w *w, const uint8_t *panel, int width, int64_t k0,
                        int64_t kc, float *dst) {
    if (w->wtype == DN_W_MXFP4) {
        const int64_t gb = dn_linear_mxfp4_group_bytes(width);
        for (int64_t k = k0; k < k0 + kc; k++) {
            const uint8_t *blk = panel + k / DN_MXFP4_GROUP * gb, *scale = blk + 16 * width;
            const uint32_t *words = (const uint32_t *)blk + k % DN_MXFP4_GROUP / 8 * width;
            const int shift = 4 * (int)(k % 8);
            float *d = dst + (k - k0) * width;
            for (int c = 0; c < width; c++) d[c] = dn_e2m1_twice[words[c] >> shift & 15] * dn_e8m0_half(scale[c]);
        }
        return;
    }
    if (w->wtype == DN_W_BF16) {
        const uint16_t *src = (const uint16_t *)panel; /* [kp/2][width][2] */
        for (int64_t k = k0; k < k0 + kc; k++) {
            const uint16_t *row = src + (k / 2) * width * 2 + (k & 1);
            float *d = dst + (k - k0) * width;
            for (int c = 0; c < width; c++) d[c] = dn_bf16_to_f32(row[2 * c]);
        }
        return;
    }
    for (int64_t k = k0; k < k0 + kc; k++) {
        int64_t g = k / w->group, kk = k - g * w->group;
        const uint8_t *blk = dn_linear_group_at(w->wtype, w->group, panel, width, g);
        const uint8_t *codes = blk + dn_linear_group_head(w->wtype, width);
        float *d = dst + (k - k0) * width;
        if (w->wtype == DN_W_I8) {
            const float *scale = (const float *)blk, *zero = scale + width;
            const uint8_t *row = codes + (kk / 2) * width * 2 + (kk & 1);
            for (int c = 0; c < width; c++) d[c] = ((float)row[2 * c] - zero[c]) * scale[c];
        } else {
            const uint8_t *row = codes + (kk / 2) * width + (kk & 1);
            for (int c = 0; c < width; c++) {
                int cc = c & 15;
                uint8_t b = row[(c - cc) + 2 * (cc & 7)];
                int q = cc < 8 ? b & 15 : b >> 4;
                d[c] = ((float)q - dn_u4_zero(blk, width, c)) * dn_u4_scale(panel, blk, c);
            }
        }
    }
}

static size_t scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) { return 0; }

static void run(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    int64_t n = w->n, k = w->k, p0, p1, m0, m1;
    dn_linear_part share = dn_linear_share(w, c->m, 1, t, nt);
    dn_linear_panels(&share, &p0, &p1);
    float slice[KC * DN_LINEAR_NR]; /* [KC][width] */
    for (int64_t p = p0; p < p1; p++) {
        dn_linear_rows(&share, p, &m0, &m1);
        const uint8_t *panel = dn_linear_panel(w, p);
        int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p);
        int64_t col0 = p * DN_LINEAR_NR;
        for (int64_t i = m0; i < m1; i++)
            for (int j = 0; j < valid; j++) c->y[i * n + col0 + j] = c->bias ? c->bias[col0 + j] : 0;
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            int64_t kc = k - k0 < KC ? k - k0 : KC;
            const float *wf = (const float *)panel + k0 * width; /* [kc][width] */
            if (w->wtype != DN_W_F32) {
                dequant_f32(w, panel, width, k0, kc, slice);
                wf = slice;
            }
            for (int64_t i = m0; i < m1; i++) {
                const float *xr = c->x + i * k + k0;
                float *yr = c->y + i * n + col0;
                for (int64_t kk = 0; kk < kc; kk++)
                    for (int j = 0; j < valid; j++) yr[j] += xr[kk] * wf[kk * width + j];
            }
        }
    }
}

void dn_linear_unpack(const dn_linear_w *w, float *dst) {
    float slice[KC * DN_LINEAR_NR];
    for (int64_t p = 0; p < w->npanels; p++) {
        const uint8_t *panel = dn_linear_panel(w, p);
        int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p);
        for (int64_t k0 = 0; k0 < w->k; k0 += KC) {
            int64_t kc = w->k - k0 < KC ? w->k - k0 : KC;
            const float *wf = (const float *)panel + k0 * width; /* [kc][width] */
            if (w->wtype != DN_W_F32) {
                dequant_f32(w, panel, width, k0, kc, slice);
                wf = slice;
            }
            for (int j = 0; j < valid; j++)
                for (int64_t kk = 0; kk < kc; kk++)
                    dst[(p * DN_LINEAR_NR + j) * w->k + k0 + kk] = wf[kk * width + j];
        }
    }
}

const dn_linear_kernels dn_linear_portable = {scratch_bytes, run};
