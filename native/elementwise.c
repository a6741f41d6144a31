/* RMSNorm, RoPE and act(gate)*up (the embedding lookup is in embedding.c): AVX-512 / AVX2 /
 * portable, threads over rows.
 *
 * Each kernel is a row (or span) function per ISA plus one driver that picks the function and
 * either runs it inline or in one OpenMP region. Small calls stay on the calling thread: at
 * decode (one token) a parallel region costs more than the work (bench/bench_elementwise.py). */
#include "elementwise.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>

#include "common.h"
#include "glu_avx512.h"

/* Output floats below which a kernel runs on the calling thread. A parallel region costs
 * ~1-2 us on this 2-core VM even with spinning threads; these are the sizes where two threads
 * started to win (threads 1 vs 2, best of many runs). The GLU splits soonest: its exp costs ~20
 * cycles per 16 floats, while RoPE and the embedding copy are nearly free per float.
 * A single row (decode) is never split: RMSNorm would need a cross-thread reduction for it. */
#define RMS_SERIAL_FLOATS 16384
#define ROPE_SERIAL_FLOATS 40960
#define GLU_SERIAL_FLOATS 8192

/* ------------------------------------------------------------------------------------------ */
/* RMSNorm */

typedef void (*rms_row_fn)(const float *x, const float *w, float *res, float *out, int n,
                           float eps);

/* The scale torch computes: mean in fp32, plus eps, then an exact 1/sqrt (not rsqrt14). */
static inline float rms_scale(float sum_sq, int n, float eps) {
    return 1.0f / sqrtf(sum_sq / (float)n + eps);
}

static void rms_row_portable(const float *x, const float *w, float *res, float *out, int n,
                             float eps) {
    double ss = 0.0; /* double: scalar fp32 summation would drift from torch's pairwise sum */
    if (res) {
        for (int i = 0; i < n; i++) {
            float r = res[i] + x[i];
            res[i] = r;
            ss += (double)r * r;
        }
        x = res;
    } else {
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    }
    float s = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * s * w[i];
}

