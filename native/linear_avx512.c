/* Linear layer, AVX-512 + BF16 path: the dispatch between the GEMV (linear_avx512_gemv.c) and
 * the GEMM here, for M > GEMV_MAX_M (batched decode, prefill).
 *
 * Activations are rounded to bf16 once into a copy blocked by MR rows, and a register-blocked
 * vdpbf16ps microkernel (MR rows x 64 columns, 24 zmm accumulators) runs over each panel KC k
 * at a time. i8/u4 slices are first dequantized to bf16 into a per-thread buffer that stays in
 * L2. f32 weights use the same loop nest with an fp32 FMA microkernel on unrounded activations. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include "linear_avx512.h"
#include "glu_avx512.h"

#define MR 6 /* microkernel rows: 6 x 4 accumulators + 4 weight registers */
#ifndef KC
#define KC 2048 /* k per block: a bf16 slice of 64 columns is 256 KB, at home in L2 */
#endif

/* While one weight slice is in use, the next one is prefetched into L2 a few lines per
 * iteration, spread over the row-block calls that share the slice: with few rows (batched
 * decode) the weights come from DRAM, and a slice fetched on demand by the first row block
 * would stall it while the others wait for nothing. */
typedef struct {
    const char *at; /* this call's share of the next slice */
    int64_t iters;  /* iterations that prefetch ... */
    int lines;      /* ... this many cache lines each */
} prefetch;

INLINE void prefetch_step(const prefetch *pf, int64_t i) {
    if (i < pf->iters)
        for (int l = 0; l < pf->lines; l++) _mm_prefetch(pf->at + (i * pf->lines + l) * 64, _MM_HINT_T1);
}

/* The store of an up tile under a GLU: out[r][16v..] = act(out, the gate tile stored there
 * before) * (acc (+ y, the up partial sums of the earlier k blocks, if accumulate)). */
INLINE void store_tile_glu(const int mr, const int nv, __m512 *acc, const float *y, int64_t ldy,
                           int accumulate, float *out, int64_t ldo, dn_act act) {
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m512 u = acc[r * nv + v];
            if (accumulate) u = _mm512_add_ps(u, _mm512_loadu_ps(y + r * ldy + 16 * v));
            float *o = out + r * ldo + 16 * v;
            _mm512_storeu_ps(o, glu_mul_avx512(_mm512_loadu_ps(o), u, act));
        }
}

/* acc[r][v] = sum over kcp pairs of xb[r][kp] . wb[kp][v*16..][2] (vdpbf16ps), then store.
 * xb [mr][kcp] bf16 pairs as uint32; wb [kcp][ldw*16][2] bf16, of which nv*16 columns. */
INLINE void mk_bf16(const int mr, const int nv, int64_t kcp, const uint32_t *xb,
                    const uint16_t *wb, int ldw, float *y, int64_t ldy, int accumulate,
                    const float *bias, int valid, float *glu_out, int64_t ldo, dn_act act,
                    const prefetch *pf) {
    __m512 acc[MR * 4];
    /* unrolled: a loop here becomes a rep stos into a stack copy of acc on every call */
#pragma GCC unroll 24
    for (int i = 0; i < mr * nv; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < kcp; kp++) {
        prefetch_step(pf, kp);
        __m512i w[4];
        for (int v = 0; v < nv; v++) w[v] = _mm512_loadu_si512(wb + (kp * ldw + v) * 32);
        for (int r = 0; r < mr; r++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xb[r * kcp + kp]);
            for (int v = 0; v < nv; v++)
                acc[r * nv + v] = _mm512_dpbf16_ps(acc[r * nv + v], xv, (__m512bh)w[v]);
        }
    }
    if (glu_out) store_tile_glu(mr, nv, acc, y, ldy, accumulate, glu_out, ldo, act);
    else store_tile(mr, nv, acc, y, ldy, accumulate, bias, valid);
}

