/* Linear layer: packing, header checks, and the driver that runs one ISA's kernels in one
 * parallel region per call (the kernels themselves live in linear_<isa>.c). */
#include <math.h>
#include <omp.h>

#include "amx.h"
#include "elementwise.h"
#include "linear_kernels.h"

static const char magic[8] = {'D', 'N', 'L', 'I', 'N', 'E', 'A', 'R'};

const char *dn_linear_check_shape(dn_wtype t, int64_t n, int64_t k, int64_t group) {
    if (t < DN_W_F32 || t > DN_W_MXFP4) return "unknown weight type";
    if (n < 1 || k < 1) return "N and K must be at least 1";
    if (n > ((int64_t)1 << 31) || k > ((int64_t)1 << 31)) return "N or K is too large";
    if (t == DN_W_MXFP4) {
        if (group != DN_MXFP4_GROUP) return "mxfp4 has group_size 32 (one e8m0 scale per 32 k)";
        return k % DN_MXFP4_GROUP == 0 ? NULL : "mxfp4 needs K a multiple of 32 (whole blocks)";
    }
    if (!dn_linear_quantized(t)) return group == 0 ? NULL : "group_size applies to i8/u4 only";
    if (group != 32 && group != 64 && group != 128 && group != 256 && group != k)
        return "group_size must be 32, 64, 128, 256 or K";
    if (k % group != 0) return "K must be a multiple of group_size";
    if (t == DN_W_U4 && k % 2 != 0) return "u4 needs an even K (two codes per byte)";
    if (dn_linear_act_quantized(t) && group % DN_Q8_BLOCK != 0)
        return "i8q/u4q need group_size (K when per channel) a multiple of 32";
    return NULL;
}

static int64_t panel_bytes(dn_wtype t, int64_t k, int64_t group, int width) {
    int64_t kp = (k + 1) / 2 * 2;
    switch (t) {
    case DN_W_F32: return k * width * 4;
    case DN_W_BF16: return kp * width * 2;
    case DN_W_MXFP4: return k / DN_MXFP4_GROUP * dn_linear_mxfp4_group_bytes(width);
    default: return dn_linear_panel_head(t, width) + k / group * dn_linear_group_bytes(t, group, width);
    }
}

static int64_t data_bytes(dn_wtype t, int64_t n, int64_t k, int64_t group) {
    int64_t full = n / DN_LINEAR_NR, n16 = (n + 15) / 16 * 16;
    int last = (int)(n16 - full * DN_LINEAR_NR);
    return full * panel_bytes(t, k, group, DN_LINEAR_NR) + (last ? panel_bytes(t, k, group, last) : 0);
}

int64_t dn_linear_packed_bytes(dn_wtype t, int64_t n, int64_t k, int64_t group) {
    return DN_LINEAR_HEADER + data_bytes(t, n, k, group);
}

/* An mxfp4 panel: the checkpoint's blocks regrouped 4 bytes at a time (linear.h), no value
 * changed. Padded columns get code 0 (+0.0). */
static void pack_mxfp4_panel(uint8_t *dst, int64_t n, int64_t k, int64_t n0, int width,
                             const uint8_t *blocks, const uint8_t *scales) {
    int64_t ng = k / DN_MXFP4_GROUP, gb = dn_linear_mxfp4_group_bytes(width);
    for (int64_t g = 0; g < ng; g++) {
        uint32_t *codes = (uint32_t *)(dst + g * gb); /* [4][width] */
        uint8_t *scale = dst + g * gb + 16 * width;
        for (int c = 0; c < width; c++) {
            /* the block's 16 bytes, k 2b in byte b's low nibble: little endian, word j's nibble i
             * is k 8j + i */
            const uint8_t *src = n0 + c < n ? blocks + ((n0 + c) * ng + g) * 16 : NULL;
            for (int j = 0; j < 4; j++) {
                uint32_t word = 0;
                if (src) memcpy(&word, src + 4 * j, 4);
                codes[j * width + c] = word;
            }
            scale[c] = n0 + c < n ? scales[(n0 + c) * ng + g] : 0;
        }
    }
}

/* A u4/u4q panel's row scales and group heads (linear.h); padded columns get 0, so they
 * dequantize to 0. Returns the first group block. */