DN_TARGET_AVX2 static void rms_row_avx2(const float *x, const float *w, float *res, float *out,
                                        int n, float eps) {
    /* four accumulators: independent FMA chains, and 32 partial sums keep the error small */
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    float tail = 0.0f;
    int i = 0;
    if (res) {
        for (; i + 32 <= n; i += 32) {
            __m256 a = _mm256_add_ps(_mm256_loadu_ps(res + i), _mm256_loadu_ps(x + i));
            __m256 b = _mm256_add_ps(_mm256_loadu_ps(res + i + 8), _mm256_loadu_ps(x + i + 8));
            __m256 c = _mm256_add_ps(_mm256_loadu_ps(res + i + 16), _mm256_loadu_ps(x + i + 16));
            __m256 d = _mm256_add_ps(_mm256_loadu_ps(res + i + 24), _mm256_loadu_ps(x + i + 24));
            _mm256_storeu_ps(res + i, a);
            _mm256_storeu_ps(res + i + 8, b);
            _mm256_storeu_ps(res + i + 16, c);
            _mm256_storeu_ps(res + i + 24, d);
            s0 = _mm256_fmadd_ps(a, a, s0);
            s1 = _mm256_fmadd_ps(b, b, s1);
            s2 = _mm256_fmadd_ps(c, c, s2);
            s3 = _mm256_fmadd_ps(d, d, s3);
        }
        for (; i + 8 <= n; i += 8) {
            __m256 a = _mm256_add_ps(_mm256_loadu_ps(res + i), _mm256_loadu_ps(x + i));
            _mm256_storeu_ps(res + i, a);
            s0 = _mm256_fmadd_ps(a, a, s0);
        }
        for (; i < n; i++) {
            float r = res[i] + x[i];
            res[i] = r;
            tail += r * r;
        }
        x = res;
    } else {
        for (; i + 32 <= n; i += 32) {
            __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
            __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
            s0 = _mm256_fmadd_ps(a, a, s0);
            s1 = _mm256_fmadd_ps(b, b, s1);
            s2 = _mm256_fmadd_ps(c, c, s2);
            s3 = _mm256_fmadd_ps(d, d, s3);
        }
        for (; i + 8 <= n; i += 8) {
            __m256 a = _mm256_loadu_ps(x + i);
            s0 = _mm256_fmadd_ps(a, a, s0);
        }
        for (; i < n; i++) tail += x[i] * x[i];
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float scale = rms_scale(_mm_cvtss_f32(h) + tail, n, eps);

    __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                                _mm256_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

DN_TARGET_AVX512 static void rms_row_avx512(const float *x, const float *w, float *res,
                                            float *out, int n, float eps) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    if (res) {
        for (; i + 64 <= n; i += 64) {
            __m512 a = _mm512_add_ps(_mm512_loadu_ps(res + i), _mm512_loadu_ps(x + i));
            __m512 b = _mm512_add_ps(_mm512_loadu_ps(res + i + 16), _mm512_loadu_ps(x + i + 16));
            __m512 c = _mm512_add_ps(_mm512_loadu_ps(res + i + 32), _mm512_loadu_ps(x + i + 32));
            __m512 d = _mm512_add_ps(_mm512_loadu_ps(res + i + 48), _mm512_loadu_ps(x + i + 48));
            _mm512_storeu_ps(res + i, a);
            _mm512_storeu_ps(res + i + 16, b);
            _mm512_storeu_ps(res + i + 32, c);
            _mm512_storeu_ps(res + i + 48, d);
            s0 = _mm512_fmadd_ps(a, a, s0);
            s1 = _mm512_fmadd_ps(b, b, s1);
            s2 = _mm512_fmadd_ps(c, c, s2);
            s3 = _mm512_fmadd_ps(d, d, s3);
        }
        for (; i < n; i += 16) {
            __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
            __m512 a = _mm512_add_ps(_mm512_maskz_loadu_ps(m, res + i),
                                     _mm512_maskz_loadu_ps(m, x + i));
            _mm512_mask_storeu_ps(res + i, m, a);
            s0 = _mm512_fmadd_ps(a, a, s0);
        }
        x = res;
    } else {
        for (; i + 64 <= n; i += 64) {
            __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
            __m512 c = _mm512_loadu_ps(x + i + 32), d = _mm512_loadu_ps(x + i + 48);
            s0 = _mm512_fmadd_ps(a, a, s0);
            s1 = _mm512_fmadd_ps(b, b, s1);
            s2 = _mm512_fmadd_ps(c, c, s2);
            s3 = _mm512_fmadd_ps(d, d, s3);
        }
        for (; i < n; i += 16) {
            __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
            __m512 a = _mm512_maskz_loadu_ps(m, x + i);
            s0 = _mm512_fmadd_ps(a, a, s0);
        }
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    __m512 vs = _mm512_set1_ps(rms_scale(sum, n, eps));
    for (i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, w + i)));
    }
}

void dn_rms_norm(const float *x, const float *weight, float *residual, float *out, int M, int N,
                 float eps) {
    dn_isa_t isa = dn_isa();
    rms_row_fn row = isa == DN_ISA_AVX512 ? rms_row_avx512
                     : isa == DN_ISA_AVX2 ? rms_row_avx2
                                          : rms_row_portable;
    int nt = dn_team_for((long)M * N, RMS_SERIAL_FLOATS);
    if (nt == 1 || M == 1) {
        for (int m = 0; m < M; m++)
            row(x + (size_t)m * N, weight, residual ? residual + (size_t)m * N : NULL,
                out + (size_t)m * N, N, eps);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int m = 0; m < M; m++)
        row(x + (size_t)m * N, weight, residual ? residual + (size_t)m * N : NULL,
            out + (size_t)m * N, N, eps);
}

static inline float xielu(float x, const float *p) {
    return x > 0.0f ? p[0] * x * x + p[2] * x : (expm1f(x < p[3] ? x : p[3]) - x) * p[1] + p[2] * x;
}

void dn_act_rows(const float *x, float *out, long n, dn_act act, const float *params) {
    int nt = dn_team_for(n, RMS_SERIAL_FLOATS);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (long i = 0; i < n; i++)
        out[i] = act == DN_ACT_RELU2   ? (x[i] > 0.0f ? x[i] * x[i] : 0.0f)
                 : act == DN_ACT_XIELU ? xielu(x[i], params)
                                       : dn_glu_scalar(x[i], 1.0f, act);
}

/* LayerNorm's row in double sums (as rms_row_portable; only the LayerNorm families use it: two rows
 * a layer, off the MLP's and attention's hot loops) */
