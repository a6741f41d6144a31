/* The mixture-of-experts MLP (moe.h): routing, tokens grouped by expert, a GEMM pair per chosen
 * expert (a prompt's as work items, one thread each), the weighted scatter-add and the shared expert. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "elementwise.h"
#include "linear_kernels.h"
#include "moe.h"

/* Rows x columns below which a gather / scatter is not worth waking the thread team. */
#define MOE_PARALLEL_MIN (1 << 15)

static void *aligned(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 64) ? NULL : p;
}

dn_moe_scratch *dn_moe_scratch_new(const dn_moe_shape *s, int max_tokens) {
    dn_moe_scratch *sc = calloc(1, sizeof *sc);
    if (!sc) return NULL;
    size_t T = (size_t)max_tokens, slots = T * s->top_k;
    size_t wide = (size_t)(s->inter > s->shared_inter ? s->inter : s->shared_inter);
    sc->max_tokens = max_tokens;
    sc->probs = aligned(T * s->n_experts * sizeof(float));
    sc->choice = aligned(slots * sizeof(int32_t));
    sc->weight = aligned(slots * sizeof(float));
    sc->offsets = aligned(((size_t)s->n_local + 1) * sizeof(int32_t));
    sc->rows = aligned(slots * sizeof(int32_t));
    sc->row_weight = aligned(slots * sizeof(float));
    sc->x = aligned(T * s->hidden * sizeof(float));
    sc->y_rows = max_tokens > DN_MOE_ITEM_ROWS ? max_tokens : DN_MOE_ITEM_ROWS;
    sc->y = aligned((size_t)sc->y_rows * s->hidden * sizeof(float));
    const size_t max_items = (size_t)s->n_local + slots / DN_MOE_ITEM_ROWS + 1;
    sc->items = aligned(3 * max_items * sizeof(int32_t));
    sc->order = aligned(max_items * sizeof(int32_t));
    sc->gate_up = aligned(T * 2 * wide * sizeof(float));
    sc->act = aligned(T * wide * sizeof(float));
    if (!sc->probs || !sc->choice || !sc->weight || !sc->offsets || !sc->rows || !sc->row_weight ||
        !sc->x || !sc->y || !sc->gate_up || !sc->act || !sc->items || !sc->order) {
        dn_moe_scratch_free(sc);
        return NULL;
    }
    return sc;
}

void dn_moe_scratch_free(dn_moe_scratch *sc) {
    if (!sc) return;
    free(sc->probs), free(sc->choice), free(sc->weight), free(sc->offsets), free(sc->rows);
    free(sc->row_weight), free(sc->x), free(sc->y), free(sc->gate_up), free(sc->act), free(sc->items);
    free(sc->order);
    free(sc);
}

void dn_moe_route(const dn_moe_shape *s, float *logits, int T, const float *choice_bias, int32_t *choice,
                  float *weight) {
    const int E = s->n_experts, K = s->top_k;
    for (int t = 0; t < T; t++) {
        float *p = logits + (size_t)t * E;
        if (s->sigmoid) {
            for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
        } else {
            float max = p[0], sum = 0.0f;
            for (int e = 1; e < E; e++) max = p[e] > max ? p[e] : max;
            for (int e = 0; e < E; e++) sum += p[e] = expf(p[e] - max);
            for (int e = 0; e < E; e++) p[e] /= sum;
        }
        /* top K by selection (K and E are small); ties go to the lower expert id */
        int32_t *c = choice + (size_t)t * K;
        float *w = weight + (size_t)t * K, kept = 0.0f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            float best_key = 0.0f;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k && !taken; j++) taken = c[j] == e;
                const float key = choice_bias ? p[e] + choice_bias[e] : p[e];
                if (!taken && (best < 0 || key > best_key)) best = e, best_key = key;
            }
            c[k] = best, w[k] = p[best], kept += p[best];
        }
        const float scale = s->norm_topk ? s->routed_scale / kept : s->routed_scale;
        for (int k = 0; k < K; k++) w[k] *= scale;
    }
}

