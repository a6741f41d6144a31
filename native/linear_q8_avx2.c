/* i8q/u4q linear on AVX2 (layout and math in linear.h): the integer sums linear_q8_vnni.c takes
 * from vpdpbusd, here from vpmaddubsw (u8 x s8 pairs into int16) and vpmaddwd by ones (pairs of
 * int16 into int32), so both paths give the same bits. The uint4 GEMV this replaces on CPUs
 * without VNNI widened every code to fp32 (~16 instructions per 32 weights, 0.57 of a plain read
 * on 2 cores here); this one spends ~5, and a decode step runs at the speed of its bytes.
 *   u4q: codes 0..15 times xq in [-127, 127]: a pair is at most 3810, and the 16 pairs a block
 *        adds per int16 lane at most 30480, so the block sums in int16 and widens once.
 *   i8q: codes 0..255 would overflow a pair, so they go in as |q - 128| (at most 128, unsigned)
 *        against xq carrying q - 128's sign (vpsignb): a pair is at most 32512; the block's
 *        128 * sum(xq) (dn_q8_act.xs) added back in int32 makes the sum exact. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "linear_avx2.h"

#define Q8_MR 4 /* rows per unit of work; tiles of 4, 2 or 1 rows */

INLINE int32_t quad(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Columns [c, c + 8) of group block blk: their scale and scale*zero (dn_u4_params' and i8q's
 * stored fp16 values, the same floats linear_q8_vnni.c computes with). */
INLINE void group_params(int u4, const uint8_t *panel, const uint8_t *blk, int width, int c, __m256 *s,
                         __m256 *sz) {
    if (u4) {
        __m256 zero;
        u4_params8(panel, blk, width, c, s, &zero);
        *sz = _mm256_mul_ps(zero, *s);
    } else {
        const uint16_t *h = (const uint16_t *)blk;
        *s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + c)));
        *sz = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + width + c)));
    }
}

/* Groups [g0, g1) of x[r] . W^T for mr rows, columns [c0, c0 + 8 nv) of the panel: the sums so
 * far come from acc (rows of DN_LINEAR_NR, the panel's columns) unless g0 is 0, and go back
 * there unless g1 is the last group, where y gets the panel's `valid` real columns. */
