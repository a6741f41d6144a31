/* AVX-512 decode tile: few query vectors per kv head (M <= 8: the GQA group times a few rows)
 * against a long context. Bound by the bytes of K/V streamed from memory, so the work per byte
 * must stay below what two cores can do while DRAM delivers it.
 *
 * Streaming. A tile covers consecutive kv heads of one sequence and walks its context block by
 * block, every head of a block before the next block. A block's heads are contiguous in the
 * cache ([n_kv_heads][slice], K and V each), so the tile reads two long runs per block rather
 * than a head's 2-16 KiB slice of every block, and while it computes one (block, head) slice it
 * prefetches the next one into L2, line for line as it consumes its own.
 *
 * Products, per slice (layouts: kv_cache_layout.h).
 *   Scores: K holds 16 tokens side by side, so q . k of 16 tokens accumulates in the 16 lanes of
 *   one register per query vector, q broadcast: no horizontal sums.
 *     fp32: FMA per d.  bf16: a 64-byte load of a d pair gives d even by a shift, d odd by a mask;
 *     exact fp32 math.  int8: vpdpwssd on the d pair, q quantized to int16 per vector (rel. error
 *     2^-16, negligible next to the cache's own 8-bit error).  uint4: vpdpbusd on a d quad of
 *     codes, q quantized to int8 per vector (error 1/254 of its largest value: an order of
 *     magnitude below the 4-bit cache's own 1/30 of its range).
 *   Weighted sum of V: fp32 / bf16 rows times a broadcast weight (bf16: even/odd lanes).  int8:
 *   vpdpwssd over token pairs, weights (softmax weight times the V scale) quantized to int16 per
 *   vector and slice.  uint4: vpdpbusd over token quads, weights quantized to uint8 (as q).
 *   Scores, the running max and sum, and the output stay fp32. */
#include <math.h>
#include <string.h>

#include "attention_tile.h"
#include "common.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")

#include "exp_prefetch_avx512.h"

#define MAX_M 8

/* Bytes of one cached token of one kv head. */
static inline int64_t row_bytes(dn_kv_format_t f, int D) {
    return f == DN_KV_F32 ? 4 * D : f == DN_KV_BF16 ? 2 * D : f == DN_KV_INT8 ? D : D / 2;
}

/* Where accumulator lane `pos` of a 32-value chunk lives in head_dim. */
static int acc_lane_d(dn_kv_format_t f, int pos) {
    switch (f) {
    case DN_KV_BF16: /* even d, then odd d */
        return pos < 16 ? 2 * pos : 2 * (pos - 16) + 1;
    case DN_KV_UINT4: { /* low nibbles: d 0..7, 16..23; high nibbles: d 8..15, 24..31 */
        int l = pos % 16;
        return (l < 8 ? l : l + 8) + (pos < 16 ? 0 : 8);
    }
    default:
        return pos;
    }
}

/* A query as the int scores read it: q = x / qscale rounded to nearest, qscale = max|x| / qmax
 * (0 if all 0); int16, |q| <= 32767 (int8 cache), or int8, |q| <= 127, and qsum the sum of q
 * (uint4 cache). D a multiple of 16. In vector code because a tile of a split context loads
 * its queries again: at batch 1 the scalar loop (libm fmaxf and lrintf per value) took about a
 * fifth of the int tiles' time (perf, Qwen2-1.5B heads, 4096 tokens). */
static void quantize_query(const float *x, const int D, dn_kv_format_t f, char *q, float *qscale,
                           float *qsum) {
    const float qmax = f == DN_KV_INT8 ? 32767.0f : 127.0f;
    __m512 m = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + d)));
    const float mx = _mm512_reduce_max_ps(m);
    const __m512 k = _mm512_set1_ps(mx > 0.0f ? qmax / mx : 0.0f);
    __m512i sum = _mm512_setzero_si512();
    for (int d = 0; d < D; d += 16) {
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + d), k));
        sum = _mm512_add_epi32(sum, v);
        if (f == DN_KV_INT8)
            _mm256_storeu_si256((__m256i *)((int16_t *)q + d), _mm512_cvtsepi32_epi16(v));
        else
            _mm_storeu_si128((__m128i *)((int8_t *)q + d), _mm512_cvtsepi32_epi8(v));
    }
    *qscale = mx / qmax;
    *qsum = (float)_mm512_reduce_add_epi32(sum);
}

