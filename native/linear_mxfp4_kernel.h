/* The mxfp4 linear kernel (layout: linear.h), written once over a vector of LANES floats and
 * included by linear_mxfp4_avx2.c and linear_mxfp4_avx512.c after their target pragma and these:
 *   vf, vi             the float and int vector types
 *   vf_zero(), vf_bcast(p), vf_fma(a, b, c) = a * b + c, vf_mul(a, b)
 *   vi_load(p)         LANES 32-bit code words
 *   vf_scales(p)       LANES e8m0 bytes as floats 2^(e - 128) (dn_e8m0_half)
 *   vf_e2m1(v)         twice the e2m1 value of each lane's low nibble, looked up in registers
 *   vi_next(v)         v >> 4: the next k's nibble down
 *   vf_store(y, a, valid, bias) store lanes [0, valid) of a (+ bias, when not NULL)
 *   NV_FOR(mr)         column vectors per tile at mr rows (what the registers hold)
 *   KERNELS            the name of the dn_linear_kernels it defines
 *
 * Every M reads the packed bytes only: each 32-bit lane holds 8 k of one column, decoded a nibble
 * at a time and scaled by its block's power of two (the very floats of the dequantized weight,
 * linear_kernels.h), then one FMA per row. Work is shared by (panel, block of MR rows); a tile of
 * up to MR rows runs down the whole of K for LANES * nv columns, so a batch reads each weight from
 * memory once and decodes it once per MR rows. */
#define MR 8 /* rows per tile: M <= 8 (decode) is one tile a panel */
#define INLINE static inline __attribute__((always_inline))

/* y[r][0..LANES*nv) = x[r][k] . W[j0 + ..][k] (+ bias) over all k for mr rows: columns j0.. of a
 * panel `width` wide; x [mr][k], y [mr][ldy] at the tile's first row and column. */
INLINE void tile(const int mr, const int nv, const uint8_t *panel, int width, int j0, int64_t k,
                 const float *x, float *y, int64_t ldy, const float *bias, int valid) {
    const int64_t gb = dn_linear_mxfp4_group_bytes(width);
    vf acc[MR * 4];
#pragma GCC unroll 32
    for (int i = 0; i < mr * nv; i++) acc[i] = vf_zero();
    for (int64_t g = 0; g < k / DN_MXFP4_GROUP; g++) {
        const uint32_t *words = (const uint32_t *)(panel + g * gb) + j0; /* [4][width] */
        const uint8_t *scales = panel + g * gb + 16 * width + j0;
        vf s[4];
        for (int v = 0; v < nv; v++) s[v] = vf_scales(scales + LANES * v);
        for (int j = 0; j < 4; j++) {
            vi q[4];
            for (int v = 0; v < nv; v++) q[v] = vi_load(words + j * width + LANES * v);
            const float *xk = x + g * DN_MXFP4_GROUP + 8 * j;
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                vf wv[4];
                for (int v = 0; v < nv; v++) {
                    wv[v] = vf_mul(vf_e2m1(q[v]), s[v]);
                    q[v] = vi_next(q[v]);
                }
                for (int r = 0; r < mr; r++) {
                    vf xv = vf_bcast(xk + r * k + i);
                    for (int v = 0; v < nv; v++) acc[r * nv + v] = vf_fma(wv[v], xv, acc[r * nv + v]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++)
            vf_store(y + r * ldy + LANES * v, acc[r * nv + v], valid - LANES * v,
                     bias ? bias + LANES * v : NULL);
}

#define TILE_NV(MR_)                                                                      \
    switch (nv) {                                                                         \
    case 1: tile(MR_, 1, panel, width, j0, k, x, y, ldy, bias, valid); break;               \
    case 2: tile(MR_, 2, panel, width, j0, k, x, y, ldy, bias, valid); break;               \
    case 3: tile(MR_, 3, panel, width, j0, k, x, y, ldy, bias, valid); break;               \
    default: tile(MR_, 4, panel, width, j0, k, x, y, ldy, bias, valid); break;              \
    }

static void tile_any(int mr, int nv, const uint8_t *panel, int width, int j0, int64_t k,
                     const float *x, float *y, int64_t ldy, const float *bias, int valid) {
    switch (mr) {
    case 1: TILE_NV(1) break;
    case 2: TILE_NV(2) break;
    case 3: TILE_NV(3) break;
    case 4: TILE_NV(4) break;
    case 5: TILE_NV(5) break;
    case 6: TILE_NV(6) break;
    case 7: TILE_NV(7) break;
    default: TILE_NV(8) break;
    }
}
#undef TILE_NV

static size_t scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) { return 0; }

static int64_t units(const dn_linear_w *w, int64_t m) { return w->npanels * ((m + MR - 1) / MR); }

static void run(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    int64_t n = w->n, k = w->k, p0, p1, m0, m1;
    dn_linear_part share = dn_linear_share(w, c->m, MR, t, nt);
    dn_linear_panels(&share, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        dn_linear_rows(&share, p, &m0, &m1);
        const uint8_t *panel = dn_linear_panel(w, p);
        int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p);
        int64_t col0 = p * DN_LINEAR_NR;
        for (int64_t r = m0; r < m1; r += MR) {
            int mr = m1 - r < MR ? (int)(m1 - r) : MR;
            for (int j = 0; j < width;) {
                int nv = NV_FOR(mr), left = (width - j) / LANES;
                nv = nv < left ? nv : left;
                tile_any(mr, nv, panel, width, j, k, c->x + r * k,
                         c->y + r * n + col0 + j, n, c->bias ? c->bias + col0 + j : NULL, valid - j);
                j += LANES * nv;
            }
        }
    }
}

const dn_linear_kernels KERNELS = {scratch_bytes, run, NULL, units};

#undef MR
#undef INLINE
