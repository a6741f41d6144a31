/* i8q/u4q linear weights (layout and math in linear.h): packing, the activation quantizer,
 * and the portable kernel (the same sums as linear_q8_vnni.c, one multiply-add at a time). */
#include <math.h>
#include <omp.h>

#include "linear_kernels.h"

/* fp16 bits of f, rounded to nearest even (as numpy's float16 and vcvtps2ph); |f| < 65520. */
static uint16_t f16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
    if (mag < 0x38800000u) { /* below 2^-14: a subnormal step of 2^-24, rounded by the FPU */
        float a;
        memcpy(&a, &mag, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    mag += 0xfffu + ((mag >> 13) & 1u) - (112u << 23); /* rebias 127 -> 15, round 13 bits off */
    return (uint16_t)(sign | (mag >> 13));
}

float dn_f16_to_f32(uint16_t h) {
    uint32_t exp = (h >> 10) & 31u, frac = h & 1023u;
    float mag = exp ? ldexpf((float)(frac | 1024u), (int)exp - 25) : ldexpf((float)frac, -24);
    return h & 0x8000u ? -mag : mag;
}

int dn_q8_scale_exp(int64_t n, int64_t ng, const float *scales, const float *zeros) {
    float top = 0;
    for (int64_t i = 0; i < n * ng; i++)
        top = fmaxf(top, fmaxf(fabsf(scales[i]), fabsf(scales[i] * zeros[i])));
    if (!(top > 0) || isinf(top)) return 0;
    int e = 14 - ilogbf(top); /* top * 2^e in [2^14, 2^15) */
    return e < -DN_Q8_MAX_EXP ? -DN_Q8_MAX_EXP : e > DN_Q8_MAX_EXP ? DN_Q8_MAX_EXP : e;
}

void dn_linear_pack_q8_panel(uint8_t *dst, dn_wtype t, int64_t n, int64_t k, int64_t group, int64_t n0,
                             int width, const void *w, const void *scales, const void *zeros,
                             const float *row_scales, int e) {
    const uint8_t *src = w; /* i8q: [n][k]; u4q: [n][k/2], low nibble = even k */
    int64_t ngroups = k / group, gb = dn_linear_group_bytes(t, group, width), head = dn_linear_group_head(t, width);
    if (t == DN_W_U4Q) dst = dn_linear_pack_u4_heads(dst, t, n, k, group, n0, width, scales, zeros, row_scales);
    for (int64_t g = 0; g < ngroups; g++) {
        uint8_t *blk = dst + g * gb;
        uint8_t *codes = blk + head;
        if (t == DN_W_I8Q) {
            uint16_t *scale = (uint16_t *)blk, *sz = scale + width;
            for (int c = 0; c < width; c++) {
                int real = n0 + c < n;
                float s = real ? ((const float *)scales)[(n0 + c) * ngroups + g] : 0.0f;
                scale[c] = f16_bits(ldexpf(s, e));
                sz[c] = f16_bits(real ? ldexpf(s * ((const float *)zeros)[(n0 + c) * ngroups + g], e) : 0.0f);
            }
        }
        memset(codes, 0, gb - head);
        for (int64_t kk = 0; kk < group; kk++) {
            int64_t kg = g * group + kk;
            for (int c = 0; c < width && n0 + c < n; c++) {
                const uint8_t *row = src + (n0 + c) * (t == DN_W_U4Q ? k / 2 : k);
                if (t == DN_W_I8Q)
                    codes[(kk / 4 * width + c) * 4 + kk % 4] = row[kg];
                else
                    codes[(kk / 8 * width + c) * 4 + kk % 4] |=
                        (uint8_t)(((row[kg / 2] >> (4 * (kg & 1))) & 15) << (kk % 8 < 4 ? 0 : 4));
            }
        }
    }
}

static int64_t round64(int64_t n) { return (n + 63) & ~(int64_t)63; }

size_t dn_q8_act_bytes(const dn_linear_w *w, int64_t m) {
    return (size_t)(round64(m * w->k) + 2 * round64(m * (w->k / DN_Q8_BLOCK) * 4) +
                    round64(m * (w->k / w->group) * 4));
}

dn_q8_act dn_q8_act_at(const dn_linear_w *w, int64_t m, uint8_t *scratch) {
    const int64_t blocks = round64(m * (w->k / DN_Q8_BLOCK) * 4);
    dn_q8_act a;
    a.xq = (int8_t *)scratch;
    a.xd = (float *)(scratch + round64(m * w->k));
    a.xs = (int32_t *)((uint8_t *)a.xd + blocks);
    a.xg = (float *)((uint8_t *)a.xs + blocks);
    return a;
}

/* q = rint(x * 127 / max|x|), d = max|x| / 127 (0 and zeros for an all-zero block). */
int dn_q8_quantize_block(const float *x, int8_t *q, float *d) {
    float amax = 0;
    for (int i = 0; i < DN_Q8_BLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
    float id = amax > 0 ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < DN_Q8_BLOCK; i++) sum += q[i] = (int8_t)lrintf(x[i] * id);
    *d = amax / 127.0f;
    return sum;
}

static void quantize_rows(const dn_linear_w *w, const float *x, int64_t r0, int64_t r1, dn_q8_act a,
                          dn_q8_quantizer quantize_block) {
    int64_t k = w->k, nb = k / DN_Q8_BLOCK, per_group = w->group / DN_Q8_BLOCK, ng = k / w->group;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t g = 0; g < ng; g++) {
            float sum = 0; /* of xhat over the group, block by block as the kernels add them */
            for (int64_t b = g * per_group; b < (g + 1) * per_group; b++) {
                int s = quantize_block(x + r * k + b * DN_Q8_BLOCK, a.xq + r * k + b * DN_Q8_BLOCK,
                                       a.xd + r * nb + b);
                a.xs[r * nb + b] = s;
                sum += a.xd[r * nb + b] * (float)s;
            }
            a.xg[r * ng + g] = sum;
        }
}

