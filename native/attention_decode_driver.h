/* The decode tile's driver, shared by attention_decode_avx512.c and attention_decode_avx2.c:
 * carve the work area, load the queries, run slice_step over the context block by block, and
 * finish each kv head (back to head_dim order, then the output or the partial). Include it
 * inside the file's target region, after its state_t, load_queries, slice_step, acc_lane_d and
 * MAX_M, with:
 *   DECODE_CHUNK       accumulator floats per head_dim chunk (acc_lane_d's period)
 *   state_sum(p, v)    the sum of vector v's per-lane state (sumv, ztv) at p
 *   DECODE_FITS, DECODE_ENTRY   the names of the two functions it defines */
#pragma once

/* M (and the common head sizes) are constants in each instantiation: the per-vector
 * accumulators live in registers and the loops over head_dim unroll. */
static inline __attribute__((always_inline)) void decode_m(const attn_tile_t *t, const int M,
                                                           const int D) {
    const dn_kv_cache_t *kv = t->kv;
    const dn_kv_format_t f = kv->format;
    const int bs = kv->block_size, H = t->n_kv;
    const int V = H * M; /* vectors of the tile, <= ATTN_MAX_M */
    char *w = t->work;
    state_t st;
    st.q = w;                             w += (size_t)V * D * 4;
    st.acc = (float *)w;                  w += (size_t)V * D * 4;
    st.sumv = (float *)w;                 w += (size_t)V * 16 * 4;
    st.ztv = (float *)w;                  w += (size_t)V * 16 * 4;
    st.mx = (float *)w;                   w += (size_t)ATTN_MAX_M * 4;
    st.qscale = (float *)w;               w += (size_t)ATTN_MAX_M * 4;
    st.qsum = (float *)w;                 w += (size_t)ATTN_MAX_M * 4;
    float *nat = (float *)w;              w += (size_t)MAX_M * D * 4;          /* [M][D] */
    float *s = (float *)w;                w += (size_t)MAX_M * bs * 4;         /* [M][bs] */
    int16_t *wq = (int16_t *)w;           w += (size_t)MAX_M * (bs + 32) * 2;  /* [M][bs + 32] */
    float *stage = (float *)w;            w += (size_t)D * 4;                  /* [D] */
    int16_t *q16 = (int16_t *)w;                                               /* [D] */

    for (int h = 0; h < H; h++) load_queries(t, h, M, D, &st, stage, q16);
    memset(st.acc, 0, (size_t)V * D * 4);
    memset(st.sumv, 0, (size_t)V * 16 * 4);
    memset(st.ztv, 0, (size_t)V * 16 * 4);
    for (int v = 0; v < V; v++) st.mx[v] = -INFINITY;

    const int nkv = kv->n_kv_heads;
    for (int pos = t->kv_begin; pos < t->kv_end;) {
        const int off = pos % bs;
        const int n = bs - off < t->kv_end - pos ? bs - off : t->kv_end - pos;
        const int64_t row0 = ((int64_t)t->blocks[pos / bs] * nkv + t->kv_head) * bs;
        const int64_t next0 = pos + n < t->kv_end
                                  ? ((int64_t)t->blocks[(pos + n) / bs] * nkv + t->kv_head) * bs
                                  : -1;
        for (int h = 0; h < H; h++)
            slice_step(t, &st, h, pos, row0 + (int64_t)h * bs, off, n,
                       h + 1 < H ? row0 + (int64_t)(h + 1) * bs : next0, M, D, s, wq);
        pos += n;
    }

    /* per head: back to head_dim order (and the uint4 zero term), then out or the partial */
    for (int h = 0; h < H; h++) {
        float sum[MAX_M];
        for (int i = 0; i < M; i++) {
            const int v = h * M + i;
            const float *acc = st.acc + (int64_t)v * D;
            float zt = state_sum(st.ztv, v);
            sum[i] = state_sum(st.sumv, v);
            for (int c = 0; c < D; c += DECODE_CHUNK)
                for (int p = 0; p < DECODE_CHUNK; p++) nat[i * D + c + acc_lane_d(f, p)] = acc[c + p] - zt;
        }
        attn_tile_t one = *t;
        if (t->out) one.out = t->out + (int64_t)h * t->n_q_heads * D;
        if (t->sinks) one.sinks = t->sinks + (int64_t)h * t->n_q_heads;
        if (t->part) one.part = t->part + (int64_t)h * M * (D + 2);
        attn_finish(&one, nat, st.mx + h * M, sum);
    }
}

int DECODE_FITS(const dn_kv_cache_t *c, int M) {
    return M <= MAX_M && c->head_dim % 32 == 0 && c->head_dim <= 256;
}

/* One function per (M, head_dim) instantiation, not all inlined into DECODE_ENTRY: gcc's RTL
 * passes (GCSE, load CSE after reload) grow faster than linearly with a function's size, and one
 * 24-fold function took most of the build's time. A call per tile costs nothing measurable. */
#define DECODE_M(M)                                                                           \
    static __attribute__((noinline)) void decode_##M##_64(const attn_tile_t *t) { decode_m(t, M, 64); }   \
    static __attribute__((noinline)) void decode_##M##_128(const attn_tile_t *t) { decode_m(t, M, 128); } \
    static __attribute__((noinline)) void decode_##M##_any(const attn_tile_t *t) {                        \
        decode_m(t, M, t->kv->head_dim);                                                      \
    }
DECODE_M(1) DECODE_M(2) DECODE_M(3) DECODE_M(4) DECODE_M(5) DECODE_M(6) DECODE_M(7) DECODE_M(8)

#define DECODE_D(M)                                                \
    switch (t->kv->head_dim) {                                     \
    case 64: decode_##M##_64(t); break;                            \
    case 128: decode_##M##_128(t); break;                          \
    default: decode_##M##_any(t); break;                           \
    }

void DECODE_ENTRY(const attn_tile_t *t) {
    switch (t->n_q_heads * t->n_rows) {
    case 1: DECODE_D(1); break;
    case 2: DECODE_D(2); break;
    case 3: DECODE_D(3); break;
    case 4: DECODE_D(4); break;
    case 5: DECODE_D(5); break;
    case 6: DECODE_D(6); break;
    case 7: DECODE_D(7); break;
    default: DECODE_D(8); break;
    }
}
