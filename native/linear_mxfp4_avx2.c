/* mxfp4 linear, AVX2 + FMA. Decode rows (M <= GEMV_MAX_M) run a GEMV of their own; more rows run
 * the kernel of linear_mxfp4_kernel.h over 8 lanes, where vpermps looks up 8 entries, so the e2m1
 * table holds the magnitudes and the sign (bit 3) comes from an xor.
 *
 * The GEMV is bound by decoding, not by memory, unless a weight costs few instructions: pshufb
 * looks up 32 codes at once as int8 (twice e2m1, sign included), a second pshufb moves one k's
 * byte to the top of each column's 32-bit lane (zeros below), so that vcvtdq2ps gives the weight
 * times 2^24 exactly; the block's power of two (and 2^-24) multiplies its sum once per 32 k. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "linear_avx2.h"

#define LANES 8
#define NV_FOR(mr) ((mr) <= 4 ? 2 : 1) /* 16 ymm: up to 8 accumulators + codes, scales, weights */
typedef __m256 vf;
typedef __m256i vi;
#define vf_zero _mm256_setzero_ps
#define vf_bcast _mm256_broadcast_ss
#define vf_fma _mm256_fmadd_ps
#define vf_load _mm256_loadu_ps
#define vf_save _mm256_storeu_ps
#define vf_mul _mm256_mul_ps

static inline vi vi_load(const uint32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vi vi_next(vi v) { return _mm256_srli_epi32(v, 4); }

/* 2 e2m1 of each lane's low nibble (linear_kernels.h): v << 28 puts the nibble in bits 28-31,
 * sign on top; xored onto table[nibble & 7], which holds magnitude ^ (index << 28), it leaves
 * magnitude ^ sign. */
#define E2M1_ENTRY(bits, i) (int)((bits) ^ ((uint32_t)(i) << 28))
static inline vf vf_e2m1(vi v) {
    const __m256i table = _mm256_setr_epi32(
        E2M1_ENTRY(0x00000000u, 0), E2M1_ENTRY(0x3f800000u, 1), E2M1_ENTRY(0x40000000u, 2),
        E2M1_ENTRY(0x40400000u, 3), E2M1_ENTRY(0x40800000u, 4), E2M1_ENTRY(0x40c00000u, 5),
        E2M1_ENTRY(0x41000000u, 6), E2M1_ENTRY(0x41400000u, 7)); /* 0 1 2 3 4 6 8 12 */
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_permutevar8x32_epi32(table, v), _mm256_slli_epi32(v, 28)));
}

/* dn_e8m0_half of 8 bytes */
static inline vf vf_scales(const uint8_t *p) {
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    __m256i is_tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, is_tiny));
}

/* A pshufb control taking byte b of each 32-bit lane to its top byte, zeros (0x80) below. */
#define TOP_OF(lane, b) (int)((uint32_t)(4 * (lane) + (b)) << 24 | 0x808080u)
#define TOP_BYTE(b) \
    _mm256_setr_epi32(TOP_OF(0, b), TOP_OF(1, b), TOP_OF(2, b), TOP_OF(3, b), TOP_OF(0, b), TOP_OF(1, b), \
                      TOP_OF(2, b), TOP_OF(3, b))

/* tot[r][8v..] += x rows . one group of 32 k, 8 * nv columns: words [4][width] (the group's codes
 * at the first column), scales [8 * nv] e8m0, x [mr][ldx] at the group's first k. */
INLINE void gemv_group(const int mr, const int nv, const uint32_t *words, int width,
                       const uint8_t *scales, const float *x, int64_t ldx, float *tot) {
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)); /* 2 e2m1 */
    const __m256i low = _mm256_set1_epi8(15);
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < mr * nv; i++) acc[i] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            /* byte b of a lane: k = 8j + 2b in its low nibble, 8j + 2b + 1 in its high one */
            __m256i q = _mm256_loadu_si256((const __m256i *)(words + j * width + 8 * v));
            __m256i even = _mm256_shuffle_epi8(table, _mm256_and_si256(q, low));
            __m256i odd = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low));
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) {
                __m256 we = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(even, TOP_BYTE(b)));
                __m256 wo = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(odd, TOP_BYTE(b)));
                const float *xk = x + 8 * j + 2 * b;