uint8_t *dn_linear_pack_u4_heads(uint8_t *dst, dn_wtype t, int64_t n, int64_t k, int64_t group, int64_t n0,
                                 int width, const uint8_t *scales, const uint8_t *zeros, const float *row_scales) {
    int64_t ngroups = k / group, gb = dn_linear_group_bytes(t, group, width);
    float *rows = (float *)dst;
    uint8_t *first = dst + dn_linear_panel_head(t, width);
    for (int c = 0; c < width; c++) rows[c] = n0 + c < n ? row_scales[n0 + c] : 0.0f;
    for (int64_t g = 0; g < ngroups; g++)
        for (int c = 0; c < width; c++) {
            first[g * gb + c] = n0 + c < n ? scales[(n0 + c) * ngroups + g] : 0;
            first[g * gb + width + c] = n0 + c < n ? zeros[(n0 + c) * ngroups + g] : 0;
        }
    return first;
}

/* One panel: columns [n0, n0 + width) of W, zero past N (scale and zero 0 too, so padded
 * quantized columns dequantize to 0). */
static void pack_panel(uint8_t *dst, dn_wtype t, int64_t n, int64_t k, int64_t group, int64_t n0,
                       int width, const void *w, const void *scales, const void *zeros,
                       const float *row_scales, int e) {
    int64_t kp = (k + 1) / 2 * 2;
    if (t == DN_W_F32) {
        const float *src = w; /* [n][k] */
        float *d = (float *)dst;
        for (int64_t kk = 0; kk < k; kk++)
            for (int c = 0; c < width; c++)
                d[kk * width + c] = n0 + c < n ? src[(n0 + c) * k + kk] : 0.0f;
        return;
    }
    if (t == DN_W_BF16) {
        const uint16_t *src = w; /* [n][k] */
        uint16_t *d = (uint16_t *)dst;
        for (int64_t kk = 0; kk < kp; kk++)
            for (int c = 0; c < width; c++)
                d[(kk / 2 * width + c) * 2 + (kk & 1)] =
                    n0 + c < n && kk < k ? src[(n0 + c) * k + kk] : 0;
        return;
    }
    if (dn_linear_act_quantized(t)) {
        dn_linear_pack_q8_panel(dst, t, n, k, group, n0, width, w, scales, zeros, row_scales, e);
        return;
    }
    int64_t ngroups = k / group, pairs = (group + 1) / 2;
    int64_t gb = dn_linear_group_bytes(t, group, width), head = dn_linear_group_head(t, width);
    const uint8_t *src = w; /* i8: [n][k]; u4: [n][k/2] */
    if (t == DN_W_U4) dst = dn_linear_pack_u4_heads(dst, t, n, k, group, n0, width, scales, zeros, row_scales);
    for (int64_t g = 0; g < ngroups; g++) {
        uint8_t *blk = dst + g * gb;
        uint8_t *codes = blk + head;
        if (t == DN_W_I8) {
            float *scale = (float *)blk, *zero = scale + width;
            for (int c = 0; c < width; c++) {
                scale[c] = n0 + c < n ? ((const float *)scales)[(n0 + c) * ngroups + g] : 0.0f;
                zero[c] = n0 + c < n ? ((const float *)zeros)[(n0 + c) * ngroups + g] : 0.0f;
            }
        } else {
            memset(codes, 0, pairs * width);
        }
        for (int64_t kk = 0; kk < 2 * pairs; kk++) {
            int64_t kg = g * group + kk;
            for (int c = 0; c < width; c++) {
                int q = 0;
                if (n0 + c < n && kk < group) {
                    if (t == DN_W_I8) q = src[(n0 + c) * k + kg];
                    else q = (src[(n0 + c) * (k / 2) + kg / 2] >> (4 * (kg & 1))) & 15;
                }
                if (t == DN_W_I8) {
                    codes[(kk / 2 * width + c) * 2 + (kk & 1)] = (uint8_t)q;
                } else {
                    int cc = c & 15;
                    uint8_t *b = codes + kk / 2 * width + (c - cc) + 2 * (cc & 7) + (kk & 1);
                    *b |= (uint8_t)(cc < 8 ? q : q << 4);
                }
            }
        }
    }
}

