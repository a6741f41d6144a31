/* What linear.c (the driver) and the per-ISA kernel files share: one call's arguments, the
 * kernel table each ISA file exports, and helpers over the packed layout (see linear.h). */
#pragma once
#include "common.h"
#include "linear.h"

typedef struct {
    const dn_linear_w *w;
    const float *x;      /* [m][k] */
    int64_t m;
    const float *bias;   /* [n] or NULL */
    float *y;            /* [m][n] */
    uint8_t *scratch;    /* scratch_bytes(w, m, nthreads) bytes, 64-byte aligned, shared by the team */
    float *glu_out;      /* NULL, or [m][n/2]: act(gate) * up of a gate_up weight (gate rows
                          * then up rows, n/2 a multiple of DN_LINEAR_NR); y then holds at
                          * most the up half's partial sums across k blocks (dn_linear_glu) */
    dn_act act;          /* the gate's activation, with glu_out */
} dn_linear_call;

typedef struct {
    /* Scratch one call needs (converted activations, per-thread weight buffers). */
    size_t (*scratch_bytes)(const dn_linear_w *w, int64_t m, int nthreads);
    /* Called by every thread of one parallel region; may use `#pragma omp barrier`. */
    void (*run)(const dn_linear_call *c, int tid, int nthreads);
    /* NULL, or whether run() applies act(gate) * up as its store (dn_linear_call.glu_out) at m rows. */
    int (*fuses_glu)(const dn_linear_w *w, int64_t m);
    /* NULL, or the (panel, row block) units run() shares out at m rows: threads past it would
     * only fork and join (a 1536 x 256 GEMV is 4 panels, whatever the cores). */
    int64_t (*units)(const dn_linear_w *w, int64_t m);
} dn_linear_kernels;

extern const dn_linear_kernels dn_linear_portable, dn_linear_avx2, dn_linear_avx512;
/* bf16, i8q and u4q weights on AMX tiles, or their emulation (linear_amx.c, amx.h) */
extern const dn_linear_kernels dn_linear_amx;
/* The kernels w runs on without AMX (those of the ISA path, its int8 or its mxfp4 kernels). */
const dn_linear_kernels *dn_linear_fallback_kernels(const dn_linear_w *w);
/* i8q/u4q (linear_q8.c, linear_q8_avx2.c, linear_q8_vnni.c) */
extern const dn_linear_kernels dn_linear_q8_portable, dn_linear_q8_avx2, dn_linear_q8_vnni;
/* mxfp4 (linear_mxfp4_avx2.c, linear_mxfp4_avx512.c; the portable path reads it too) */
extern const dn_linear_kernels dn_linear_mxfp4_avx2, dn_linear_mxfp4_avx512;

/* An mxfp4 weight is e2m1(code) * 2^(e - 127), computed as (2 e2m1(code)) * 2^(e - 128): both
 * factors are floats for every code and every e (2^-128 is a subnormal, 2^127 the largest power),
 * so the one rounding is the product's, which is exact but past float's range (inf) -- the very
 * value of transformers' ldexp(e2m1, e - 127), e = 255 included (which the OCP spec calls NaN). */
static const float dn_e2m1_twice[16] = {0.0f,  1.0f,  2.0f,  3.0f,  4.0f,  6.0f,  8.0f,  12.0f,
                                        -0.0f, -1.0f, -2.0f, -3.0f, -4.0f, -6.0f, -8.0f, -12.0f};

/* 2^(e - 128) as a float: biased exponent e - 1, or the subnormals 2^-127 (e = 1), 2^-128 (e = 0). */
static inline float dn_e8m0_half(uint8_t e) {
    uint32_t u = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One i8q/u4q panel (the rest of dn_linear_pack, linear_q8.c); e: dn_q8_scale_exp. */
void dn_linear_pack_q8_panel(uint8_t *dst, dn_wtype t, int64_t n, int64_t k, int64_t group, int64_t n0,
                             int width, const void *w, const void *scales, const void *zeros,
                             const float *row_scales, int e);
/* A u4/u4q panel's row scales and group heads (linear.c); returns its first group block. */
uint8_t *dn_linear_pack_u4_heads(uint8_t *dst, dn_wtype t, int64_t n, int64_t k, int64_t group, int64_t n0,
                                 int width, const uint8_t *scales, const uint8_t *zeros, const float *row_scales);
/* fp16 bits as a float (i8q's group parameters) */
float dn_f16_to_f32(uint16_t h);
/* Pairs [p0, p1) of an i8q/u4q panel `width` wide as AMX's B operand, the bf16 panel layout
 * [p1 - p0][width] (bf16 of each weight's float value, rounded to nearest even); p0 and p1
 * multiples of 16 (32 k). On the AVX-512 path or, for AMX's emulation elsewhere, portably
 * (linear_amx_panels.c). */
void dn_amx_panel_pairs(const dn_linear_w *w, const uint8_t *panel, int width, int64_t p0, int64_t p1,
                        uint32_t *out, int avx512);

/* The header's scale_exp of i8q scales, zeros [n][ng] (linear.h), within DN_Q8_MAX_EXP. */
#define DN_Q8_MAX_EXP 120
int dn_q8_scale_exp(int64_t n, int64_t ng, const float *scales, const float *zeros);

/* The activations of an i8q/u4q call, quantized (scratch shared by the team): xq [m][k] int8,
 * xd [m][k/32] block scales, xs [m][k/32] block sums of xq (the AVX2 i8q kernel's), xg
 * [m][k/group] per-group sums of xhat = xd * xq. */
typedef struct {
    int8_t *xq;
    float *xd, *xg;
    int32_t *xs;
} dn_q8_act;
size_t dn_q8_act_bytes(const dn_linear_w *w, int64_t m);
dn_q8_act dn_q8_act_at(const dn_linear_w *w, int64_t m, uint8_t *scratch);
typedef int (*dn_q8_quantizer)(const float *x, int8_t *q, float *d); /* 32 floats; sum of codes */
int dn_q8_quantize_block(const float *x, int8_t *q, float *d);
/* Called by every thread of the call's team: quantizes every row of x into the thread's own
 * copy. Redundant work (~1% of a call), but no barrier: on a busy host a barrier waits for a
 * descheduled thread, which cost a 135M uint4 decode step 1.2 s at load 15 (vs 0.12 s bf16). */
dn_q8_act dn_q8_prepare(const dn_linear_call *c, int t, int nt, dn_q8_quantizer quantize_block);
size_t dn_q8_scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads);

