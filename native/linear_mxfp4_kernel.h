/* The mxfp4 linear kernel (layout: linear.h), written once over a vector of LANES floats and
 * included by linear_mxfp4_avx2.c and linear_mxfp4_avx512.c after their target pragma and these:
 *   vf, vi             the float and int vector types
 *   vf_zero(), vf_bcast(p), vf_fma(a, b, c) = a * b + c, vf_mul(a, b)
 *   vi_load(p)         LANES 32-bit code words
 *   vf_scales(p)       LANES e8m0 bytes as floats 2^(e - 128) (dn_e8m0_half)
 *   vf_e2m1(v)         twice the e2m1 value of each lane's low nibble, looked up in registers
 *   vi_next(v)         v >> 4: the next k's nibble down
 *   vf_load(p), vf_save(p, a)  LANES floats from and to memory
 *   NV_FOR(mr)         column vectors per tile at mr rows (what the registers hold)
 * It defines scratch_bytes, units and run_tiles, which the including file puts in its
 * dn_linear_kernels (the AVX2 one runs its own GEMV below a few rows).
 *
 * Every M reads the packed bytes only: each 32-bit lane holds 8 k of one column, decoded a nibble
 * at a time and scaled by its block's power of two (the very floats of the dequantized weight,
 * linear_kernels.h), then one FMA per row. Work is shared by (panel, block of MR rows), so a
 * batch reads each weight from memory once and decodes it once per MR rows. */
#define MR 8 /* rows per tile: M <= 8 (decode) is one tile a panel */
#define KG 2 /* groups of 32 k per step: every column tile of a panel takes them in turn */
#define INLINE static inline __attribute__((always_inline))

/* acc[r][j0 + ..LANES*nv) += x[r][k] . W[j0 + ..][k] over the ng groups from `blk` for mr rows:
 * columns j0.. of a panel `width` wide; x [mr][ldx] at the first group's k; acc [mr][NR]. */
INLINE void tile(const int mr, const int nv, const uint8_t *blk, int width, int j0, int64_t ng,
                 const float *x, int64_t ldx, float *acc_rows) {
    const int64_t gb = dn_linear_mxfp4_group_bytes(width);
    vf acc[MR * 4];
#pragma GCC unroll 32
    for (int i = 0; i < mr * nv; i++) acc[i] = vf_load(acc_rows + i / nv * DN_LINEAR_NR + j0 + LANES * (i % nv));
    for (int64_t g = 0; g < ng; g++) {
        const uint32_t *words = (const uint32_t *)(blk + g * gb) + j0; /* [4][width] */
        const uint8_t *scales = blk + g * gb + 16 * width + j0;
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
                    vf xv = vf_bcast(xk + r * ldx + i);
                    for (int v = 0; v < nv; v++) acc[r * nv + v] = vf_fma(wv[v], xv, acc[r * nv + v]);
                }
            }
        }
    }
#pragma GCC unroll 32
    for (int i = 0; i < mr * nv; i++) vf_save(acc_rows + i / nv * DN_LINEAR_NR + j0 + LANES * (i % nv), acc[i]);
}

#define TILE_NV(MR_)                                                                      \
    switch (nv) {                                                                         \
    case 1: tile(MR_, 1, blk, width, j0, ng, x, ldx, acc); break;                         \
    case 2: tile(MR_, 2, blk, width, j0, ng, x, ldx, acc); break;                         \
    case 3: tile(MR_, 3, blk, width, j0, ng, x, ldx, acc); break;                         \
    default: tile(MR_, 4, blk, width, j0, ng, x, ldx, acc); break;                        \
    }

static void tile_any(int mr, int nv, const uint8_t *blk, int width, int j0, int64_t ng,
                     const float *x, int64_t ldx, float *acc) {
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

/* A panel is read front to back, KG groups at a time, by every column tile in turn (a tile
 * running down the whole of K alone would read a few lines of each group 1 KB apart: 6x slower
 * from DRAM); the sums wait in acc, in L1. */
static void run_tiles(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    int64_t n = w->n, k = w->k, ng = k / DN_MXFP4_GROUP, p0, p1, m0, m1;
    dn_linear_part share = dn_linear_share(w, c->m, MR, t, nt);
    dn_linear_panels(&share, &p0, &p1);
    float acc[MR * DN_LINEAR_NR] __attribute__((aligned(64))); /* [mr][NR] */
    for (int64_t p = p0; p < p1; p++) {
        dn_linear_rows(&share, p, &m0, &m1);
        const uint8_t *panel = dn_linear_panel(w, p);
        int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p);
        const int64_t gb = dn_linear_mxfp4_group_bytes(width), col0 = p * DN_LINEAR_NR;
        for (int64_t r = m0; r < m1; r += MR) {
            int mr = m1 - r < MR ? (int)(m1 - r) : MR;
            memset(acc, 0, sizeof acc);
            for (int64_t g = 0; g < ng; g += KG) {
                int64_t step = ng - g < KG ? ng - g : KG;
                for (int j = 0; j < width;) {
                    int nv = NV_FOR(mr), left = (width - j) / LANES;
                    nv = nv < left ? nv : left;
                    tile_any(mr, nv, panel + g * gb, width, j, step, c->x + r * k + g * DN_MXFP4_GROUP, k, acc);
                    j += LANES * nv;
                }
            }
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < valid; j++)
                    c->y[(r + i) * n + col0 + j] = acc[i * DN_LINEAR_NR + j] + (c->bias ? c->bias[col0 + j] : 0.0f);
        }
    }
}

#undef MR
#undef KG
#undef INLINE
