/* AVX2 decode tile: the AVX-512 decode tile (attention_decode_avx512.c, which explains the plan)
 * for CPUs with AVX2 + FMA only: 8 lanes, 16 registers, no VNNI, no mask registers.
 *   Scores: a K group of 16 tokens in two halves of 8 lanes.  fp32, bf16: FMA (bf16 even/odd
 *   split by shift and mask).  int8: vpmaddwd on the d pair (int16 q).  uint4: vpmaddubsw on the
 *   d quad (codes times int8 q, pair sums of at most 2 * 15 * 127) then vpmaddwd by ones.
 *   Weighted sum of V: fp32 / bf16 rows, a broadcast weight; int8 token pairs on vpmaddwd (int16
 *   weights); uint4 token quads on vpmaddubsw (uint8 weights times codes) and vpmaddwd by ones.
 *   Vectors go four at a time where their accumulators would not fit the 16 registers. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attention_tile.h"
#include "common.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define MAX_M 8

static inline int64_t row_bytes(dn_kv_format_t f, int D) {
    return f == DN_KV_F32 ? 4 * D : f == DN_KV_BF16 ? 2 * D : f == DN_KV_INT8 ? D : D / 2;
}

/* Where accumulator lane `pos` of a 16-value chunk lives in head_dim. */
static int acc_lane_d(dn_kv_format_t f, int pos) {
    if (f == DN_KV_BF16) return pos < 8 ? 2 * pos : 2 * (pos - 8) + 1; /* even d, then odd d */
    return pos; /* fp32, int8, uint4: low nibbles d 0..7, high 8..15 */
}

/* e^x for x <= 88, 0 below -87 (-inf gives 0) */
static inline __m256 exp256(__m256 x) {
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* softcap * tanh(x / softcap) on exp256: tanh(y) = (1 - e^-2|y|) / (1 + e^-2|y|), sign of y */
static inline __m256 softcap256(__m256 x, float softcap) {
    const __m256 y = _mm256_mul_ps(x, _mm256_set1_ps(1.0f / softcap));
    const __m256 sign = _mm256_and_ps(y, _mm256_set1_ps(-0.0f));
    const __m256 e = exp256(_mm256_mul_ps(_mm256_or_ps(y, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(2.0f)));
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 c = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_xor_ps(_mm256_mul_ps(c, _mm256_set1_ps(softcap)), sign);
}

static inline float hmax256(__m256 x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float hsum256(__m256 x) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

/* Lanes of tokens g..g+8 that lie in [lo, hi): all ones, else 0. */
static inline __m256 tokens_in(int g, int lo, int hi) {
    __m256i tok = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(g));
    __m256i ge = _mm256_cmpgt_epi32(tok, _mm256_set1_epi32(lo - 1));
    __m256i lt = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), tok);
    return _mm256_castsi256_ps(_mm256_and_si256(ge, lt));
}

static inline __m256i bcast32(const void *p) {
    int32_t x;
    memcpy(&x, p, 4);
    return _mm256_set1_epi32(x);
}

static inline void prefetch_bytes(const char *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __asm__ volatile("prefetcht1 %0" : : "m"(p[o]));
}

static int quantize(const float *x, int n, int16_t *q, float qmax, float *scale) {
    /* inline max and rounding (cvtss2si rounds to nearest, as lrintf): libm calls here cost
     * the tiles of a split context, which load their queries again, a large share of their time */
    float m = 0.0f;
    for (int j = 0; j < n; j++) m = fabsf(x[j]) > m ? fabsf(x[j]) : m;
    *scale = m / qmax;
    for (int j = 0; j < n; j++) q[j] = m > 0.0f ? (int16_t)_mm_cvtss_si32(_mm_set_ss(x[j] * (qmax / m))) : 0;
    return 0;
}

#include "attention_decode_avx2_products.h"

/* ---- the tile */

typedef struct {
    char *q;       /* [H][M] query vectors as the scores read them, 4 * D bytes each */
    float *acc;    /* [H][M][D] weighted V sums in the lane order of V */
    float *sumv;   /* [H * M][8] lanes of the running sum of exp(score - max) */
    float *ztv;    /* [H * M][8] uint4: lanes of sum weight * v_zero * v_scale */
    float *mx;     /* [H * M] running max of the scores */
    float *qscale; /* [H * M] int formats */
    float *qsum;   /* [H * M] uint4: sum of the int8 q */
} state_t;