dn_q8_act dn_q8_prepare(const dn_linear_call *c, int t, int nt, dn_q8_quantizer quantize_block) {
    dn_q8_act a = dn_q8_act_at(c->w, c->m, c->scratch + t * round64((int64_t)dn_q8_act_bytes(c->w, c->m)));
    quantize_rows(c->w, c->x, 0, c->m, a, quantize_block);
    return a;
}

size_t dn_q8_scratch_bytes(const dn_linear_w *w, int64_t m, int nthreads) {
    return (size_t)nthreads * round64((int64_t)dn_q8_act_bytes(w, m));
}

/* Code of column c, k-in-group kk, in a group's code block. */
static int code_at(dn_wtype t, const uint8_t *codes, int width, int c, int64_t kk) {
    if (t == DN_W_I8Q) return codes[(kk / 4 * width + c) * 4 + kk % 4];
    uint8_t b = codes[(kk / 8 * width + c) * 4 + kk % 4];
    return kk % 8 < 4 ? b & 15 : b >> 4;
}

static void run(const dn_linear_call *c, int t, int nt) {
    const dn_linear_w *w = c->w;
    dn_q8_act a = dn_q8_prepare(c, t, nt, dn_q8_quantize_block);
    int64_t p0, p1, m0, m1;
    int64_t k = w->k, n = w->n, nb = k / DN_Q8_BLOCK, ng = k / w->group;
    dn_linear_part share = dn_linear_share(w, c->m, 1, t, nt);
    dn_linear_panels(&share, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        dn_linear_rows(&share, p, &m0, &m1);
        const uint8_t *panel = dn_linear_panel(w, p);
        int width = dn_linear_width(w, p), valid = dn_linear_valid(w, p);
        int64_t col0 = p * DN_LINEAR_NR, head = dn_linear_group_head(w->wtype, width);
        for (int64_t i = m0; i < m1; i++)
            for (int j = 0; j < valid; j++) {
                float acc = 0;
                for (int64_t g = 0; g < ng; g++) {
                    const uint8_t *blk = dn_linear_group_at(w->wtype, w->group, panel, width, g);
                    float scale, sz;
                    if (w->wtype == DN_W_U4Q) {
                        scale = dn_u4_scale(panel, blk, j);
                        sz = scale * dn_u4_zero(blk, width, j);
                    } else {
                        const uint16_t *s16 = (const uint16_t *)blk;
                        scale = dn_f16_to_f32(s16[j]), sz = dn_f16_to_f32(s16[width + j]);
                    }
                    for (int64_t b = 0; b < w->group / DN_Q8_BLOCK; b++) {
                        int64_t k0 = g * w->group + b * DN_Q8_BLOCK;
                        int32_t dot = 0;
                        for (int kk = 0; kk < DN_Q8_BLOCK; kk++)
                            dot += code_at(w->wtype, blk + head, width, j, b * DN_Q8_BLOCK + kk) *
                                   a.xq[i * k + k0 + kk];
                        acc += (float)dot * (scale * a.xd[i * nb + k0 / DN_Q8_BLOCK]);
                    }
                    acc -= sz * a.xg[i * ng + g];
                }
                c->y[i * n + col0 + j] = acc * w->unscale + (c->bias ? c->bias[col0 + j] : 0.0f);
            }
    }
}

const dn_linear_kernels dn_linear_q8_portable = {dn_q8_scratch_bytes, run};
