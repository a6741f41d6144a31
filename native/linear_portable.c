/* Linear layer in portable C: the reference path every CPU runs. Each panel is dequantized to
 * fp32 KC rows at a time, then accumulated into y row by row (fp32 throughout). */
#include "linear_kernels.h"

#define KC 64 /* k rows per dequantized slice: 64 x 64 floats = 16 KB */

static size_t scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) { return 0; }

static void run(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    int64_t n = w->n, k = w->k, p0, p1, m0, m1;
    dn_linear_share(w, c->m, 1, t, nt, &p0, &p1, &m0, &m1);
    float slice[KC * DN_LINEAR_NR]; /* [KC][width] */
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *panel = dn_linear_panel(w, p);
        int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p);
        int64_t col0 = p * DN_LINEAR_NR;
        for (int64_t i = m0; i < m1; i++)
            for (int j = 0; j < valid; j++) c->y[i * n + col0 + j] = c->bias ? c->bias[col0 + j] : 0;
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            int64_t kc = k - k0 < KC ? k - k0 : KC;
            const float *wf = (const float *)panel + k0 * width; /* [kc][width] */
            if (w->wtype != DN_W_F32) {
                dn_linear_dequant_f32(w, panel, width, k0, kc, slice);
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

const dn_linear_kernels dn_linear_portable = {scratch_bytes, run};