/* [*lo, *hi): thread t's contiguous share of n items. */
static inline void dn_split(int64_t n, int t, int nt, int64_t *lo, int64_t *hi) {
    *lo = n * t / nt;
    *hi = n * (t + 1) / nt;
}

static inline const uint8_t *dn_linear_panel(const dn_linear_w *w, int64_t p) {
    return w->data + p * w->panel_bytes;
}

/* How one call divides its work: the grid of (panel, block of `mr` rows), panel-major, cut
 * into near-equal contiguous shares. A share may begin or end inside a panel, so 9 panels on
 * 2 threads split 4.5 + 4.5 rather than 5 + 4 (a 10% longer call); with one row block it is
 * whole panels, as a GEMV needs. */
typedef struct {
    int64_t u0, u1;  /* units [u0, u1) of the grid */
    int64_t mblocks; /* row blocks per panel */
    int64_t m;
    int mr;
} dn_linear_part;

static inline dn_linear_part dn_linear_share_of(int64_t npanels, int64_t m, int mr, int t, int nt) {
    dn_linear_part s = {0, 0, (m + mr - 1) / mr, m, mr};
    dn_split(npanels * s.mblocks, t, nt, &s.u0, &s.u1);
    return s;
}
static inline dn_linear_part dn_linear_share(const dn_linear_w *w, int64_t m, int mr, int t, int nt) {
    return dn_linear_share_of(w->npanels, m, mr, t, nt);
}

/* The panels [*p0, *p1) a share touches. */
static inline void dn_linear_panels(const dn_linear_part *s, int64_t *p0, int64_t *p1) {
    *p0 = s->u0 / s->mblocks;
    *p1 = s->u1 > s->u0 ? (s->u1 + s->mblocks - 1) / s->mblocks : *p0;
}

/* The rows [*m0, *m1) of panel p that a share computes. */
static inline void dn_linear_rows(const dn_linear_part *s, int64_t p, int64_t *m0, int64_t *m1) {
    int64_t first = p * s->mblocks, b0 = s->u0 > first ? s->u0 - first : 0;
    int64_t b1 = s->u1 - first < s->mblocks ? s->u1 - first : s->mblocks;
    *m0 = b0 * s->mr;
    *m1 = b1 * s->mr < s->m ? b1 * s->mr : s->m;
}

/* Batched i8q/u4q calls take a panel DN_Q8_CHUNK_K k at a time, every tile of up to
 * DN_Q8_ROW_BLOCK rows over a chunk (from L1) before the next, whose cache lines the tiles ask of
 * L2 meanwhile, a few per group each (linear_q8_vnni.c, linear_q8_avx2.c). */
#define DN_Q8_CHUNK_K 256  /* 64 columns x 256 k: 16 KB of i8q codes */
#define DN_Q8_ROW_BLOCK 32 /* their sums between chunks: 8 KB */
typedef struct {
    const char *at;
    int lines; /* per group */
} dn_q8_ahead;

/* The lines of the chunk after groups [g0, g1) of panel p (the next panel's head and first chunk
 * after the last; none after the thread's last panel p1 - 1), shared out over `calls` tile calls. */
typedef struct {
    const char *next;
    int64_t lines, groups; /* lines in all; groups a call runs */
    int per_group;
} dn_q8_prefetch;

static inline dn_q8_prefetch dn_q8_prefetch_plan(const dn_linear_w *w, int64_t p, int64_t p1, int width, int64_t g0,
                                                 int64_t g1, int64_t chunk, int on, int64_t calls) {
    const int64_t ng = w->k / w->group;
    const uint8_t *panel = dn_linear_panel(w, p);
    dn_q8_prefetch f = {NULL, 0, g1 - g0, 0};
    if (g1 < ng) {
        f.next = (const char *)dn_linear_group_at(w->wtype, w->group, panel, width, g1);
        f.lines = (g1 + chunk < ng ? chunk : ng - g1) * dn_linear_group_bytes(w->wtype, w->group, width) / 64;
    } else if (p + 1 < p1) {
        f.next = (const char *)dn_linear_panel(w, p + 1);
        f.lines = (dn_linear_group_at(w->wtype, w->group, panel, width, chunk < ng ? chunk : ng) - panel) / 64;
    }
    if (!on) f.lines = 0;
    f.per_group = (int)((f.lines + calls * f.groups - 1) / (calls * f.groups));
    return f;
}

/* Tile call `call`'s share of the plan. */
static inline dn_q8_ahead dn_q8_ahead_of(const dn_q8_prefetch *f, int64_t call) {
    const int64_t first = call * f->groups * f->per_group;
    return (dn_q8_ahead){f->lines ? f->next + first * 64 : NULL, first < f->lines ? f->per_group : 0};
}