void dn_linear_pack(uint8_t *dst, dn_wtype t, int64_t n, int64_t k, int64_t group, const void *w,
                    const void *scales, const void *zeros, const float *row_scales) {
    dn_linear_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, magic, 8);
    h.version = DN_LINEAR_VERSION;
    h.wtype = (uint32_t)t;
    h.n = n, h.k = k, h.group = group;
    h.nr = DN_LINEAR_NR;
    h.scale_exp = t == DN_W_I8Q ? dn_q8_scale_exp(n, k / group, scales, zeros) : 0;
    h.panel_bytes = panel_bytes(t, k, group, DN_LINEAR_NR);
    h.data_bytes = data_bytes(t, n, k, group);
    memcpy(dst, &h, sizeof h);
    int64_t npanels = (n + DN_LINEAR_NR - 1) / DN_LINEAR_NR;
    /* Panels are independent; threads also first-touch the pages they write. */
#pragma omp parallel for schedule(static) num_threads(dn_num_threads())
    for (int64_t p = 0; p < npanels; p++) {
        int64_t n0 = p * DN_LINEAR_NR, n16 = (n + 15) / 16 * 16;
        int width = (int)(n16 - n0 < DN_LINEAR_NR ? n16 - n0 : DN_LINEAR_NR);
        uint8_t *panel = dst + DN_LINEAR_HEADER + p * h.panel_bytes;
        if (t == DN_W_MXFP4) pack_mxfp4_panel(panel, n, k, n0, width, w, scales);
        else pack_panel(panel, t, n, k, group, n0, width, w, scales, zeros, row_scales, h.scale_exp);
    }
}

const char *dn_linear_open(dn_linear_w *w, const uint8_t *buf, size_t len) {
    dn_linear_header h;
    if (len < sizeof h) return "too short to be a packed linear weight";
    memcpy(&h, buf, sizeof h);
    if (memcmp(h.magic, magic, 8) != 0) return "not a packed linear weight (bad magic)";
    if (h.version != DN_LINEAR_VERSION) return "packed by another version of the linear kernels";
    if (h.nr != DN_LINEAR_NR) return "packed with another panel width";
    if (h.wtype > DN_W_MXFP4) return "corrupt header (unknown weight type)";
    dn_wtype t = (dn_wtype)h.wtype;
    if (dn_linear_check_shape(t, h.n, h.k, h.group)) return "corrupt header (bad shape)";
    if (h.panel_bytes != panel_bytes(t, h.k, h.group, DN_LINEAR_NR) ||
        h.data_bytes != data_bytes(t, h.n, h.k, h.group))
        return "corrupt header (sizes do not match the shape)";
    if ((uint64_t)h.data_bytes > len - DN_LINEAR_HEADER) return "truncated packed weight";
    if (t == DN_W_I8Q ? h.scale_exp < -DN_Q8_MAX_EXP || h.scale_exp > DN_Q8_MAX_EXP : h.scale_exp != 0)
        return "corrupt header (bad scale exponent)";
    w->wtype = t;
    w->n = h.n, w->k = h.k, w->group = h.group;
    w->kp = (h.k + 1) / 2 * 2;
    w->npanels = (h.n + DN_LINEAR_NR - 1) / DN_LINEAR_NR;
    w->panel_bytes = h.panel_bytes;
    w->data = buf + DN_LINEAR_HEADER;
    w->unscale = ldexpf(1.0f, -h.scale_exp);
    return NULL;
}

static const dn_linear_kernels *const paths[] = {&dn_linear_portable, &dn_linear_avx2,
                                                 &dn_linear_avx512};
static const dn_linear_kernels *const mxfp4_paths[] = {&dn_linear_portable, &dn_linear_mxfp4_avx2,
                                                       &dn_linear_mxfp4_avx512};

static const dn_linear_kernels *q8_kernels(void) {
    return dn_linear_vnni() ? &dn_linear_q8_vnni : dn_isa() >= DN_ISA_AVX2 ? &dn_linear_q8_avx2 : &dn_linear_q8_portable;
}

const char *dn_linear_q8_path(void) {
    const dn_linear_kernels *k = q8_kernels();
    return k == &dn_linear_q8_vnni ? "vnni" : k == &dn_linear_q8_avx2 ? "avx2" : "portable";
}

const dn_linear_kernels *dn_linear_fallback_kernels(const dn_linear_w *w) {
    if (dn_linear_act_quantized(w->wtype)) return q8_kernels();
    if (w->wtype == DN_W_MXFP4) return mxfp4_paths[dn_isa()];
    return paths[dn_isa()];
}