/* Slots grouped by this rank's experts (a counting sort, so each expert's tokens stay in order);
 * slots routed to another rank's experts are left out. */
static void group_by_expert(const dn_moe_shape *s, dn_moe_scratch *sc, int T) {
    const int K = s->top_k, L = s->n_local;
    int32_t *off = sc->offsets;
    memset(off, 0, ((size_t)L + 1) * sizeof *off);
    for (int i = 0; i < T * K; i++) {
        int rel = sc->choice[i] - s->expert0;
        if (rel >= 0 && rel % s->expert_step == 0) off[rel / s->expert_step + 1]++;
    }
    for (int j = 0; j < L; j++) off[j + 1] += off[j];
    for (int i = 0; i < T * K; i++) {
        int rel = sc->choice[i] - s->expert0;
        if (rel < 0 || rel % s->expert_step) continue;
        int32_t at = off[rel / s->expert_step]++;
        sc->rows[at] = i / K, sc->row_weight[at] = sc->weight[i];
    }
    for (int j = L; j > 0; j--) off[j] = off[j - 1]; /* the fill moved each start to the next's */
    off[0] = 0;
}

/* y [n, hidden] = one expert's gated MLP of x [n, hidden] (or the shared expert's, inter its
 * width), through gate_up [n, 2 * inter] and act [n, inter]; its biases (or NULL): gate_up_bias
 * [2 * inter], down_bias [hidden]. */
static int expert_mlp(const dn_moe_shape *s, const dn_linear_w *gate_up_w, const dn_linear_w *down,
                      const float *gate_up_bias, const float *down_bias, const float *x, int n, float *gate_up,
                      float *act, float *y) {
    const int inter = (int)(gate_up_w->n / 2);
    if (gate_up_bias) { /* the bias joins before the activation: linear, then glu_mul */
        if (dn_linear(gate_up_w, x, n, gate_up_bias, gate_up)) return -1;
        dn_glu_mul(gate_up, act, n, inter, s->act);
    } else if (dn_linear_glu(gate_up_w, x, n, s->act, gate_up, act)) {
        return -1;
    }
    return dn_linear(down, act, n, down_bias, y);
}

/* A prompt's work items: each local expert's slots cut into near-equal runs of at most
 * DN_MOE_ITEM_ROWS rows, in slot order, as (expert, first slot, rows). Returns their count. */
static int prompt_items(const dn_moe_shape *s, const dn_moe_scratch *sc) {
    int count = 0;
    for (int j = 0; j < s->n_local; j++) {
        const int first = sc->offsets[j], n = sc->offsets[j + 1] - first;
        const int pieces = (n + DN_MOE_ITEM_ROWS - 1) / DN_MOE_ITEM_ROWS;
        for (int i = 0; i < pieces; i++) {
            int32_t *item = sc->items + 3 * count++;
            item[0] = j, item[1] = first + n * i / pieces, item[2] = n * (i + 1) / pieces - n * i / pieces;
        }
    }
    return count;
}

/* One item on the calling thread alone, its rows of y at y0 (the slot's row of the batch): the
 * kernels' parallel regions nest inside the caller's, so they run as teams of one, their
 * barriers included. Its tokens and intermediates in this thread's scratch. */
static int run_item(const dn_moe_shape *s, const dn_moe_weights *w, const dn_moe_scratch *sc, const int32_t *item,
                    const float *x, float *y0) {
    const int H = s->hidden, I = s->inter, j = item[0], n = item[2];
    float *xs = dn_scratch(DN_SCRATCH_MOE, (size_t)DN_MOE_ITEM_ROWS * (H + 3 * I) * sizeof(float));
    if (!xs) return -1;
    float *gate_up = xs + (size_t)DN_MOE_ITEM_ROWS * H, *act = gate_up + (size_t)DN_MOE_ITEM_ROWS * 2 * I;
    for (int i = 0; i < n; i++) memcpy(xs + (size_t)i * H, x + (size_t)sc->rows[item[1] + i] * H, H * sizeof(float));
    const float *gub = w->gate_up_bias ? w->gate_up_bias + (size_t)j * 2 * I : NULL;
    const float *db = w->down_bias ? w->down_bias + (size_t)j * H : NULL;
    return expert_mlp(s, &w->gate_up[j], &w->down[j], gub, db, xs, n, gate_up, act, y0);
}