INLINE void tile(const int mr, const int nv, const int u4, const uint8_t *panel, int width, int c0,
                 int64_t group, int64_t k, int64_t g0, int64_t g1, float *acc, const dn_q8_act *a, int64_t row0,
                 float *y, int64_t ldy, const float *bias, int valid, float unscale, dn_q8_ahead pf) {
    const dn_wtype t = u4 ? DN_W_U4Q : DN_W_I8Q;
    const int64_t ng = k / group, nb = k / DN_Q8_BLOCK;
    const __m256i low = _mm256_set1_epi8(15), flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 total[4][8];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++)
            total[r][v] = g0 ? _mm256_loadu_ps(acc + r * DN_LINEAR_NR + c0 + 8 * v) : _mm256_setzero_ps();
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *blk = dn_linear_group_at(t, group, panel, width, g), *codes = blk + dn_linear_group_head(t, width);
        for (int l = 0; l < pf.lines; l++) _mm_prefetch(pf.at + ((g - g0) * pf.lines + l) * 64, _MM_HINT_T1);
        __m256 s[8], sz[8];
        for (int v = 0; v < nv; v++) group_params(u4, panel, blk, width, c0 + 8 * v, &s[v], &sz[v]);
        for (int64_t b = 0; b < group / DN_Q8_BLOCK; b++) {
            const int64_t k0 = g * group + b * DN_Q8_BLOCK;
            __m256i dot[4][8];
            for (int r = 0; r < mr; r++)
                for (int v = 0; v < nv; v++) dot[r][v] = _mm256_setzero_si256();
            if (u4) { /* int16 lanes, widened once a block */
                for (int j = 0; j < DN_Q8_BLOCK / 8; j++) {
                    const uint8_t *row = codes + (b * DN_Q8_BLOCK / 8 + j) * width * 4 + 4 * c0;
                    __m256i lo[8], hi[8];
                    for (int v = 0; v < nv; v++) {
                        __m256i raw = _mm256_loadu_si256((const __m256i *)(row + 32 * v));
                        lo[v] = _mm256_and_si256(raw, low);
                        hi[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                    }
                    for (int r = 0; r < mr; r++) {
                        const int8_t *xr = a->xq + (row0 + r) * k + k0 + 8 * j;
                        __m256i x0 = _mm256_set1_epi32(quad(xr)), x1 = _mm256_set1_epi32(quad(xr + 4));
                        for (int v = 0; v < nv; v++) {
                            dot[r][v] = _mm256_add_epi16(dot[r][v], _mm256_maddubs_epi16(lo[v], x0));
                            dot[r][v] = _mm256_add_epi16(dot[r][v], _mm256_maddubs_epi16(hi[v], x1));
                        }
                    }
                }
                for (int r = 0; r < mr; r++)
                    for (int v = 0; v < nv; v++) dot[r][v] = _mm256_madd_epi16(dot[r][v], ones);
            } else {
                for (int j = 0; j < DN_Q8_BLOCK / 4; j++) {
                    const uint8_t *row = codes + (b * DN_Q8_BLOCK / 4 + j) * width * 4 + 4 * c0;
                    __m256i q[8], qabs[8];
                    for (int v = 0; v < nv; v++) {
                        q[v] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + 32 * v)), flip);
                        qabs[v] = _mm256_abs_epi8(q[v]); /* -128 -> 128, unsigned */
                    }
                    for (int r = 0; r < mr; r++) {
                        __m256i xv = _mm256_set1_epi32(quad(a->xq + (row0 + r) * k + k0 + 4 * j));
                        for (int v = 0; v < nv; v++)
                            dot[r][v] = _mm256_add_epi32(dot[r][v], _mm256_madd_epi16(
                                _mm256_maddubs_epi16(qabs[v], _mm256_sign_epi8(xv, q[v])), ones));
                    }
                }
                for (int r = 0; r < mr; r++) {
                    __m256i back = _mm256_set1_epi32(128 * a->xs[(row0 + r) * nb + k0 / DN_Q8_BLOCK]);
                    for (int v = 0; v < nv; v++) dot[r][v] = _mm256_add_epi32(dot[r][v], back);
                }
            }
            for (int r = 0; r < mr; r++) {
                __m256 d = _mm256_set1_ps(a->xd[(row0 + r) * nb + k0 / DN_Q8_BLOCK]);
                for (int v = 0; v < nv; v++)
                    total[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][v]), _mm256_mul_ps(s[v], d), total[r][v]);
            }
        }
        for (int r = 0; r < mr; r++) {
            __m256 xg = _mm256_set1_ps(a->xg[(row0 + r) * ng + g]);
            for (int v = 0; v < nv; v++) total[r][v] = _mm256_fnmadd_ps(sz[v], xg, total[r][v]);
        }
    }
    if (g1 < ng) {
        for (int r = 0; r < mr; r++)
            for (int v = 0; v < nv; v++) _mm256_storeu_ps(acc + r * DN_LINEAR_NR + c0 + 8 * v, total[r][v]);
        return;
    }
    for (int v = 0; v < nv; v++) {
        const int c = c0 + 8 * v;
        if (c >= valid) break;
        __m256i m = lane_mask(valid - c);
        __m256 bv = bias ? _mm256_maskload_ps(bias + c, m) : _mm256_setzero_ps();
        for (int r = 0; r < mr; r++) {
            __m256 out = _mm256_fmadd_ps(total[r][v], _mm256_set1_ps(unscale), bv);
            if (valid - c >= 8) _mm256_storeu_ps(y + (row0 + r) * ldy + c, out);
            else _mm256_maskstore_ps(y + (row0 + r) * ldy + c, m, out);
        }
    }
}

/* 32 floats -> int8 codes and their scale, as dn_q8_quantize_block (rint, nearest even). */
static int quantize_block(const float *x, int8_t *q, float *d) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], top = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    __m256 id = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    __m256i qi[4];
    for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *d = amax / 127.0f;
    return _mm_cvtsi128_si32(s4);
}

/* One panel's columns for MR_ rows at row i, NV x 8 at a time, narrower at its end; each tile
 * call prefetches its share of the next chunk (call index ci). */