/* Same loop with fp32 weights [kc][ldw*16] and fp32 activations x [mr][ldx]. */
INLINE void mk_f32(const int mr, const int nv, int64_t kc, const float *x, int64_t ldx,
                   const float *wf, int ldw, float *y, int64_t ldy, int accumulate,
                   const float *bias, int valid, float *glu_out, int64_t ldo, dn_act act,
                   const prefetch *pf) {
    __m512 acc[MR * 4];
    /* unrolled: a loop here becomes a rep stos into a stack copy of acc on every call */
#pragma GCC unroll 24
    for (int i = 0; i < mr * nv; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < kc; kk++) {
        prefetch_step(pf, kk);
        __m512 w[4];
        for (int v = 0; v < nv; v++) w[v] = _mm512_loadu_ps(wf + (kk * ldw + v) * 16);
        for (int r = 0; r < mr; r++) {
            __m512 xv = _mm512_set1_ps(x[r * ldx + kk]);
            /* one broadcast per row: folded into each FMA as {1to16} it would be four loads */
            __asm__("" : "+v"(xv));
            for (int v = 0; v < nv; v++) acc[r * nv + v] = _mm512_fmadd_ps(w[v], xv, acc[r * nv + v]);
        }
    }
    if (glu_out) store_tile_glu(mr, nv, acc, y, ldy, accumulate, glu_out, ldo, act);
    else store_tile(mr, nv, acc, y, ldy, accumulate, bias, valid);
}

typedef struct {
    int64_t kc;                 /* k of this block (even except maybe the last f32 block) */
    const uint32_t *xb;         /* bf16 activations of the row block, [MR][kc/2] */
    const float *x;             /* fp32 activations of the row block, [MR][ldx] at k0 */
    int64_t ldx;
    const void *wt;             /* the weight slice: bf16 [kc/2][width][2] or f32 [kc][width] */
    int ldw;                    /* width / 16 */
    float *y;                   /* output tile, [mr][ldy] at the panel's first column */
    int64_t ldy;
    int accumulate;
    const float *bias;          /* NULL unless this is the last k block */
    int valid;
    float *glu_out;             /* act(gate) * up store of an up tile (store_tile_glu), else NULL */
    int64_t ldo;
    dn_act act;
    prefetch pf;
} mk_args;

#define MK_BF16(MR_, NV) mk_bf16(MR_, NV, a->kc / 2, a->xb, a->wt, a->ldw, a->y, a->ldy, a->accumulate, a->bias, a->valid, a->glu_out, a->ldo, a->act, &a->pf)
#define MK_F32(MR_, NV) mk_f32(MR_, NV, a->kc, a->x, a->ldx, a->wt, a->ldw, a->y, a->ldy, a->accumulate, a->bias, a->valid, a->glu_out, a->ldo, a->act, &a->pf)
#define MK_ROWS(MK) switch (mr) { \
    case 1: switch (nv) { NV_CASES(MK, 1) } break; \
    case 2: switch (nv) { NV_CASES(MK, 2) } break; \
    case 3: switch (nv) { NV_CASES(MK, 3) } break; \
    case 4: switch (nv) { NV_CASES(MK, 4) } break; \
    case 5: switch (nv) { NV_CASES(MK, 5) } break; \
    default: switch (nv) { NV_CASES(MK, 6) } break; }

static void mk_bf16_any(const mk_args *a, int mr, int nv) { MK_ROWS(MK_BF16) }
static void mk_f32_any(const mk_args *a, int mr, int nv) { MK_ROWS(MK_F32) }

/* Dequantize k pairs [kp0, kp1) of an i8/u4 panel to bf16 dst [kp1-kp0][width][2]. */
static void dequant_bf16(const dn_linear_w *w, const uint8_t *panel, int width, int64_t kp0,
                         int64_t kp1, uint16_t *dst) {
    const int u4 = w->wtype == DN_W_U4, halves = width / 8;
    const int64_t gpairs = (w->group + 1) / 2;
    const int64_t rowbytes = u4 ? width : 2 * width;
    float u4_scale[NR], u4_zero[NR];
    for (int64_t kp = kp0; kp < kp1;) {
        int64_t g = kp / gpairs, end = (g + 1) * gpairs < kp1 ? (g + 1) * gpairs : kp1;
        const uint8_t *blk = dn_linear_group_at(w->wtype, w->group, panel, width, g);
        const float *scale = (const float *)blk, *zero = scale + width;
        const uint8_t *codes = blk + dn_linear_group_head(w->wtype, width);
        if (u4) {
            dn_u4_params(panel, blk, width, u4_scale, u4_zero);
            scale = u4_scale, zero = u4_zero;
        }
        __m512 s[8], b[8]; /* w = q * s + b, b = -zero * scale */
        for (int h = 0; h < halves; h++) {
            s[h] = dup_half(scale, h);
            b[h] = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), dup_half(zero, h)), s[h]);
        }
        for (; kp < end; kp++) {
            const uint8_t *row = codes + (kp - g * gpairs) * rowbytes;
            uint16_t *d = dst + (kp - kp0) * width * 2;
            for (int u = 0; u < width / 16; u++) {
                __m512 qa, qb;
                if (u4) {
                    __m512i bytes = bytes_u4(row, u);
                    qa = nibbles(bytes, 0), qb = nibbles(bytes, 1);
                } else {
                    qa = codes_i8(row, 2 * u), qb = codes_i8(row, 2 * u + 1);
                }
                __m512 fa = _mm512_fmadd_ps(qa, s[2 * u], b[2 * u]);
                __m512 fb = _mm512_fmadd_ps(qb, s[2 * u + 1], b[2 * u + 1]);
                _mm512_storeu_si512(d + 32 * u, (__m512i)_mm512_cvtne2ps_pbh(fb, fa));
            }
        }
    }
}