#include "attention_decode_avx512_products.h"

/* ---- the tile */

/* Per-vector state of a tile, H heads x M vectors, in the scratch. Sums are kept as 16 lanes
 * and added up at the end: no horizontal sum per slice. */
typedef struct {
    char *q;       /* [H][M] query vectors, scaled, as the scores read them: fp32 [D] (fp32,
                    * bf16), int16 [D] (int8), int8 [D] (uint4) */
    float *acc;    /* [H][M][D] weighted V sums in the lane order of V */
    float *sumv;   /* [H * M][16] lanes of the running sum of exp(score - max) */
    float *ztv;    /* [H * M][16] uint4: lanes of sum weight * v_zero * v_scale, subtracted at the end */
    float *mx;     /* [H * M] running max of the scores */
    float *qscale; /* [H * M] int formats: q ~= q16 * qscale */
    float *qsum;   /* [H * M] uint4: sum of the int8 q, for the K zero points */
} state_t;

/* Scaled queries of one kv head in the form the scores want. */
static void load_queries(const attn_tile_t *t, int head, const int M, const int D,
                         const state_t *st, float *stage /* [D] */,
                         int16_t *q16 /* [D], the AVX2 tile's */) {
    (void)q16;
    const dn_kv_format_t f = t->kv->format;
    const int nh = t->n_q_heads;
    for (int i = 0; i < M; i++) {
        const int v = head * M + i;
        const float *src = t->q + (i / nh) * t->q_stride + (int64_t)(head * nh + i % nh) * D;
        for (int d = 0; d < D; d++) stage[d] = src[d] * t->scale;
        char *q = st->q + (int64_t)v * D * 4;
        if (f == DN_KV_F32 || f == DN_KV_BF16) {
            memcpy(q, stage, (size_t)D * 4);
        } else {
            quantize_query(stage, D, f, q, &st->qscale[v], &st->qsum[v]);
        }
    }
}

/* Mask of the tokens g..g+16 of a slice that lie in [lo, hi). */
static inline __mmask16 tokens_in(int g, int lo, int hi) {
    __m512i tok = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                   _mm512_set1_epi32(g));
    return _mm512_cmpge_epi32_mask(tok, _mm512_set1_epi32(lo)) &
           _mm512_cmplt_epi32_mask(tok, _mm512_set1_epi32(hi));
}

