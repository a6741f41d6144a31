/* Linear layer y[M,N] = x[M,K] . W[N,K]^T (+ bias[N]): fp32 activations, weights fp32, bf16,
 * int8 or uint4 with per-group asymmetric quantization along K (w = (q - zero) * scale), or
 * MXFP4 (OCP microscaling: 4-bit e2m1 codes, one e8m0 power-of-two scale per 32 k; gpt-oss's
 * checkpoints store their experts so, and they are packed as stored, never re-quantized).
 *
 * Weights are packed once into a self-describing buffer: a 64-byte header, then panels of
 * DN_LINEAR_NR output columns (the last one narrower, a multiple of 16; columns past N are zero),
 * each panel holding all of K contiguously so a thread streams it front to back:
 *   f32   [K][w] float
 *   bf16  [K/2][w][2] bf16 bits: pairs of consecutive k per column, the vdpbf16ps operand order
 *   i8    per group: scale[w] float, zero[w] float, codes [G/2][w][2] uint8
 *   u4    the panel's row scales d[w] float, then per group: scale codes sc[w] uint8, zero codes
 *         zc[w] uint8 (w = (q - zc/16) * (d * sc), d * sc rounded to float), codes
 *         [G/2][w/16][16] bytes; byte j of a 16-column chunk holds element j of (cols 0..7 x k
 *         pair) in its low nibble and of (cols 8..15 x k pair) in its high nibble, so one byte
 *         load feeds two 16-lane registers. 4.5 + 32/K bits a weight in groups of 32 (4.516 at
 *         K 2048, 4.542 at 768): fp32 pairs per group (6 bits) kept Qwen3-30B-A3B out of 24 GiB.
 *   i8q   per group: scale[w] fp16, scale*zero[w] fp16, codes [G/4][w][4] uint8: quads of
 *         consecutive k per column, the vpdpbusd operand order
 *   u4q   u4's row scales and group heads, codes [G/8][w][4] bytes: byte i of column c in row j
 *         holds k = 8j + i in its low nibble and k = 8j + 4 + i in its high one
 *   mxfp4 per group of 32 k: codes [4][w] uint32, word j of column c holding k = 8j + i in its
 *         nibble i (the checkpoint's bytes of that row and block, 4 at a time), then the e8m0
 *         scales [w] uint8 (w = e2m1(code) * 2^(scale - 127)): 17 bytes per 32 weights. One
 *         32-bit lane of codes feeds 8 k of a column by shifting 4 bits a step.
 *   The fp16 pairs of i8q hold scale * 2^e and scale*zero * 2^e, e (header scale_exp) one
 *   power of two per weight that puts its largest such value in [2^14, 2^15): fp16's 5-bit
 *   exponent then spans the weight's own range (no overflow, no underflow for the 2^28 below it)
 *   and the kernels multiply each output by 2^-e (exact). Half the bytes of fp32 scales: int8 g64
 *   streams 8.5 bits a weight instead of 9; the rounding costs at most 2^-11 of each scale, 1/16
 *   of an int8 code step.
 *   The kernels expand a u4/u4q group's codes into the fp32 (scale, zero) they fix up with once
 *   per group and panel (dn_u4_params: 2 values per column against 32 codes), so every path
 *   reads one layout. The quantizer (dashinfer_client/model/quant.py, linear_quantize.c) picks
 *   sc and zc per group by the least squared error among 9 candidates, which on the default
 *   model's weights lands nearer the source grid than one min/max rule does.
 * K is padded to even with zero weights (and zero activations). The layout does not depend on
 * the ISA: a buffer packed once runs on every path.
 *
 * i8q and u4q compute with int8 activations (linear_q8.c): each row of x is quantized on the fly
 * per block of 32 k, x ~ d * xq with d = max|x| / 127, and w . x is summed as
 * sum_groups (scale * sum_blocks d * (q . xq) - scale*zero * sum xhat), the integer dot products
 * on vpdpbusd where the CPU has AVX512-VNNI. The error against fp32 x is that of xhat = d * xq
 * (at most d / 2 per element); i8/u4 stay exact, the path for CPUs without VNNI. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "glu.h"

typedef enum { DN_W_F32 = 0, DN_W_BF16 = 1, DN_W_I8 = 2, DN_W_U4 = 3, DN_W_I8Q = 4, DN_W_U4Q = 5,
               DN_W_MXFP4 = 6 } dn_wtype;

#define DN_LINEAR_NR 64          /* output columns per panel */
#define DN_LINEAR_HEADER 64      /* header bytes; panels start 64-byte aligned after it */
#define DN_LINEAR_VERSION 3  /* 2: fp16 group scales of i8q/u4q; 3: u4/u4q's 8-bit group codes */
#define DN_Q8_BLOCK 32           /* k per activation quantization block of i8q/u4q */
#define DN_MXFP4_GROUP 32        /* k per e8m0 scale of mxfp4 */