/* out[rows[i]] += row_weight[i] * y[i - first] for slots [first, last), columns split over the
 * team: every slot of a token adds into the same row, in slot order (experts ascending). */
static void scatter_slots(const dn_moe_shape *s, const dn_moe_scratch *sc, int first, int last, float *out) {
    const int H = s->hidden;
    int64_t h0, h1;
    dn_split(H, omp_get_thread_num(), omp_get_num_threads(), &h0, &h1);
    for (int i = first; i < last; i++) {
        float *o = out + (size_t)sc->rows[i] * H;
        const float *y = sc->y + (size_t)(i - first) * H;
        const float wi = sc->row_weight[i];
        for (int64_t h = h0; h < h1; h++) o[h] += wi * y[h];
    }
}

/* The item after the batch that starts at item b0: as many items as y holds the rows of. */
static int batch_end(const dn_moe_scratch *sc, int b0, int n_items) {
    int b1 = b0, rows = 0;
    for (; b1 < n_items && rows + sc->items[3 * b1 + 2] <= sc->y_rows; b1++) rows += sc->items[3 * b1 + 2];
    return b1;
}

/* A prompt's experts: every item runs on one thread, the threads taking the next item as they
 * finish (largest first), so no thread waits on another between experts: each expert split
 * over the team took four regions (2,048 joins a prompt of 512 tokens through 4 layers of 128
 * experts), and a thread the OS preempted held the other at each of them. On a quiet host both
 * ran Qwen3-30B-A3B's layer at 512 tokens at ~130 GFLOP/s on 2 threads (fp32 FMA peak 188).
 * Items run in batches whose outputs fill y, each scattered in slot order, so every token sums
 * its experts in the order experts_together does: the same bits as one GEMM pair an expert. */
static int experts_in_items(const dn_moe_shape *s, const dn_moe_weights *w, dn_moe_scratch *sc, const float *x,
                            float *out) {
    const int H = s->hidden, n_items = prompt_items(s, sc);
    int failed = 0;
    for (int b0 = 0, b1; b0 < n_items; b0 = b1) { /* each batch's items largest first (ties: slot order) */
        b1 = batch_end(sc, b0, n_items);
        for (int i = b0; i < b1; i++) {
            int at = i;
            for (; at > b0 && sc->items[3 * sc->order[at - 1] + 2] < sc->items[3 * i + 2]; at--)
                sc->order[at] = sc->order[at - 1];
            sc->order[at] = i;
        }
    }
#pragma omp parallel num_threads(dn_team(n_items))
    for (int b0 = 0, b1; b0 < n_items; b0 = b1) {
        b1 = batch_end(sc, b0, n_items);
        const int first = sc->items[3 * b0 + 1], last = sc->items[3 * (b1 - 1) + 1] + sc->items[3 * (b1 - 1) + 2];
#pragma omp for schedule(dynamic, 1)
        for (int q = b0; q < b1; q++) {
            const int32_t *item = sc->items + 3 * sc->order[q];
            if (run_item(s, w, sc, item, x, sc->y + (size_t)(item[1] - first) * H)) {
#pragma omp atomic write
                failed = 1;
            }
        }
        scatter_slots(s, sc, first, last, out);
#pragma omp barrier
    }
    return failed ? -1 : 0;
}

/* Every chosen expert at once, for the slots' T * top_k rows that the scratch holds (decode): the
 * gate_up GEMVs of all of them in one parallel region, the activation, the down GEMVs in
 * another, instead of two regions an expert. The same arithmetic as experts_in_items, in the same
 * order per token, so the same sums. */