/* Rows of a block of MR, bf16 pairs, laid out [k block][row block][MR][kc/2] so that each
 * microkernel call reads one contiguous tile. Rows past M and k past K are zero. */
static void convert_x(const float *x, int64_t m, int64_t k, int64_t kp, int64_t mpad,
                      uint32_t *xb, int64_t r0, int64_t r1) {
    for (int64_t k0 = 0; k0 < kp; k0 += KC) {
        int64_t kc = kp - k0 < KC ? kp - k0 : KC;
        uint32_t *blk = xb + k0 / 2 * mpad;
        for (int64_t r = r0; r < r1; r++) {
            uint32_t *d = blk + r * (kc / 2);
            for (int64_t kk = 0; kk < kc; kk += 32) {
                int64_t left = r < m ? k - k0 - kk : 0; /* real k left from here */
                __mmask16 lo = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
                __mmask16 hi = left >= 32 ? 0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
                const float *s = x + r * k + k0 + kk;
                __m512 a = _mm512_maskz_loadu_ps(lo, s), b = _mm512_maskz_loadu_ps(hi, s + 16);
                int64_t pairs = (kc - kk) / 2 < 16 ? (kc - kk) / 2 : 16;
                _mm512_mask_storeu_epi32(d + kk / 2, (__mmask16)((1u << pairs) - 1),
                                         (__m512i)_mm512_cvtne2ps_pbh(b, a));
            }
        }
    }
}

static int64_t slice_bytes(void) { return round64(KC * NR * 2); }

static size_t scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) {
    if (m <= GEMV_MAX_M) return dn_avx512_gemv_scratch(w, m);
    if (w->wtype == DN_W_F32) return 0;
    int64_t mpad = (m + MR - 1) / MR * MR;
    int64_t xb = round64(mpad * w->kp * 2);
    return (size_t)(xb + (dn_linear_quantized(w->wtype) ? nthreads * slice_bytes() : 0));
}

/* Where k block [k0, k0+kc) of panel p lies in the packed buffer. */
static const char *slice_span(const dn_linear_w *w, int64_t p, int64_t k0, int64_t kc,
                              int64_t *bytes) {
    int width = dn_linear_width(w, p);
    const char *panel = (const char *)dn_linear_panel(w, p);
    if (!dn_linear_quantized(w->wtype)) {
        int64_t size = w->wtype == DN_W_F32 ? 4 : 2;
        *bytes = kc * width * size;
        return panel + k0 * width * size;
    }
    int64_t gb = dn_linear_group_bytes(w->wtype, w->group, width), ngroups = w->k / w->group;
    int64_t g0 = k0 / w->group, g1 = (k0 + kc + w->group - 1) / w->group;
    *bytes = ((g1 < ngroups ? g1 : ngroups) - g0) * gb;
    return (const char *)dn_linear_group_at(w->wtype, w->group, (const uint8_t *)panel, width, g0);
}

/* Share of the next slice [at, at + bytes) that row block `i` of `calls` prefetches while
 * running `iters` iterations. */
static prefetch prefetch_share(const char *at, int64_t bytes, int64_t i, int64_t calls,
                               int64_t iters) {
    prefetch pf = {NULL, 0, 0};
    int64_t lines = (bytes + 63) / 64, share = (lines + calls - 1) / calls;
    int64_t first = i * share, mine = lines - first < share ? lines - first : share;
    if (!at || mine <= 0 || iters <= 0) return pf;
    pf.lines = (int)((mine + iters - 1) / iters);
    if (pf.lines > 4) pf.lines = 4; /* more than the slice itself streams: let hardware do it */
    pf.iters = (mine + pf.lines - 1) / pf.lines;
    pf.at = at + first * 64;
    return pf;
}