#define TILE(MR_, NV, U4)                                                                             \
    tile(MR_, NV, U4, panel, width, c0, w->group, w->k, g0, g1, acc + (i - r0) * DN_LINEAR_NR, &a, i, \
         c->y + col0, w->n, bias, valid, w->unscale, dn_q8_ahead_of(&plan, ci++))
#define PANEL(MR_, NV, U4)                                                                  \
    for (int c0 = 0; c0 < width;) { /* a panel is 16 to 64 columns wide */                  \
        if (width - c0 >= 8 * (NV)) TILE(MR_, NV, U4), c0 += 8 * (NV);                      \
        else if ((NV) > 4 && width - c0 >= 32) TILE(MR_, (NV) > 4 ? 4 : (NV), U4), c0 += 32; \
        else TILE(MR_, (NV) > 2 ? 2 : (NV), U4), c0 += 16;                                  \
    }

/* Tile calls of one chunk over rows [r0, r1) of a panel `width` wide. */
static int64_t tile_calls(int64_t r0, int64_t r1, int width, int u4) {
    int64_t calls = 0;
    for (int64_t i = r0; i < r1;) {
        const int mr = r1 - i >= 4 ? 4 : r1 - i >= 2 ? 2 : 1, nv = mr == 4 ? 1 : mr == 2 ? 2 : u4 ? 8 : 4;
        calls += (width + 8 * nv - 1) / (8 * nv);
        i += mr;
    }
    return calls;
}

static void run(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    dn_q8_act a = dn_q8_prepare(c, t, nt, quantize_block);
    int64_t p0, p1, m0, m1;
    const int u4 = w->wtype == DN_W_U4Q;
    float acc[DN_Q8_ROW_BLOCK * DN_LINEAR_NR] __attribute__((aligned(32))); /* the row block's sums between chunks */
    dn_linear_part share = dn_linear_share(w, c->m, Q8_MR, t, nt);
    dn_linear_panels(&share, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        dn_linear_rows(&share, p, &m0, &m1);
        const uint8_t *panel = dn_linear_panel(w, p);
        const int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p);
        const int64_t col0 = p * DN_LINEAR_NR, ng = w->k / w->group;
        const float *bias = c->bias ? c->bias + col0 : NULL;
        /* Where several tile calls read the panel, they take it a chunk of k at a time, all of
         * them over one chunk before the next: the chunk comes from DRAM once and stays in L1
         * for the others while the next one is prefetched (one call over the whole panel at a
         * time waited on DRAM, and the others read the panel again from L2). */
        const int several = tile_calls(m0, m1 < m0 + DN_Q8_ROW_BLOCK ? m1 : m0 + DN_Q8_ROW_BLOCK, width, u4) > 1;
        const int64_t chunk = several ? (DN_Q8_CHUNK_K + w->group - 1) / w->group : ng;
        for (int64_t r0 = m0; r0 < m1; r0 += DN_Q8_ROW_BLOCK) {
            const int64_t r1 = r0 + DN_Q8_ROW_BLOCK < m1 ? r0 + DN_Q8_ROW_BLOCK : m1;
            for (int64_t g0 = 0, g1; g0 < ng; g0 = g1) {
                g1 = g0 + chunk < ng ? g0 + chunk : ng;
                /* none where more rows than a block make the call compute-bound */
                const dn_q8_prefetch plan = dn_q8_prefetch_plan(w, p, p1, width, g0, g1, chunk,
                                                                several && m1 - m0 <= DN_Q8_ROW_BLOCK,
                                                                tile_calls(r0, r1, width, u4));
                int64_t ci = 0;
                for (int64_t i = r0; i < r1;) {
                    if (r1 - i >= 4) {
                        if (u4) { PANEL(4, 1, 1); } else { PANEL(4, 1, 0); }
                        i += 4;
                    } else if (r1 - i >= 2) {
                        if (u4) { PANEL(2, 2, 1); } else { PANEL(2, 2, 0); }
                        i += 2;
                    } else {
                        if (u4) { PANEL(1, 8, 1); } else { PANEL(1, 4, 0); }
                        i += 1;
                    }
                }
            }
        }
    }
}

static int64_t units(const dn_linear_w *w, int64_t m) { return w->npanels * ((m + Q8_MR - 1) / Q8_MR); }

const dn_linear_kernels dn_linear_q8_avx2 = {dn_q8_scratch_bytes, run, NULL, units};

#pragma GCC pop_options