static void layer_row(const float *x, const float *w, const float *b, float *res, float *out, int n, float eps) {
    double sum = 0.0, ss = 0.0;
    if (res) {
        for (int i = 0; i < n; i++) res[i] += x[i];
        x = res;
    }
    for (int i = 0; i < n; i++) sum += x[i];
    const float mean = (float)(sum / n);
    for (int i = 0; i < n; i++) ss += (double)(x[i] - mean) * (x[i] - mean);
    const float s = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] - mean) * s * w[i] + (b ? b[i] : 0.0f);
}

void dn_layer_norm(const float *x, const float *weight, const float *bias, float *residual, float *out, int M, int N,
                   float eps) {
    int nt = dn_team_for((long)M * N, RMS_SERIAL_FLOATS);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && M > 1)
    for (int m = 0; m < M; m++)
        layer_row(x + (size_t)m * N, weight, bias, residual ? residual + (size_t)m * N : NULL, out + (size_t)m * N,
                  N, eps);
}

/* ------------------------------------------------------------------------------------------ */
/* RoPE */

/* Rotates `heads` consecutive heads of D floats by one position's cos (cs) and sin (cs + R/2):
 * the first R dims of each head, as pairs (j, j + R/2); dims R..D-1 pass through. */
typedef void (*rope_heads_fn)(float *x, int heads, const float *cs, int D, int R);

static void rope_heads_portable(float *x, int heads, const float *cs, int D, int R) {
    int h = R / 2;
    const float *sn = cs + h;
    for (int head = 0; head < heads; head++, x += D)
        for (int j = 0; j < h; j++) {
            float a = x[j], b = x[j + h];
            x[j] = a * cs[j] - b * sn[j];
            x[j + h] = b * cs[j] + a * sn[j];
        }
}

