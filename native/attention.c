/* Paged attention: cuts a batch step into tiles (GQA group x query rows x context range), runs
 * them on the OpenMP threads, and merges the tiles that split one context (flash-decoding).
 * The tile kernels: attention_vec8.h (plain C, built as attention_vec8_portable.c and
 * attention_vec8_avx2.c), attention_prefill_avx512.c, and attention_decode_avx512.c /
 * attention_decode_avx2.c, whose tiles take all kv heads of a sequence at once. */
#include <math.h>
#include <omp.h>

#include "attention_tile.h"
#include "common.h"

typedef struct {
    int32_t seq, kv_head, n_kv;   /* n_kv > 1 or decode: a decode tile over whole groups */
    int32_t decode;
    int32_t head0, n_q_heads;
    int32_t row0, n_rows;   /* rows within the sequence's chunk */
    int32_t kv_begin, kv_end;
    int32_t n_split;        /* > 1 on the first of n_split consecutive units of one context */
    int64_t part;           /* float offset of its partial in the partial area, or -1 */
} attn_unit_t;

/* ---- helpers shared by the tiles */

size_t attn_work_bytes(int block_size, int head_dim) {
    /* prefill: q^T, scores, acc: M x (head_dim or block), two fp32 blocks, per-vector state;
     * decode: q and acc of M vectors, per-vector state (2 x 16 lanes + 3), 8 output rows,
     * scores and int16 weights of 8 vectors, a staging row */
    size_t prefill = (size_t)ATTN_MAX_M * head_dim * 2 + (size_t)ATTN_MAX_M * block_size +
                     (size_t)2 * block_size * head_dim + 16 * ATTN_MAX_M + 256;
    size_t decode = (size_t)ATTN_MAX_M * (head_dim * 2 + 35) + 10 * (size_t)head_dim +
                    8 * (size_t)block_size + 4 * ((size_t)block_size + 32) + 64;
    size_t floats = prefill > decode ? prefill : decode;
    return (floats * 4 + 63) & ~(size_t)63;
}

void attn_finish(const attn_tile_t *t, const float *acc, const float *mx, const float *sum) {
    int D = t->kv->head_dim, M = t->n_q_heads * t->n_rows;
    if (!t->out) {
        float *p = t->part;
        for (int i = 0; i < M * D; i++) p[i] = acc[i];
        for (int i = 0; i < M; i++) {
            p[M * D + i] = mx[i];
            p[M * D + M + i] = sum[i];
        }
        return;
    }
    for (int i = 0; i < M; i++) {
        int r = i / t->n_q_heads, h = i % t->n_q_heads;
        float *o = t->out + r * t->q_stride + (int64_t)h * D;
        float inv = 1.0f / (sum[i] + (t->sinks ? expf(t->sinks[h] - mx[i]) : 0.0f));
        for (int d = 0; d < D; d++) o[d] = acc[(int64_t)i * D + d] * inv;
    }
}

/* ---- planning */

/* Combine the partials of one split context, one kv head of the unit: weights exp(max_s - max)
 * rescale each split; sinks (or NULL) of the unit's first query head of that kv head join the
 * sum. */
static void merge_split(const attn_unit_t *u, int head, const float *parts, int D,
                        const float *sinks, float *out_row0, int64_t q_stride) {
    int M = u->n_q_heads * u->n_rows, ns = u->n_split;
    int64_t at = (int64_t)head * M * (D + 2); /* this head's partial within each split's */
    for (int i = 0; i < M; i++) {
        float m = -INFINITY, l = 0.0f;
        for (int s = 0; s < ns; s++) m = fmaxf(m, parts[u[s].part + at + M * D + i]);
        for (int s = 0; s < ns; s++) {
            const float *p = parts + u[s].part + at;
            l += p[M * D + M + i] * expf(p[M * D + i] - m);
        }
        int r = i / u->n_q_heads, h = i % u->n_q_heads;
        if (sinks) l += expf(sinks[h] - m);
        float *o = out_row0 + r * q_stride + (int64_t)h * D;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int s = 0; s < ns; s++) {
            const float *p = parts + u[s].part + at;
            float w = expf(p[M * D + i] - m) / l;
            for (int d = 0; d < D; d++) o[d] += w * p[(int64_t)i * D + d];
        }
    }
}

/* The heads [*lo, *hi) of kv head g's group that this call holds (all of them but at the ends of a
 * rank's partial groups). */
