/* The mixture-of-experts MLP (moe.h): routing, tokens grouped by expert, one GEMM pair per
 * chosen expert, the weighted scatter-add and the shared expert. */
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
    sc->y = aligned(T * s->hidden * sizeof(float));
    sc->gate_up = aligned(T * 2 * wide * sizeof(float));
    sc->act = aligned(T * wide * sizeof(float));
    if (!sc->probs || !sc->choice || !sc->weight || !sc->offsets || !sc->rows || !sc->row_weight ||
        !sc->x || !sc->y || !sc->gate_up || !sc->act) {
        dn_moe_scratch_free(sc);
        return NULL;
    }
    return sc;
}

void dn_moe_scratch_free(dn_moe_scratch *sc) {
    if (!sc) return;
    free(sc->probs), free(sc->choice), free(sc->weight), free(sc->offsets), free(sc->rows);
    free(sc->row_weight), free(sc->x), free(sc->y), free(sc->gate_up), free(sc->act);
    free(sc);
}

void dn_moe_route(const dn_moe_shape *s, float *logits, int T, int32_t *choice, float *weight) {
    const int E = s->n_experts, K = s->top_k;
    for (int t = 0; t < T; t++) {
        float *p = logits + (size_t)t * E;
        float max = p[0], sum = 0.0f;
        for (int e = 1; e < E; e++) max = p[e] > max ? p[e] : max;
        for (int e = 0; e < E; e++) sum += p[e] = expf(p[e] - max);
        for (int e = 0; e < E; e++) p[e] /= sum;
        /* top K by selection (K and E are small); ties go to the lower expert id */
        int32_t *c = choice + (size_t)t * K;
        float *w = weight + (size_t)t * K, kept = 0.0f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k && !taken; j++) taken = c[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            c[k] = best, w[k] = p[best], kept += p[best];
        }
        if (s->norm_topk)
            for (int k = 0; k < K; k++) w[k] /= kept;
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

/* y = one expert's gated MLP of x [n, hidden] (or the shared expert's, inter its width); its
 * biases (or NULL): gate_up_bias [2 * inter], down_bias [hidden]. */
static int expert_mlp(const dn_moe_shape *s, dn_moe_scratch *sc, const dn_linear_w *gate_up,
                      const dn_linear_w *down, const float *gate_up_bias, const float *down_bias,
                      const float *x, int n) {
    const int inter = (int)(gate_up->n / 2);
    if (gate_up_bias) { /* the bias joins before the activation: linear, then glu_mul */
        if (dn_linear(gate_up, x, n, gate_up_bias, sc->gate_up)) return -1;
        dn_glu_mul(sc->gate_up, sc->act, n, inter, s->act);
    } else if (dn_linear_glu(gate_up, x, n, s->act, sc->gate_up, sc->act)) {
        return -1;
    }
    return dn_linear(down, sc->act, n, down_bias, sc->y);
}

/* Every chosen expert one after another, each in its own parallel regions: prompts, where an
 * expert's tokens make a GEMM worth its fork and join. */
static int experts_in_turn(const dn_moe_shape *s, const dn_moe_weights *w, dn_moe_scratch *sc,
                           const float *x, float *out) {
    const int H = s->hidden, nt = dn_num_threads();
    for (int j = 0; j < s->n_local; j++) {
        const int first = sc->offsets[j], n = sc->offsets[j + 1] - first;
        if (!n) continue; /* no token chose it: its weights are not read */
        const int32_t *rows = sc->rows + first;
        const float *rw = sc->row_weight + first;
#pragma omp parallel for schedule(static) num_threads(nt) if ((long)n * H >= MOE_PARALLEL_MIN)
        for (int i = 0; i < n; i++) memcpy(sc->x + (size_t)i * H, x + (size_t)rows[i] * H, H * sizeof(float));
        const float *gub = w->gate_up_bias ? w->gate_up_bias + (size_t)j * 2 * s->inter : NULL;
        const float *db = w->down_bias ? w->down_bias + (size_t)j * H : NULL;
        if (expert_mlp(s, sc, &w->gate_up[j], &w->down[j], gub, db, sc->x, n)) return -1;
        /* an expert's tokens are distinct, so its rows scatter without conflicts */
#pragma omp parallel for schedule(static) num_threads(nt) if ((long)n * H >= MOE_PARALLEL_MIN)
        for (int i = 0; i < n; i++) {
            float *o = out + (size_t)rows[i] * H;
            const float *y = sc->y + (size_t)i * H, wi = rw[i];
            for (int h = 0; h < H; h++) o[h] += wi * y[h];
        }
    }
    return 0;
}

/* Every chosen expert at once, for the slots' T * top_k rows that the scratch holds (decode): the
 * gate_up GEMVs of all of them in one parallel region, the activation, the down GEMVs in
 * another, instead of two regions an expert. The same arithmetic as experts_in_turn, in the same
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
    dn_moe_route(s, sc->probs, T, sc->choice, sc->weight);
    group_by_expert(s, sc, T);
    memset(out, 0, (size_t)T * H * sizeof *out);
    const int slots = sc->offsets[s->n_local];
    if (slots <= sc->max_tokens && s->n_local <= DN_MOE_MAX_LOCAL ? experts_together(s, w, sc, x, slots, out)
                                                                  : experts_in_turn(s, w, sc, x, out))
        return -1;
    if (!s->shared_inter) return 0;
    if (expert_mlp(s, sc, &w->shared_gate_up, &w->shared_down, NULL, NULL, x, T)) return -1;
#pragma omp parallel for schedule(static) num_threads(nt) if ((long)T * H >= MOE_PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * H, *y = sc->y + (size_t)t * H;
        float dot = 0.0f, *o = out + (size_t)t * H;
        for (int h = 0; h < H; h++) dot += xt[h] * w->shared_gate[h];
        const float g = 1.0f / (1.0f + expf(-dot));
        for (int h = 0; h < H; h++) o[h] += g * y[h];
    }
    return 0;
}