typedef struct {
    char magic[8];        /* "DNLINEAR" */
    uint32_t version;
    uint32_t wtype;       /* dn_wtype */
    int64_t n, k;
    int64_t group;        /* quantization group along K; 0 for f32/bf16, 32 for mxfp4 */
    int32_t nr;           /* DN_LINEAR_NR at pack time */
    int32_t scale_exp;    /* e of i8q (layout above); 0 for the others */
    int64_t panel_bytes;  /* bytes of one full-width panel */
    int64_t data_bytes;   /* bytes after the header */
} dn_linear_header;

/* A validated packed weight, as the kernels see it. */
typedef struct {
    dn_wtype wtype;
    int64_t n, k, group;
    int64_t kp;           /* K rounded up to even */
    int64_t npanels;
    int64_t panel_bytes;  /* stride between panels */
    float unscale;        /* i8q: 2^-scale_exp, the factor of every output; else 1 */
    const uint8_t *data;  /* first panel */
} dn_linear_w;

static inline int dn_linear_act_quantized(dn_wtype t) { return t == DN_W_I8Q || t == DN_W_U4Q; }
static inline int dn_linear_quantized(dn_wtype t) { return t == DN_W_I8 || t == DN_W_U4 || dn_linear_act_quantized(t); }
static inline int dn_linear_nibbles(dn_wtype t) { return t == DN_W_U4 || t == DN_W_U4Q; }

/* Columns of panel p (a multiple of 16) and how many of them are real outputs. */
static inline int dn_linear_width(const dn_linear_w *w, int64_t p) {
    int64_t n16 = (w->n + 15) / 16 * 16;
    int64_t left = n16 - p * DN_LINEAR_NR;
    return (int)(left < DN_LINEAR_NR ? left : DN_LINEAR_NR);
}
static inline int dn_linear_valid(const dn_linear_w *w, int64_t p) {
    int64_t left = w->n - p * DN_LINEAR_NR;
    return (int)(left < DN_LINEAR_NR ? left : DN_LINEAR_NR);
}

/* Bytes of one mxfp4 group block of a panel `width` wide: 16 code bytes and a scale a column. */
static inline int64_t dn_linear_mxfp4_group_bytes(int width) { return 17 * (int64_t)width; }

/* Bytes ahead of a panel's first group block: u4/u4q's row scales (a multiple of 64). */
static inline int64_t dn_linear_panel_head(dn_wtype t, int width) {
    return dn_linear_nibbles(t) ? 4 * (int64_t)width : 0;
}

/* Bytes of a group block's scales (and zeros) ahead of its codes: fp32 pairs for i8, fp16
 * pairs for i8q, uint8 scale and zero codes for u4/u4q. */
static inline int64_t dn_linear_group_head(dn_wtype t, int width) {
    return (dn_linear_nibbles(t) ? 2 : t == DN_W_I8Q ? 4 : 8) * (int64_t)width;
}

/* Bytes of one quantization group block of a panel `width` wide (i8/u4/i8q/u4q). */
static inline int64_t dn_linear_group_bytes(dn_wtype t, int64_t group, int width) {
    int64_t pairs = (group + 1) / 2;
    return dn_linear_group_head(t, width) + pairs * 2 * width / (dn_linear_nibbles(t) ? 2 : 1);
}

/* Group block g of a quantized panel `width` wide. */
static inline const uint8_t *dn_linear_group_at(dn_wtype t, int64_t group, const uint8_t *panel, int width,
                                                int64_t g) {
    return panel + dn_linear_panel_head(t, width) + g * dn_linear_group_bytes(t, group, width);
}

/* Column c's fp32 scale and zero in a u4/u4q group block `blk` of `panel` (w = (q - zero) * scale). */
static inline float dn_u4_scale(const uint8_t *panel, const uint8_t *blk, int c) {
    return ((const float *)panel)[c] * (float)blk[c];
}
static inline float dn_u4_zero(const uint8_t *blk, int width, int c) { return (float)blk[width + c] * 0.0625f; }

/* Every column's: scale[width], zero[width], what the kernels' fix-ups read, worked out once per
 * group and panel. */
static inline void dn_u4_params(const uint8_t *panel, const uint8_t *blk, int width, float *scale,
                                float *zero) {
    for (int c = 0; c < width; c++) {
        scale[c] = dn_u4_scale(panel, blk, c);
        zero[c] = dn_u4_zero(blk, width, c);
    }
}

/* Why (wtype, n, k, group) cannot be packed, or NULL when it can. */
const char *dn_linear_check_shape(dn_wtype t, int64_t n, int64_t k, int64_t group);

/* Total bytes of the packed buffer (header included); shape must pass dn_linear_check_shape. */
int64_t dn_linear_packed_bytes(dn_wtype t, int64_t n, int64_t k, int64_t group);