static void group_heads(int g, int n_heads, int group, int q_head0, int *lo, int *hi) {
    int first = g * group - q_head0; /* local index of the group's head 0 */
    *lo = first < 0 ? -first : 0;
    *hi = n_heads - first < group ? n_heads - first : group;
}

/* The first position a tile whose first row sits at `first` reads: the start of the block that
 * holds its window's start (0 without a window). Blocks before it are never read. */
static int window_begin(int first, int window, int block_size) {
    if (!window || first < window) return 0;
    return (first - window + 1) / block_size * block_size;
}

/* Fill units (when not NULL) and count them and their partial floats. A sequence whose chunk is
 * decode-shaped (decode_fits says so for M = q_len * group) gets tiles over several kv heads
 * (whole groups only: one kv head a tile when the call holds a partial group); others one tile
 * per kv head, GQA head chunk and row chunk. A tile reads from its window's block on. Tiles of a
 * long range are split into block-aligned ranges when there are too few tiles to keep every
 * thread busy. */
static int64_t plan(const dn_kv_cache_t *c, const int32_t *q_offsets, const int32_t *context_lens,
                    int B, int n_heads, int group, int q_head0, int window, int n_threads,
                    int (*decode_fits)(const dn_kv_cache_t *, int), attn_unit_t *units,
                    int64_t *part_floats) {
    int nkv = c->n_kv_heads, bs = c->block_size, D = c->head_dim;
    int partial = q_head0 != 0 || n_heads != nkv * group;
    int head_chunks = (group + ATTN_MAX_M - 1) / ATTN_MAX_M;
    int heads = (group + head_chunks - 1) / head_chunks;
    int rows = ATTN_MAX_M / heads;
    /* total work in vector-positions, to size the split ranges: up to ~4 per thread, enough
     * to even out the threads; each split starts its stream cold (no prefetch across tiles).
     * A row of a window reads the window and at most a block before it. */
    double total = 0;
    for (int b = 0; b < B; b++) {
        int ql = q_offsets[b + 1] - q_offsets[b], span = context_lens[b];
        if (window && window + bs < span) span = window + bs;
        total += (double)ql * n_heads * span;
    }
    double target = total / (n_threads * 4.0);
    int64_t n = 0, floats = 0;
    for (int b = 0; b < B; b++) {
        int ql = q_offsets[b + 1] - q_offsets[b], ctx = context_lens[b];
        if (ql == 0) continue;
        int decode = decode_fits && decode_fits(c, ql * group);
        int kv_step = decode && !partial ? ATTN_MAX_M / (ql * group) : 1;
        for (int g = 0; g < nkv; g += kv_step) {
            int n_kv = nkv - g < kv_step ? nkv - g : kv_step, lo, hi;
            group_heads(g, n_heads, group, q_head0, &lo, &hi);
            for (int h0 = lo; h0 < hi; h0 += decode ? hi - lo : heads) {
                int nh = decode ? hi - lo : hi - h0 < heads ? hi - h0 : heads;
                for (int r0 = 0; r0 < ql; r0 += decode ? ql : rows) {
                    int nr = decode ? ql : ql - r0 < rows ? ql - r0 : rows;
                    int first = ctx - ql + r0, end = first + nr, split_len = 0;
                    int begin = window_begin(first, window, bs);
                    /* split only the range up to the first row's position, [begin, first]:
                     * the last split runs on to the causal end */
                    int ns = 1;
                    double work = (double)n_kv * nh * nr * (end - begin);
                    if (n_threads > 1 && work >= 2 * target) {
                        int len = (int)(target / (n_kv * nh * nr));
                        if (len < 256) len = 256;
                        len = (len + bs - 1) / bs * bs;
                        ns = (first + 1 - begin) / len > 1 ? (first + 1 - begin) / len : 1;
                        split_len = len;
                    }
                    for (int s = 0; s < ns; s++) {
                        if (units) {
                            attn_unit_t *u = &units[n];
                            u->seq = b;
                            u->kv_head = g;
                            u->n_kv = n_kv;
                            u->decode = decode;
                            u->head0 = h0;
                            u->n_q_heads = nh;
                            u->row0 = r0;
                            u->n_rows = nr;
                            u->kv_begin = begin + s * split_len;
                            u->kv_end = s == ns - 1 ? end : begin + (s + 1) * split_len;
                            u->n_split = s == 0 ? ns : 0;
                            u->part = ns > 1 ? floats : -1;
                        }
                        n++;
                        if (ns > 1) floats += (int64_t)n_kv * nh * nr * (D + 2);
                    }
                }
            }
        }
    }
    *part_floats = floats;
    return n;
}