static int experts_together(const dn_moe_shape *s, const dn_moe_weights *w, dn_moe_scratch *sc,
                            const float *x, int slots, float *out) {
    const int H = s->hidden, I = s->inter, nt = dn_num_threads();
    dn_linear_job jobs[DN_MOE_MAX_LOCAL];
    int used = 0;
#pragma omp parallel for schedule(static) num_threads(nt) if ((long)slots * H >= MOE_PARALLEL_MIN)
    for (int i = 0; i < slots; i++) memcpy(sc->x + (size_t)i * H, x + (size_t)sc->rows[i] * H, H * sizeof(float));
    for (int j = 0; j < s->n_local; j++) {
        const int first = sc->offsets[j], n = sc->offsets[j + 1] - first;
        if (n) jobs[used++] = (dn_linear_job){&w->gate_up[j], sc->x + (size_t)first * H, n,
                                              w->gate_up_bias ? w->gate_up_bias + (size_t)j * 2 * I : NULL,
                                              sc->gate_up + (size_t)first * 2 * I};
    }
    if (dn_linear_jobs(jobs, used)) return -1;
    dn_glu_mul(sc->gate_up, sc->act, slots, I, s->act);
    used = 0;
    for (int j = 0; j < s->n_local; j++) {
        const int first = sc->offsets[j], n = sc->offsets[j + 1] - first;
        if (n) jobs[used++] = (dn_linear_job){&w->down[j], sc->act + (size_t)first * I, n,
                                              w->down_bias ? w->down_bias + (size_t)j * H : NULL,
                                              sc->y + (size_t)first * H};
    }
    if (dn_linear_jobs(jobs, used)) return -1;
    /* columns split over the threads: every slot of a token adds into the same row */
#pragma omp parallel num_threads(nt) if ((long)slots * H >= MOE_PARALLEL_MIN)
    {
        int64_t h0, h1;
        dn_split(H, omp_get_thread_num(), omp_get_num_threads(), &h0, &h1);
        for (int i = 0; i < slots; i++) {
            float *o = out + (size_t)sc->rows[i] * H;
            const float *y = sc->y + (size_t)i * H, wi = sc->row_weight[i];
            for (int64_t h = h0; h < h1; h++) o[h] += wi * y[h];
        }
    }
    return 0;
}

int dn_moe(const dn_moe_shape *s, const dn_moe_weights *w, dn_moe_scratch *sc, const float *x, int T,
           float *out) {
    const int H = s->hidden, nt = dn_num_threads();
    if (dn_linear(&w->router, x, T, w->router_bias, sc->probs)) return -1;
    dn_moe_route(s, sc->probs, T, w->choice_bias, sc->choice, sc->weight);
    group_by_expert(s, sc, T);
    memset(out, 0, (size_t)T * H * sizeof *out);
    const int slots = sc->offsets[s->n_local];
    if (slots <= sc->max_tokens && s->n_local <= DN_MOE_MAX_LOCAL ? experts_together(s, w, sc, x, slots, out)
                                                                  : experts_in_items(s, w, sc, x, out))
        return -1;
    if (!s->shared_inter) return 0;
    if (expert_mlp(s, &w->shared_gate_up, &w->shared_down, NULL, NULL, x, T, sc->gate_up, sc->act, sc->y)) return -1;
#pragma omp parallel for schedule(static) num_threads(nt) if ((long)T * H >= MOE_PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * H, *y = sc->y + (size_t)t * H;
        float dot = 0.0f, *o = out + (size_t)t * H;
        for (int h = 0; w->shared_gate && h < H; h++) dot += xt[h] * w->shared_gate[h];
        const float g = w->shared_gate ? 1.0f / (1.0f + expf(-dot)) : 1.0f;
        for (int h = 0; h < H; h++) o[h] += g * y[h];
    }
    return 0;
}