/* Pack into dst (64-byte aligned, dn_linear_packed_bytes long).
 * w: f32 float[n][k] | bf16 uint16[n][k] | i8, i8q uint8[n][k] | u4, u4q, mxfp4 uint8[n][k/2] (low
 * nibble = even k; mxfp4: the checkpoint's blocks [n][k/32][16] as they are)
 * scales: float[n][k/group] for i8/i8q, uint8 scale codes [n][k/group] for u4/u4q, uint8 e8m0
 * [n][k/32] for mxfp4; zeros: float [n][k/group] for i8/i8q, uint8 zero codes (1/16 units) for
 * u4/u4q; row_scales: float [n] for u4/u4q; else unused. */
void dn_linear_pack(uint8_t *dst, dn_wtype t, int64_t n, int64_t k, int64_t group, const void *w,
                    const void *scales, const void *zeros, const float *row_scales);

/* The weight a packed buffer of f32, bf16, i8, u4 or mxfp4 holds, dequantized exactly into dst
 * float[n][k] (the portable path's reading of the layout). */
void dn_linear_unpack(const dn_linear_w *w, float *dst);

/* Check a packed buffer of `len` bytes and describe it; NULL or the reason it is not one. */
const char *dn_linear_open(dn_linear_w *w, const uint8_t *buf, size_t len);

/* y[m][n] = x[m][k] . W^T (+ bias[n]). x: [m][k], bias: [n] or NULL, y: [m][n].
 * Uses the ISA path dn_isa() and dn_num_threads() threads; safe to call from several threads.
 * Returns 0, or -1 when its scratch memory cannot be allocated. */
int dn_linear(const dn_linear_w *w, const float *x, int64_t m, const float *bias, float *y);

/* One of several independent linears y[m][n] = x[m][k] . W^T (+ bias[n]) run together. */
typedef struct {
    const dn_linear_w *w;
    const float *x;      /* [m][k] */
    int64_t m;
    const float *bias;   /* [n] or NULL */
    float *y;            /* [m][n] */
} dn_linear_job;

/* The n jobs in one parallel region: every thread runs its share of each in turn (each job
 * with scratch of its own, so a thread goes on to the next without waiting), which saves a
 * fork and join per job where there are many small ones (a decode step's chosen experts).
 * Returns 0, or -1 as dn_linear does. */
int dn_linear_jobs(const dn_linear_job *jobs, int n);

/* out[m][n/2] = act(x . Wg^T) * (x . Wu^T) (glu.h) for a gate_up weight w [n][k] (gate rows,
 * then up rows). gate_up [m][n] is scratch. Where the path allows it (the AVX-512 GEMM, n/2 a
 * multiple of DN_LINEAR_NR) the GEMM stores act(g) * u itself and gate_up stays untouched (one
 * k block) or holds the up half's partial sums; elsewhere it is dn_linear into gate_up, then
 * dn_glu_mul. Returns 0, or -1 as dn_linear does. */
int dn_linear_glu(const dn_linear_w *w, const float *x, int64_t m, dn_act act, float *gate_up,
                  float *out);

/* Quantize w (bf16 bits when `bf16`, else float) [n][k] to `bits` (8 or 4) codes per group, as
 * InstantQuant does (dashinfer_client/model/quant.py): codes [n][k] for 8 bits, [n][k/2] two a
 * byte (even k in the low nibble) for 4. 8 bits: scales, zeros float [n][k/group]. 4 bits (u4's
 * layout above): scales, zeros uint8 codes [n][k/group] and row_scales float [n]. Returns -1, or
 * the first row holding an infinity or a NaN (as dn_quantize_rows). */
int64_t dn_quantize(const void *w, int bf16, int64_t n, int64_t k, int64_t group, int bits, uint8_t *codes,
                    void *scales, void *zeros, float *row_scales);
/* Rows [r0, r1) of the same, on the calling thread alone; group need not divide k (a ragged last
 * group: the parameter arrays are [n][ceil(k/group)]; 4 bits needs k and group even). error, when
 * not NULL, [n][3]: per row the sum of squared errors of the dequantized weight, the sum of
 * squared weights, the largest |error|. The conversion's module (native/conversion_quantize.c)
 * runs it without OpenMP: loading libgomp there would fix its thread count and placement before a
 * rank binds itself (kernels.py). Returns -1, or the first row holding an infinity or a NaN, which
 * no code represents: the rows from there on are left unwritten. */
int64_t dn_quantize_rows(const void *w, int bf16, int64_t r0, int64_t r1, int64_t k, int64_t group, int bits,
                         uint8_t *codes, void *scales, void *zeros, float *row_scales, double *error);
/* The error both Python entry points raise for such a row: its index, then the weight's N and K. */
#define DN_NONFINITE_ROW_ERROR \
    "row %lld of the [%lld, %lld] weight holds an infinity or a NaN, which no quantized code represents"

/* 1 when i8q/u4q run on vpdpbusd here (the AVX-512 path and AVX512-VNNI). */
int dn_linear_vnni(void);
/* The kernel i8q/u4q run on here: "vnni", "avx2" (vpmaddubsw: u4q as fast as its bytes, i8q
 * slower than exact i8's fp32 GEMV, whose bytes bound it already) or "portable" (slow). */
const char *dn_linear_q8_path(void);