int dn_attention(const dn_kv_cache_t *c, const float *q, const int32_t *block_tables,
                 int max_blocks, const int32_t *q_offsets, const int32_t *context_lens, int B,
                 int n_heads, int group, int q_head0, float scale, int window, float softcap,
                 const float *sinks, float *out) {
    int D = c->head_dim;
    /* a window that holds every context is none (and keeps the position arithmetic small) */
    int longest = 0;
    for (int b = 0; b < B; b++) longest = context_lens[b] > longest ? context_lens[b] : longest;
    if (window >= longest) window = 0;
    const int threads = dn_num_threads();
    int64_t part_floats;
    /* the vector tiles read 32 values of head_dim at a time */
    void (*tile)(const attn_tile_t *) = attn_tile_portable;
    if (dn_isa() == DN_ISA_AVX512 && D % 32 == 0) tile = attn_tile_avx512;
    else if (dn_isa() >= DN_ISA_AVX2) tile = attn_tile_avx2;
    int (*decode_fits)(const dn_kv_cache_t *, int) = NULL;
    void (*decode)(const attn_tile_t *) = NULL;
    if (dn_isa() == DN_ISA_AVX512) {
        decode_fits = attn_decode_avx512_fits;
        decode = attn_decode_avx512;
    } else if (dn_isa() == DN_ISA_AVX2) {
        decode_fits = attn_decode_avx2_fits;
        decode = attn_decode_avx2;
    }
    int64_t n_units = plan(c, q_offsets, context_lens, B, n_heads, group, q_head0, window,
                           threads, decode_fits, NULL, &part_floats);
    if (n_units == 0) return 0;
    const int nt = dn_team(n_units);
    size_t units_bytes = ((size_t)n_units * sizeof(attn_unit_t) + 63) & ~(size_t)63;
    size_t part_bytes = ((size_t)part_floats * 4 + 63) & ~(size_t)63;
    size_t work_bytes = attn_work_bytes(c->block_size, D);
    char *buf = dn_scratch(DN_SCRATCH_ATTENTION, units_bytes + part_bytes + work_bytes * nt);
    if (!buf) return -1;
    attn_unit_t *units = (attn_unit_t *)buf;
    float *parts = (float *)(buf + units_bytes);
    plan(c, q_offsets, context_lens, B, n_heads, group, q_head0, window, threads, decode_fits,
         units, &part_floats);
    int64_t q_stride = (int64_t)n_heads * D;

#pragma omp parallel num_threads(nt)
    {
        void *work = buf + units_bytes + part_bytes + work_bytes * omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n_units; i++) {
            const attn_unit_t *u = &units[i];
            int ql = q_offsets[u->seq + 1] - q_offsets[u->seq];
            int64_t row0 = q_offsets[u->seq] + u->row0;
            int64_t head0 = (int64_t)u->kv_head * group + u->head0 - q_head0;
            attn_tile_t t = {
                .kv = c,
                .blocks = block_tables + (int64_t)u->seq * max_blocks,
                .q = q + row0 * q_stride + head0 * D,
                .q_stride = q_stride,
                .kv_head = u->kv_head,
                .n_kv = u->n_kv,
                .n_q_heads = u->n_q_heads,
                .n_rows = u->n_rows,
                .first_pos = context_lens[u->seq] - ql + u->row0,
                .window = window,
                .kv_begin = u->kv_begin,
                .kv_end = u->kv_end,
                .scale = scale,
                .softcap = softcap,
                .sinks = sinks ? sinks + head0 : NULL,
                .out = u->part < 0 ? out + row0 * q_stride + head0 * D : NULL,
                .part = u->part < 0 ? NULL : parts + u->part,
                .work = work,
            };
            if (u->decode) decode(&t);
            else tile(&t);
        }
        if (part_floats > 0) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < n_units; i++) {
                const attn_unit_t *u = &units[i];
                if (u->n_split < 2) continue;
                int64_t row0 = q_offsets[u->seq] + u->row0;
                for (int h = 0; h < u->n_kv; h++) {
                    int64_t head0 = (int64_t)(u->kv_head + h) * group + u->head0 - q_head0;
                    merge_split(u, h, parts, D, sinks ? sinks + head0 : NULL,
                                out + row0 * q_stride + head0 * D, q_stride);
                }
            }
        }
    }
    return 0;
}