DN_TARGET_AVX2 static void rope_heads_avx2(float *x, int heads, const float *cs, int D, int R) {
    int h = R / 2;
    const float *sn = cs + h;
    for (int head = 0; head < heads; head++, x += D) {
        int j = 0;
        for (; j + 8 <= h; j += 8) {
            __m256 c = _mm256_loadu_ps(cs + j), s = _mm256_loadu_ps(sn + j);
            __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + h + j);
            _mm256_storeu_ps(x + j, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
            _mm256_storeu_ps(x + h + j, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
        }
        for (; j < h; j++) {
            float a = x[j], b = x[j + h];
            x[j] = a * cs[j] - b * sn[j];
            x[j + h] = b * cs[j] + a * sn[j];
        }
    }
}

DN_TARGET_AVX512 static void rope_heads_avx512(float *x, int heads, const float *cs, int D, int R) {
    int h = R / 2;
    const float *sn = cs + h;
    for (int head = 0; head < heads; head++, x += D)
        for (int j = 0; j < h; j += 16) {
            __mmask16 m = h - j >= 16 ? 0xffff : (__mmask16)((1u << (h - j)) - 1);
            __m512 c = _mm512_maskz_loadu_ps(m, cs + j), s = _mm512_maskz_loadu_ps(m, sn + j);
            __m512 a = _mm512_maskz_loadu_ps(m, x + j), b = _mm512_maskz_loadu_ps(m, x + h + j);
            _mm512_mask_storeu_ps(x + j, m, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
            _mm512_mask_storeu_ps(x + h + j, m, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
        }
}

static void rope_tokens(rope_heads_fn heads, float *q, int n_heads, long ldq, float *k,
                        int n_kv_heads, long ldk, const int32_t *positions, const float *cos_sin,
                        int t0, int t1, int D, int R) {
    for (int t = t0; t < t1; t++) {
        const float *cs = cos_sin + (size_t)positions[t] * R;
        heads(q + (size_t)t * ldq, n_heads, cs, D, R);
        if (k) heads(k + (size_t)t * ldk, n_kv_heads, cs, D, R);
    }
}

void dn_rope(float *q, int n_heads, long ldq, float *k, int n_kv_heads, long ldk,
             const int32_t *positions, const float *cos_sin, int T, int D, int R) {
    dn_isa_t isa = dn_isa();
    rope_heads_fn heads = isa == DN_ISA_AVX512 ? rope_heads_avx512
                          : isa == DN_ISA_AVX2 ? rope_heads_avx2
                                               : rope_heads_portable;
    if (!k) n_kv_heads = 0;
    int nt = dn_team_for((long)T * (n_heads + n_kv_heads) * R, ROPE_SERIAL_FLOATS);
    if (nt == 1 || T == 1) {
        rope_tokens(heads, q, n_heads, ldq, k, n_kv_heads, ldk, positions, cos_sin, 0, T, D, R);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int id = omp_get_thread_num(), n = omp_get_num_threads();
        rope_tokens(heads, q, n_heads, ldq, k, n_kv_heads, ldk, positions, cos_sin,
                    (int)((long)T * id / n), (int)((long)T * (id + 1) / n), D, R);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* act(gate) * up (glu.h) */

typedef void (*glu_span_fn)(const float *gate, const float *up, float *out, int n, dn_act act);

static void glu_span_portable(const float *gate, const float *up, float *out, int n, dn_act act) {
    for (int i = 0; i < n; i++) out[i] = dn_glu_scalar(gate[i], up[i], act);
}

DN_TARGET_AVX2 static inline __m256 exp_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

DN_TARGET_AVX2 static void glu_span_avx2(const float *gate, const float *up, float *out, int n,
                                         dn_act act) {
    const __m256 one = _mm256_set1_ps(1.0f), limit = _mm256_set1_ps(SWIGLU_LIMIT);
    const int gelu = act == DN_ACT_GELU_TANH, clamped = act == DN_ACT_CLAMPED_SWIGLU;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
        if (clamped) { /* vminps/vmaxps return the second operand on NaN: g, u */
            g = _mm256_min_ps(limit, g);
            u = _mm256_add_ps(_mm256_max_ps(_mm256_set1_ps(-SWIGLU_LIMIT), _mm256_min_ps(limit, u)), one);
        }
        __m256 z = clamped ? _mm256_mul_ps(g, _mm256_set1_ps(SWIGLU_ALPHA)) : g;
        if (gelu)
            z = _mm256_mul_ps(g, _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(GELU_Z3),
                                                 _mm256_set1_ps(GELU_Z1)));
        __m256 neg = _mm256_sub_ps(_mm256_setzero_ps(), z);
        __m256 keep = _mm256_cmp_ps(neg, _mm256_set1_ps(EXP_HI), _CMP_NGT_UQ); /* NaN kept */
        __m256 e = exp_avx2(neg);
        __m256 s = _mm256_and_ps(keep, _mm256_div_ps(g, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, u));
    }
    if (i < n) glu_span_portable(gate + i, up + i, out + i, n - i, act);
}

DN_TARGET_AVX512 static void glu_span_avx512(const float *gate, const float *up, float *out,
                                             int n, dn_act act) {
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 s = glu_mul_avx512(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i), act);
        _mm512_mask_storeu_ps(out + i, m, s);
    }
}

/* Elements [lo, hi) of the flattened [M, I] output. */
static void glu_range(glu_span_fn span, const float *gate_up, float *out, long lo, long hi, int I,
                      dn_act act) {
    while (lo < hi) {
        long m = lo / I, c = lo % I;
        int n = (int)(hi - lo < I - c ? hi - lo : I - c);
        const float *g = gate_up + (size_t)m * 2 * I + c;
        span(g, g + I, out + (size_t)m * I + c, n, act);
        lo += n;
    }
}

static glu_span_fn glu_span(void) {
    dn_isa_t isa = dn_isa();
    return isa == DN_ISA_AVX512 ? glu_span_avx512 : isa == DN_ISA_AVX2 ? glu_span_avx2 : glu_span_portable;
}

void dn_glu_row(const float *gate, const float *up, float *out, int n, dn_act act) {
    glu_span()(gate, up, out, n, act);
}

void dn_glu_mul(const float *gate_up, float *out, int M, int I, dn_act act) {
    glu_span_fn span = glu_span();
    long total = (long)M * I;
    int nt = dn_team_for(total, GLU_SERIAL_FLOATS);
    if (nt == 1) {
        glu_range(span, gate_up, out, 0, total, I, act);
        return;
    }
    /* split the flattened output, not rows: one decode row of 11008 is worth two threads */
#pragma omp parallel num_threads(nt)
    {
        int id = omp_get_thread_num(), n = omp_get_num_threads();
        long chunk = (total + n - 1) / n;
        chunk = (chunk + 15) & ~15L; /* whole vectors per thread */
        long lo = id * chunk, hi = lo + chunk < total ? lo + chunk : total;
        glu_range(span, gate_up, out, lo, hi, I, act);
    }
}