static void load_queries(const attn_tile_t *t, int head, const int M, const int D,
                         const state_t *st, float *stage, int16_t *q16) {
    const dn_kv_format_t f = t->kv->format;
    const int nh = t->n_q_heads;
    for (int i = 0; i < M; i++) {
        const int v = head * M + i;
        const float *src = t->q + (i / nh) * t->q_stride + (int64_t)(head * nh + i % nh) * D;
        for (int d = 0; d < D; d++) stage[d] = src[d] * t->scale;
        char *q = st->q + (int64_t)v * D * 4;
        if (f == DN_KV_F32 || f == DN_KV_BF16) {
            memcpy(q, stage, (size_t)D * 4);
        } else if (f == DN_KV_INT8) {
            quantize(stage, D, (int16_t *)q, 32767.0f, &st->qscale[v]);
        } else {
            quantize(stage, D, q16, 127.0f, &st->qscale[v]);
            int32_t qs = 0;
            for (int d = 0; d < D; d++) {
                ((int8_t *)q)[d] = (int8_t)q16[d];
                qs += q16[d];
            }
            st->qsum[v] = (float)qs;
        }
    }
}

/* one (block, head) slice, as slice_step of the AVX-512 tile; s [M][bs], wq [M][bs + 32] */
static inline __attribute__((always_inline)) void slice_step(const attn_tile_t *t, const state_t *st,
                                                            int head, int pos, int64_t slice,
                                                            int off, int n, int64_t next,
                                                            const int M, const int D, float *s,
                                                            int16_t *wq) {
    const dn_kv_cache_t *kv = t->kv;
    const dn_kv_format_t f = kv->format;
    const int bs = kv->block_size;
    const int64_t rb = row_bytes(f, D);
    const int ldw = bs + 32;
    const int v0 = head * M;
    const char *q = st->q + (int64_t)v0 * D * 4;
    float *acc = st->acc + (int64_t)v0 * D;
    const char *kn = next >= 0 ? (const char *)kv->k + next * rb : NULL;
    const char *vn = next >= 0 ? (const char *)kv->v + next * rb : NULL;
    const float *vs = kv->v_scale ? kv->v_scale + slice : NULL;
    const float *vz = kv->v_zero ? kv->v_zero + slice : NULL;
    if (kn && vs) {
        prefetch_bytes((const char *)(kv->k_scale + next), 4 * bs);
        prefetch_bytes((const char *)(kv->v_scale + next), 4 * bs);
        if (vz) {
            prefetch_bytes((const char *)(kv->k_zero + next), 4 * bs);
            prefetch_bytes((const char *)(kv->v_zero + next), 4 * bs);
        }
    }

    /* vector i sees the tokens [ts[i], te[i]) of the slice; [tmin, tmax) covers them all */
    int tmin, tmax, ts[MAX_M], te[MAX_M];
    attn_slice_seen(t, pos, off, n, M, ts, te, &tmin, &tmax);

    /* scores, 8 tokens at a time: half h of the group at g holds its tokens g + 8h.. */
    const int g0 = tmin & ~7, g1 = (off + n + 7) & ~7;
    for (int g = g0; g < g1; g += 8) {
        const int grp = g & ~15, h = (g >> 3) & 1;
        const char *kg = (const char *)kv->k + (slice + grp) * rb;
        const char *pf = kn && h == 0 ? kn + grp * rb : NULL;
        if (f == DN_KV_F32)
            scores_f32((const float *)kg + 8 * h, D, (const float *)q, M, s + g, bs, pf);
        else if (f == DN_KV_BF16)
            scores_bf16((const uint16_t *)kg + 16 * h, D, (const float *)q, M, s + g, bs, pf);
        else if (f == DN_KV_INT8)
            scores_int8((const int8_t *)kg + 16 * h, D, (const int16_t *)q, M, s + g, bs,
                        kv->k_scale + slice + g, st->qscale + v0, pf);
        else
            scores_uint4((const uint8_t *)kg + 32 * h, D, (const int8_t *)q, M, s + g, bs,
                         kv->k_scale + slice + g, kv->k_zero + slice + g, st->qscale + v0,
                         st->qsum + v0, pf);
    }

    if (t->softcap > 0.0f)
        for (int i = 0; i < M; i++)
            for (int g = g0; g < g1; g += 8)
                _mm256_storeu_ps(s + i * bs + g, softcap256(_mm256_loadu_ps(s + i * bs + g), t->softcap));

    /* online softmax over the tokens each vector sees, weights 0 elsewhere */
    float mo[MAX_M], mu[MAX_M], alpha[MAX_M], pmax[MAX_M];
    float wsc[MAX_M] = {0}, winv[MAX_M] = {0}; /* read only where vs (gcc cannot tell, at M = 1) */
    for (int i = 0; i < M; i++) {
        __m256 m = _mm256_set1_ps(-INFINITY);
        for (int g = g0; g < g1; g += 8)
            m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(s + i * bs + g),
                                                  tokens_in(g, ts[i], te[i])));
        float bm = hmax256(m);
        mo[i] = st->mx[v0 + i];
        float mn = fmaxf(mo[i], bm);
        mu[i] = mn == -INFINITY ? 0.0f : mn; /* nothing seen yet: subtract 0, no NaN */
        alpha[i] = expf(mo[i] - mu[i]);
        pmax[i] = expf(bm - mu[i]);
        st->mx[v0 + i] = mn;
    }
    if (vs) { /* int16 / uint8 weights: a weight times its V scale is at most pmax * max scale */
        const float wmax = f == DN_KV_UINT4 ? 255.0f : 32767.0f;
        __m256 m = _mm256_setzero_ps();
        for (int g = g0; g < g1; g += 8)
            m = _mm256_max_ps(m, _mm256_and_ps(tokens_in(g, tmin, tmax), _mm256_loadu_ps(vs + g)));
        float vmax = hmax256(m);
        for (int i = 0; i < M; i++) {
            float top = pmax[i] * vmax;
            wsc[i] = top / wmax;
            winv[i] = top > 0.0f ? wmax / top : 0.0f;
        }
    }
    uint8_t *w8 = (uint8_t *)wq;
    for (int i = 0; i < M; i++) {
        const __m256 m = _mm256_set1_ps(mu[i]), al = _mm256_set1_ps(alpha[i]);
        float *sumv = st->sumv + (v0 + i) * 8, *ztv = st->ztv + (v0 + i) * 8;
        __m256 psum = _mm256_mul_ps(_mm256_loadu_ps(sumv), al), zsum = _mm256_setzero_ps();
        for (int g = g0; g < g1; g += 8) {
            const __m256 ok = tokens_in(g, ts[i], te[i]);
            __m256 p = _mm256_and_ps(ok, exp256(_mm256_sub_ps(_mm256_loadu_ps(s + i * bs + g), m)));
            psum = _mm256_add_ps(psum, p);
            if (!vs) {
                _mm256_storeu_ps(s + i * bs + g, p);
                continue;
            }
            __m256 svs = _mm256_and_ps(ok, _mm256_loadu_ps(vs + g)); /* NaN-free where masked */
            __m256i w = _mm256_cvtps_epi32(_mm256_mul_ps(p, _mm256_mul_ps(svs, _mm256_set1_ps(winv[i]))));
            if (f == DN_KV_INT8) {
                __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
                _mm_storeu_si128((__m128i *)(wq + i * ldw + g), w16);
            } else {
                __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
                _mm_storel_epi64((__m128i *)(w8 + i * ldw + g), _mm_packus_epi16(w16, w16));
                zsum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(w), _mm256_and_ps(ok, _mm256_loadu_ps(vz + g)), zsum);
            }
        }
        _mm256_storeu_ps(sumv, psum);
        if (vz)
            _mm256_storeu_ps(ztv, _mm256_fmadd_ps(zsum, _mm256_set1_ps(wsc[i]), _mm256_mul_ps(_mm256_loadu_ps(ztv), al)));
        if (alpha[i] != 1.0f && mo[i] != -INFINITY)
            for (int d = 0; d < D; d += 8)
                _mm256_storeu_ps(acc + i * D + d, _mm256_mul_ps(al, _mm256_loadu_ps(acc + i * D + d)));
    }

    const char *vsl = (const char *)kv->v + slice * rb;
    for (int i0 = 0; i0 < M; i0 += 4) {
        const int MM = M - i0 < 4 ? M - i0 : 4;
#define PV(MMC)                                                                                      \
    if (f == DN_KV_F32)                                                                             \
        pv_f32((const float *)vsl, D, s, bs, i0, MMC, tmin, tmax, acc, vn);                         \
    else if (f == DN_KV_BF16)                                                                       \
        pv_bf16((const uint16_t *)vsl, D, s, bs, i0, MMC, tmin, tmax, acc, vn);                     \
    else if (f == DN_KV_INT8)                                                                       \
        pv_int8((const int8_t *)vsl, D, wq, ldw, i0, MMC, tmin & ~1, (tmax + 1) & ~1, wsc, acc, vn);\
    else                                                                                            \
        pv_uint4((const uint8_t *)vsl, D, w8, ldw, i0, MMC, tmin & ~3, (tmax + 3) & ~3, wsc, acc, vn)
        switch (MM) {
        case 1: PV(1); break;
        case 2: PV(2); break;
        case 3: PV(3); break;
        default: PV(4); break;
        }
#undef PV
    }
}

/* vector v's per-lane state (8 lanes) summed */
static inline float state_sum(const float *p, int v) { return hsum256(_mm256_loadu_ps(p + v * 8)); }

#define DECODE_CHUNK 16
#define DECODE_FITS attn_decode_avx2_fits
#define DECODE_ENTRY attn_decode_avx2
#include "attention_decode_driver.h"

#pragma GCC pop_options