#pragma GCC unroll 4
                for (int r = 0; r < mr; r++) {
                    acc[r * nv + v] = _mm256_fmadd_ps(we, _mm256_broadcast_ss(xk + r * ldx), acc[r * nv + v]);
                    acc[r * nv + v] = _mm256_fmadd_ps(wo, _mm256_broadcast_ss(xk + r * ldx + 1), acc[r * nv + v]);
                }
            }
        }
    const __m256 unplace = _mm256_set1_ps(0x1p-24f);
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) {
        __m256 s = vf_scales(scales + 8 * v);
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++) {
            float *t = tot + r * NR + 8 * v;
            _mm256_storeu_ps(t, _mm256_fmadd_ps(_mm256_mul_ps(acc[r * nv + v], unplace), s, _mm256_loadu_ps(t)));
        }
    }
}

/* Column registers per block at mr rows: 8 accumulators at most. */
static int gemv_nv(int mr, int left) {
    int nv = mr == 1 ? 8 : mr == 2 ? 4 : 2;
    while (nv > left / 8) nv /= 2;
    return nv;
}

/* tot [mr][NR] = rows of x . panel p (before bias), a group at a time front to back. */
static void gemv_panel(const dn_linear_w *w, int64_t p, int mr, const float *x, float *tot) {
    const uint8_t *panel = dn_linear_panel(w, p);
    const int width = dn_linear_width(w, p);
    const int64_t ng = w->k / DN_MXFP4_GROUP, gb = dn_linear_mxfp4_group_bytes(width);
    for (int64_t g = 0; g < ng; g++) {
        const uint32_t *words = (const uint32_t *)(panel + g * gb);
        const uint8_t *scales = panel + g * gb + 16 * width;
        const float *xg = x + g * DN_MXFP4_GROUP;
        for (int c0 = 0, nv; c0 < width; c0 += 8 * nv) {
            nv = gemv_nv(mr, width - c0);
#define GROUP(MR_, NV_) gemv_group(MR_, NV_, words + c0, width, scales + c0, xg, w->k, tot + c0)
            switch (mr * 16 + nv) {
            case 1 * 16 + 8: GROUP(1, 8); break;
            case 1 * 16 + 4: GROUP(1, 4); break;
            case 1 * 16 + 2: GROUP(1, 2); break;
            case 2 * 16 + 4: GROUP(2, 4); break;
            case 2 * 16 + 2: GROUP(2, 2); break;
            case 3 * 16 + 2: GROUP(3, 2); break;
            default: GROUP(4, 2); break;
            }
#undef GROUP
        }
    }
}

static void gemv(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    const int mr = (int)c->m;
    int64_t p0, p1;
    dn_linear_part share = dn_linear_share(w, c->m, GEMV_MAX_M, t, nt);
    dn_linear_panels(&share, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        float tot[GEMV_MAX_M * NR] __attribute__((aligned(32))) = {0};
        gemv_panel(w, p, mr, c->x, tot);
        gemv_store(tot, mr, dn_linear_width(w, p), dn_linear_valid(w, p), c->bias ? c->bias + p * NR : NULL,
                   c->y + p * NR, w->n);
    }
}

#include "linear_mxfp4_kernel.h"

static void run(const dn_linear_call *c, int t, int nt) {
    if (c->m <= GEMV_MAX_M) gemv(c, t, nt);
    else run_tiles(c, t, nt);
}

const dn_linear_kernels dn_linear_mxfp4_avx2 = {scratch_bytes, run, NULL, units};

#pragma GCC pop_options