/* AMX tiles need the avx512 path (every AMX CPU has it); their emulation runs anywhere. */
static const dn_linear_kernels *kernels_for(const dn_linear_w *w) {
    dn_amx_mode amx = dn_amx();
    int tiles = amx == DN_AMX_EMULATED || (amx == DN_AMX_TILES && dn_isa() == DN_ISA_AVX512);
    if (tiles && (w->wtype == DN_W_BF16 || dn_linear_act_quantized(w->wtype))) return &dn_linear_amx;
    return dn_linear_fallback_kernels(w);
}

static int run_call(const dn_linear_kernels *kern, dn_linear_call *c) {
    const dn_linear_w *w = c->w;
    int nt = dn_num_threads();
    /* Under ~100k multiply-adds a second thread costs more than it saves; a kernel of one unit
     * of work runs alone (dn_team: never a team between one and all). */
    if ((double)c->m * w->n * w->k < 1e5 || (kern->units && kern->units(w, c->m) <= 1)) nt = 1;
    size_t need = kern->scratch_bytes(w, c->m, nt);
    if (need) {
        c->scratch = dn_scratch(DN_SCRATCH_LINEAR, need);
        if (!c->scratch) return -1;
    }
#pragma omp parallel num_threads(nt)
    kern->run(c, omp_get_thread_num(), omp_get_num_threads());
    return 0;
}

int dn_linear(const dn_linear_w *w, const float *x, int64_t m, const float *bias, float *y) {
    if (m <= 0) return 0;
    dn_linear_call c = {w, x, m, bias, y, NULL, NULL, DN_ACT_SILU};
    return run_call(kernels_for(w), &c);
}

int dn_linear_jobs(const dn_linear_job *jobs, int n) {
    if (n <= 0) return 0;
    enum { MAX_JOBS = 256 }; /* 128 experts a layer at most in the families served */
    if (n > MAX_JOBS) return dn_linear_jobs(jobs, MAX_JOBS) || dn_linear_jobs(jobs + MAX_JOBS, n - MAX_JOBS);
    dn_linear_call calls[MAX_JOBS];
    const dn_linear_kernels *kern[MAX_JOBS];
    size_t offset[MAX_JOBS + 1];
    int nt = dn_num_threads();
    double work = 0.0;
    for (int i = 0; i < n; i++) work += (double)jobs[i].m * jobs[i].w->n * jobs[i].w->k;
    if (work < 1e5) nt = 1; /* as run_call: a second thread costs more than it saves */
    offset[0] = 0;
    for (int i = 0; i < n; i++) {
        kern[i] = kernels_for(jobs[i].w);
        offset[i + 1] = offset[i] + (kern[i]->scratch_bytes(jobs[i].w, jobs[i].m, nt) + 63) / 64 * 64;
    }
    uint8_t *scratch = offset[n] ? dn_scratch(DN_SCRATCH_LINEAR, offset[n]) : NULL;
    if (offset[n] && !scratch) return -1;
    for (int i = 0; i < n; i++)
        calls[i] = (dn_linear_call){jobs[i].w, jobs[i].x, jobs[i].m, jobs[i].bias, jobs[i].y,
                                    scratch ? scratch + offset[i] : NULL, NULL, DN_ACT_SILU};
    /* every thread meets each job's barriers (if its kernel has any) in the same order */
#pragma omp parallel num_threads(nt)
    for (int i = 0; i < n; i++)
        if (calls[i].m > 0) kern[i]->run(&calls[i], omp_get_thread_num(), omp_get_num_threads());
    return 0;
}

int dn_linear_glu(const dn_linear_w *w, const float *x, int64_t m, dn_act act, float *gate_up,
                  float *out) {
    if (m <= 0) return 0;
    const dn_linear_kernels *kern = kernels_for(w);
    if (kern->fuses_glu && w->n % (2 * DN_LINEAR_NR) == 0 && kern->fuses_glu(w, m)) {
        dn_linear_call c = {w, x, m, NULL, gate_up, NULL, out, act};
        return run_call(kern, &c);
    }
    if (dn_linear(w, x, m, NULL, gate_up)) return -1;
    dn_glu_mul(gate_up, out, (int)m, (int)(w->n / 2), act);
    return 0;
}