/* Tokens off..off+n of the (block, head) slice whose first token is cache row `slice`; the M
 * vectors of `head`. next: first row of the slice to prefetch, or -1. Scratch: s [M][bs] scores
 * then weights, wq [M][bs + 32] int16 weights (uint4: uint8). */
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
    const int v0 = head * M; /* the head's first vector */
    const char *q = st->q + (int64_t)v0 * D * 4;
    float *acc = st->acc + (int64_t)v0 * D;
    const char *kn = next >= 0 ? (const char *)kv->k + next * rb : NULL;
    const char *vn = next >= 0 ? (const char *)kv->v + next * rb : NULL;
    const float *vs = kv->v_scale ? kv->v_scale + slice : NULL; /* int formats */
    const float *vz = kv->v_zero ? kv->v_zero + slice : NULL;   /* uint4 */
    if (kn && vs) { /* the per-token scales of the next slice */
        prefetch_bytes((const char *)(kv->k_scale + next), 4 * bs);
        prefetch_bytes((const char *)(kv->v_scale + next), 4 * bs);
        if (vz) {
            prefetch_bytes((const char *)(kv->k_zero + next), 4 * bs);
            prefetch_bytes((const char *)(kv->v_zero + next), 4 * bs);
        }
    }

    /* vector i sees the tokens [ts[i], te[i]) of the slice (its window's start, its position);
     * [tmin, tmax) covers what any vector sees */
    int tmin, tmax, ts[MAX_M], te[MAX_M];
    attn_slice_seen(t, pos, off, n, M, ts, te, &tmin, &tmax);

    /* scores of all M vectors for the token groups g0..g1 of the slice */
    const int g0 = tmin & ~15, g1 = (off + n + 15) & ~15;
    for (int g = g0; g < g1; g += 16) {
        const char *kg = (const char *)kv->k + (slice + g) * rb; /* 16 * rb bytes */
        const char *pf = kn ? kn + g * rb : NULL;
        if (f == DN_KV_F32)
            scores_f32((const float *)kg, D, (const float *)q, M, s + g, bs, pf);
        else if (f == DN_KV_BF16)
            scores_bf16((const uint16_t *)kg, D, (const float *)q, M, s + g, bs, pf);
        else if (f == DN_KV_INT8)
            scores_int8((const int8_t *)kg, D, (const int16_t *)q, M, s + g, bs,
                        kv->k_scale + slice + g, st->qscale + v0, pf);
        else
            scores_uint4((const uint8_t *)kg, D, (const int8_t *)q, M,
                         s + g, bs, kv->k_scale + slice + g, kv->k_zero + slice + g,
                         st->qscale + v0, st->qsum + v0, pf);
    }

    const int ng = (g1 - g0) / 16;
    if (t->softcap > 0.0f)
        for (int i = 0; i < M; i++)
            for (int g = g0; g < g1; g += 16)
                _mm512_storeu_ps(s + i * bs + g, softcap512(_mm512_loadu_ps(s + i * bs + g), t->softcap));

    /* online softmax over the tokens each vector sees, weights 0 elsewhere */
    __mmask16 ok[MAX_M][16]; /* per vector and token group: the tokens it sees */
    float bmax[16];
    for (int i = 0; i < M; i++) {
        const int same = i > 0 && ts[i] == ts[i - 1] && te[i] == te[i - 1];
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int k = 0; k < ng; k++) {
            ok[i][k] = same ? ok[i - 1][k] : tokens_in(g0 + 16 * k, ts[i], te[i]);
            m = _mm512_mask_max_ps(m, ok[i][k], m, _mm512_loadu_ps(s + i * bs + g0 + 16 * k));
        }
        bmax[i] = _mm512_reduce_max_ps(m);
    }
    /* the M vectors side by side in the lanes */
    const __mmask16 lanes = (__mmask16)((1u << M) - 1);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 mo = _mm512_mask_loadu_ps(ninf, lanes, st->mx + v0);
    __m512 mb = _mm512_mask_loadu_ps(ninf, lanes, bmax);
    __m512 mn = _mm512_max_ps(mo, mb);
    /* vectors that saw nothing yet subtract 0, keeping exp(-inf) = 0 and no NaN */
    __m512 muse = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), mn, _mm512_setzero_ps());
    float alpha[16], mu[16], wsc[16], winv[16];
    _mm512_storeu_ps(alpha, exp512(_mm512_sub_ps(mo, muse)));
    _mm512_storeu_ps(mu, muse);
    _mm512_mask_storeu_ps(st->mx + v0, lanes, mn);
    const __mmask16 had = _mm512_cmp_ps_mask(mo, ninf, _CMP_NEQ_OQ); /* acc holds something */
    if (vs) {
        /* int16 weights, one scale per vector: a weight times its V scale is at most
         * e^(block max - max) times the largest V scale of the slice */
        const float wmax = f == DN_KV_UINT4 ? 255.0f : 32767.0f;
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < ng; k++)
            m = _mm512_max_ps(m, _mm512_maskz_loadu_ps(tokens_in(g0 + 16 * k, tmin, tmax), vs + g0 + 16 * k));
        __m512 top = _mm512_mul_ps(exp512(_mm512_sub_ps(mb, muse)), _mm512_set1_ps(_mm512_reduce_max_ps(m)));
        _mm512_storeu_ps(wsc, _mm512_mul_ps(top, _mm512_set1_ps(1.0f / wmax)));
        _mm512_storeu_ps(winv, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(top, _mm512_setzero_ps(), _CMP_GT_OQ),
                                                   _mm512_set1_ps(wmax), top));
    }
    uint8_t *w8 = (uint8_t *)wq; /* uint4 */
    for (int i = 0; i < M; i++) {
        const __m512 m = _mm512_set1_ps(mu[i]), al = _mm512_set1_ps(alpha[i]), inv = _mm512_set1_ps(winv[i]);
        float *sumv = st->sumv + (v0 + i) * 16, *ztv = st->ztv + (v0 + i) * 16;
        __m512 psum = _mm512_mul_ps(_mm512_load_ps(sumv), al), zsum = _mm512_setzero_ps();
        for (int k = 0; k < ng; k++) {
            const int g = g0 + 16 * k;
            const __mmask16 msk = ok[i][k];
            __m512 p = _mm512_maskz_mov_ps(msk, exp512(_mm512_sub_ps(_mm512_loadu_ps(s + i * bs + g), m)));
            psum = _mm512_add_ps(psum, p);
            if (!vs) {
                _mm512_storeu_ps(s + i * bs + g, p);
                continue;
            }
            /* int formats: the weights times the V scales, to int16 */
            __m512i w = _mm512_cvtps_epi32(_mm512_mul_ps(p, _mm512_mul_ps(_mm512_maskz_loadu_ps(msk, vs + g), inv)));
            if (f == DN_KV_INT8) {
                _mm256_storeu_si256((__m256i *)(wq + i * ldw + g), _mm512_cvtepi32_epi16(w));
            } else {
                _mm_storeu_si128((__m128i *)(w8 + i * ldw + g), _mm512_cvtusepi32_epi8(w));
                /* the zero points' share, with the weights as quantized */
                zsum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(w), _mm512_maskz_loadu_ps(msk, vz + g), zsum);
            }
        }
        _mm512_store_ps(sumv, psum);
        if (vz)
            _mm512_store_ps(ztv, _mm512_fmadd_ps(zsum, _mm512_set1_ps(wsc[i]),
                                                 _mm512_mul_ps(_mm512_load_ps(ztv), al)));
        if (alpha[i] != 1.0f && (had >> i & 1))
            for (int d = 0; d < D; d += 16)
                _mm512_store_ps(acc + i * D + d, _mm512_mul_ps(al, _mm512_load_ps(acc + i * D + d)));
    }

    const char *vsl = (const char *)kv->v + slice * rb;
    if (f == DN_KV_F32)
        pv_f32((const float *)vsl, D, s, bs, M, tmin, tmax, acc, vn);
    else if (f == DN_KV_BF16)
        pv_bf16((const uint16_t *)vsl, D, s, bs, M, tmin, tmax, acc, vn);
    else if (f == DN_KV_INT8)
        pv_int8((const int8_t *)vsl, D, wq, ldw, M, tmin & ~1, (tmax + 1) & ~1, wsc, acc, vn);
    else
        pv_uint4((const uint8_t *)vsl, D, w8, ldw, M, tmin & ~3, (tmax + 3) & ~3, wsc, acc, vn);
}

/* vector v's per-lane state (16 lanes) summed */
static inline float state_sum(const float *p, int v) { return _mm512_reduce_add_ps(_mm512_load_ps(p + v * 16)); }

#define DECODE_CHUNK 32
#define DECODE_FITS attn_decode_avx512_fits
#define DECODE_ENTRY attn_decode_avx512
#include "attention_decode_driver.h"

#pragma GCC pop_options