static void gemm(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    int64_t m = c->m, k = w->k, kp = w->kp, n = w->n;
    int64_t mblocks = (m + MR - 1) / MR, mpad = mblocks * MR;
    int f32 = w->wtype == DN_W_F32;
    uint32_t *xb = (uint32_t *)c->scratch;
    uint16_t *slice = (uint16_t *)(c->scratch + round64(mpad * kp * 2) + t * slice_bytes());
    if (!f32) {
        int64_t r0, r1;
        dn_split(mblocks, t, nt, &r0, &r1);
        convert_x(c->x, m, k, kp, mpad, xb, r0 * MR, r1 * MR);
#pragma omp barrier
    }
    /* Under a GLU (c->glu_out) the grid is of gate panels q: each runs as panel q, the gate,
     * stored into glu_out, then panel q + half, the up, whose store turns it into act(g) * u:
     * the same rows on the same thread, the gate tile still in L1. */
    const int glu = c->glu_out != NULL;
    const int64_t half = w->npanels / 2, inter = n / 2;
    int64_t q0, q1, m0, m1;
    dn_linear_part share = dn_linear_share_of(glu ? half : w->npanels, m, MR, t, nt);
    dn_linear_panels(&share, &q0, &q1);
    int64_t kend = f32 ? k : kp;
    for (int64_t q = q0; q < q1; q++) {
        dn_linear_rows(&share, q, &m0, &m1);
        int64_t calls = (m1 - m0 + MR - 1) / MR;
        for (int h = 0; h <= glu; h++) {
            const int64_t p = q + h * half;
            const uint8_t *panel = dn_linear_panel(w, p);
            int width = dn_linear_width(w, p), nv = width / 16;
            mk_args a = {.ldx = k, .ldw = nv, .valid = dn_linear_valid(w, p), .ldo = inter, .act = c->act};
            for (int64_t k0 = 0; k0 < kend; k0 += KC) {
                const int last = k0 + KC >= kend;
                a.kc = last ? kend - k0 : KC;
                a.accumulate = k0 > 0;
                a.bias = last && c->bias ? c->bias + p * NR : NULL;
                if (f32) {
                    a.wt = (const float *)panel + k0 * width;
                } else if (w->wtype == DN_W_BF16) {
                    a.wt = (const uint16_t *)panel + k0 * width;
                } else {
                    dequant_bf16(w, panel, width, k0 / 2, (k0 + a.kc) / 2, slice);
                    a.wt = slice;
                }
                /* the slice this thread reads next: the next k block, the up panel, or the
                 * next (gate) panel's first */
                int64_t next_bytes = 0, np = -1, nk0 = 0;
                if (!last) np = p, nk0 = k0 + KC;
                else if (glu && h == 0) np = q + half;
                else if (q + 1 < q1) np = q + 1;
                const char *next = NULL;
                if (np >= 0) next = slice_span(w, np, nk0, kend - nk0 < KC ? kend - nk0 : KC, &next_bytes);
                for (int64_t r = m0, i = 0; r < m1; r += MR, i++) {
                    int mr = m1 - r < MR ? (int)(m1 - r) : MR;
                    /* the gate tile goes to glu_out; the up tile's partial sums stay in y */
                    a.y = glu && h == 0 ? c->glu_out + r * inter + q * NR : c->y + r * n + p * NR;
                    a.ldy = glu && h == 0 ? inter : n;
                    a.glu_out = glu && h == 1 && last ? c->glu_out + r * inter + q * NR : NULL;
                    /* with one or two row blocks a slice is read too briefly for this to pay:
                     * the hardware prefetcher alone streams it faster (M = 5..8: 4-8% a call) */
                    a.pf = calls >= 3 ? prefetch_share(next, next_bytes, i, calls, f32 ? a.kc : a.kc / 2)
                                      : (prefetch){NULL, 0, 0};
                    if (f32) {
                        a.x = c->x + r * k + k0;
                        mk_f32_any(&a, mr, nv);
                    } else {
                        a.xb = xb + k0 / 2 * mpad + r * (a.kc / 2);
                        mk_bf16_any(&a, mr, nv);
                    }
                }
            }
        }
    }
}

static void run(const dn_linear_call *c, int t, int nt) {
    if (c->m <= GEMV_MAX_M) dn_avx512_gemv(c, t, nt);
    else gemm(c, t, nt);
}

static int fuses_glu(const dn_linear_w *w, int64_t m) { return m > GEMV_MAX_M; }

/* the GEMV shares whole panels; the GEMM (panel, MR rows) units */
static int64_t units(const dn_linear_w *w, int64_t m) {
    return m <= GEMV_MAX_M ? w->npanels : w->npanels * ((m + MR - 1) / MR);
}

const dn_linear_kernels dn_linear_avx512 = {scratch_bytes, run, fuses_glu, units};

#pragma GCC pop_options
