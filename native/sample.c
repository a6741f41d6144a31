/* Sampling one token per row of logits, and log-probabilities (sample.h). A row's kept tokens
 * are found without sorting the vocabulary: for top-k up to 128 the maxima of 1,024 groups bound
 * the k-th logit from below, so one compare leaves few candidates; otherwise a histogram of the
 * values' bits (their order as unsigned keys) finds the bucket where the k-th token or the top-p
 * mass falls, and only that bucket is sorted. The uniform number is then inverted in the kept
 * weights: top-k's sorted by decreasing logit, the others in token order (the same distribution;
 * the order only decides which token a given u names). Sums are in double. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "sample.h"
#include "vec8.h"

/* The vector loops are built for AVX2 too and picked at load time: a baseline build runs them on
 * SSE pairs. Without FMA the two give the same bits. */
#define DN_CLONES __attribute__((target_clones("avx2", "default")))

/* Top-k buckets: a float's 12 high key bits. Top-p buckets: a weight in [0, 1]'s bits >> 19
 * (16 a power of two). */
#define KEY_BUCKETS 4096
#define WEIGHT_BUCKETS ((0x3f800000 >> 19) + 1)
#define BLOCK 256 /* the CDF's first level */

typedef struct {
    float v;
    int32_t i;
} entry; /* a token and its logit or weight */

/* A row's working space, [V] each: the kept list (ids, w), every token's weight, entries to sort;
 * and the CDF's block sums [V / BLOCK + 1]. */
typedef struct {
    int32_t *ids;
    float *w, *all;
    entry *sorted;
    double *sums;
} row_work;

static inline uint32_t order_key(float f) { /* unsigned keys in the floats' order */
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

/* Larger value first, then lower id; by the keys, a total order even where a logit is NaN. */
static int by_value_desc(const void *a, const void *b) {
    const entry *x = a, *y = b;
    const uint32_t kx = order_key(x->v), ky = order_key(y->v);
    if (kx != ky) return kx > ky ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static inline double lanes_sum(v8f s) {
    double t = 0;
    for (int l = 0; l < 8; l++) t += s[l];
    return t;
}

static inline int any8(v8i v) {
    int any = 0;
    for (int l = 0; l < 8; l++) any |= v[l];
    return any;
}

/* The first largest logit's position (0 when every logit is -inf or NaN, as numpy's argmax):
 * each lane keeps its first maximum, two lane sets for two chains. */
DN_CLONES static int64_t row_argmax(const float *x, int64_t V) {
    const v8i iota = {0, 1, 2, 3, 4, 5, 6, 7};
    v8f m0 = (v8f){0} - INFINITY, m1 = m0;
    v8i k0 = iota, k1 = iota + 8;
    int64_t i = 0;
    for (; i + 16 <= V && i + 16 < 0x7fffffff; i += 16) {
        const v8f a = load8(x + i), b = load8(x + i + 8);
        const v8i ga = a > m0, gb = b > m1;
        m0 = select8(ga, a, m0), k0 = (ga & (iota + (int32_t)i)) | (~ga & k0);
        m1 = select8(gb, b, m1), k1 = (gb & (iota + (int32_t)i + 8)) | (~gb & k1);
    }
    float best = -INFINITY;
    int64_t at = 0;
    for (int l = 0; l < 16; l++) {
        const float v = l < 8 ? m0[l] : m1[l - 8];
        const int64_t k = l < 8 ? k0[l] : k1[l - 8];
        if (v > best || (v == best && v > -INFINITY && k < at)) best = v, at = k;
    }
    for (; i < V; i++)
        if (x[i] > best) best = x[i], at = i;
    return at;
}

/* all[i] = e^((x[i] - m) / t) for every token; returns their sum. */
DN_CLONES static double exp_row(const float *x, int64_t V, float m, float inv_t, float *all) {
    double mass = 0;
    for (int64_t b = 0; b < V; b += BLOCK) {
        const int64_t end = b + BLOCK < V ? b + BLOCK : V;
        v8f s = (v8f){0};
        int64_t i = b;
        for (; i + 8 <= end; i += 8) {
            v8f e = exp8((load8(x + i) - m) * inv_t);
            store8(all + i, e);
            s += e;
        }
        for (; i < end; i++) {
            float tail[8] = {(x[i] - m) * inv_t};
            all[i] = exp8(load8(tail))[0];
            s[0] += all[i];
        }
        mass += lanes_sum(s);
    }
    return mass;
}

/* Whether any of the 64 values at w is >= floor: most blocks of a peaked row have none. */
DN_CLONES static int any_at_least(const float *w, float floor) {
    v8i hit = load8(w) >= floor;
    for (int j = 8; j < 64; j += 8) hit |= load8(w + j) >= floor;
    return any8(hit);
}

/* all[i] = 0 where all[i] < floor or (all[i], -i) < (tw, -ti): min-p's and top-p's cuts. */
DN_CLONES static void cut_row(float *all, int64_t V, float floor, float tw, int64_t ti) {
    const float below = tw > floor ? tw : floor; /* every weight under both cuts goes */
    int64_t i = 0;
    for (; i + 8 <= V; i += 8) {
        v8f w = load8(all + i);
        store8(all + i, select8(w < below, (v8f){0}, w));
    }
    for (; i < V; i++) all[i] = all[i] < below ? 0.0f : all[i];
    if (tw < floor) return;
    for (int64_t b0 = ti + 1; b0 < V; b0 += 64) { /* top-p's edge weight after its last token */
        const int64_t end = b0 + 64 < V ? b0 + 64 : V;
        if (end - b0 < 64 || any_at_least(all + b0, tw))
            for (i = b0; i < end; i++) all[i] = all[i] == tw ? 0.0f : all[i];
    }
}

DN_CLONES static double block_sum(const float *w, int64_t n) {
    v8f s = (v8f){0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) s += load8(w + i);
    double t = lanes_sum(s);
    for (; i < n; i++) t += w[i];
    return t;
}

/* The position in w [n] (weights >= 0, one > 0 at least) where the CDF first exceeds u times
 * the sum, blocks' sums (into sums [n / BLOCK + 1]) first, then one block walked. A zero weight
 * is never the answer. */
static int64_t invert_cdf(const float *w, int64_t n, double u, double *sums) {
    double total = 0;
    for (int64_t b = 0; b < n; b += BLOCK) total += sums[b / BLOCK] = block_sum(w + b, n - b < BLOCK ? n - b : BLOCK);
    const double target = u * total;
    double below = 0;
    int64_t b = 0;
    for (; b + BLOCK < n && below + sums[b / BLOCK] <= target; b += BLOCK) below += sums[b / BLOCK];
    const int64_t end = b + BLOCK < n ? b + BLOCK : n;
    for (int64_t i = b; i < end; i++)
        if (w[i] > 0.0f && (below += w[i]) > target) return i;
    int64_t i = end - 1; /* the block's sum and its walk rounded apart at its end */
    while (i > 0 && !(w[i] > 0.0f)) i--;
    return i;
}

/* The k-th largest of v [n] (0 < k <= n), v reordered: Hoare's selection. */
static float kth_largest(float *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        const float pivot = v[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i++] = v[j], v[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

/* A small k: the k-th largest of 1,024 groups' maxima (columns of the [V / 1024, 1024] view,
 * the tail's tokens on their own) bounds the k-th largest logit from below, so one compare
 * leaves few candidates, sorted into r->sorted. Their count, or 0 (the bound is -inf: a run of
 * -inf the histogram handles). */
DN_CLONES static int64_t top_k_by_group_max(const float *x, int64_t V, int64_t k, row_work *r) {
    enum { G = 1024 };
    float *m = r->w; /* G maxima, then the tail */
    for (int j = 0; j < G; j++) m[j] = -INFINITY;
    const int64_t whole = V - V % G;
    for (int64_t b = 0; b < whole; b += G)
        for (int j = 0; j < G; j += 8) store8(m + j, max8(load8(m + j), load8(x + b + j)));
    memcpy(m + G, x + whole, (size_t)(V - whole) * sizeof *m);
    const float bound = kth_largest(m, G + V - whole, k);
    if (bound == -INFINITY) return 0;
    int64_t n = 0;
    for (int64_t i = 0; i < V; i += 64) /* most blocks of 64 logits are below the bound */
        if (i + 64 > V || any_at_least(x + i, bound))
            for (int64_t j = i; j < i + 64 && j < V; j++)
                if (x[j] >= bound) r->sorted[n++] = (entry){x[j], (int32_t)j};
    qsort(r->sorted, (size_t)n, sizeof *r->sorted, by_value_desc);
    return n;
}

/* Any k: a histogram of the logits' keys finds the bucket holding the k-th largest; the tokens
 * above it and that bucket's, sorted, go into r->sorted. Returns k. */
static int64_t top_k_by_histogram(const float *x, int64_t V, int64_t k, row_work *r) {
    int32_t hist[KEY_BUCKETS] = {0};
    for (int64_t i = 0; i < V; i++) hist[order_key(x[i]) >> 20]++;
    int b = KEY_BUCKETS - 1;
    int64_t above = 0;
    while (above + hist[b] < k) above += hist[b--];
    int64_t na = 0, nb = 0; /* tokens above the bucket, then the bucket's own after them */
    entry *bucket = r->sorted + above;
    for (int64_t i = 0; i < V; i++) {
        const int at = (int)(order_key(x[i]) >> 20);
        if (at > b) r->sorted[na++] = (entry){x[i], (int32_t)i};
        else if (at == b) bucket[nb++] = (entry){x[i], (int32_t)i};
    }
    int same = 1; /* one value in the bucket (a run of -inf): token order is already the order */
    for (int64_t j = 1; j < nb && same; j++) same = bucket[j].v == bucket[0].v;
    if (!same) qsort(bucket, (size_t)nb, sizeof *bucket, by_value_desc);
    qsort(r->sorted, (size_t)k, sizeof *r->sorted, by_value_desc);
    return k;
}

/* The k largest logits (0 < k <= V; ties: lower id) into r->sorted[0..k), decreasing. */
static void top_k_sorted(const float *x, int64_t V, int64_t k, row_work *r) {
    if ((V >= 8 * 1024 && 8 * k <= 1024 ? top_k_by_group_max(x, V, k, r) : 0) < k) top_k_by_histogram(x, V, k, r);
}

/* Top-k, then top-p on the renormalized top k, then min-p, in decreasing order: the list
 * (r->ids, r->w), its length returned. */
static int64_t top_k_list(const float *x, int64_t V, const dn_sample_opts *o, row_work *r) {
    const int64_t k = o->top_k;
    top_k_sorted(x, V, k, r);
    const double inv_t = 1.0 / o->temperature, top = r->sorted[0].v;
    double mass = 0;
    for (int64_t j = 0; j < k; j++) {
        r->w[j] = (float)exp((r->sorted[j].v - top) * inv_t);
        r->ids[j] = r->sorted[j].i;
        mass += r->w[j];
    }
    int64_t keep = k;
    if (o->top_p < 1.0f) { /* the shortest prefix whose mass exceeds top_p */
        double cum = 0;
        for (keep = 0; keep < k && cum <= o->top_p * mass;) cum += r->w[keep++];
    }
    int64_t n = 0;
    while (n < keep && r->w[n] > 0.0f && r->w[n] >= o->min_p) n++; /* w decreases */
    return n;
}

/* The weight (and id) of the last token of the top-p nucleus, tokens ordered by decreasing
 * weight then id: a token is in it when (w, -id) >= (*tw, -*ti). Tokens under tau weigh less than
 * V * tau = mass - target together, so the nucleus ends at or above tau: both passes skip the
 * blocks of 64 with none above it (on a peaked row, nearly all); a bucket that then lacks some
 * lies at or below the edge's, whose tokens above tau are all counted. */
static void nucleus_edge(const float *all, int64_t V, double mass_all, double target, row_work *r, float *tw,
                         int64_t *ti) {
    static const int B = WEIGHT_BUCKETS;
    const float tau = (float)((mass_all - target) / (double)V * 0.999);
    double mass[WEIGHT_BUCKETS] = {0};
    uint32_t bits;
    for (int64_t b0 = 0; b0 < V; b0 += 64) {
        const int64_t end = b0 + 64 < V ? b0 + 64 : V;
        if (end - b0 < 64 || any_at_least(all + b0, tau))
            for (int64_t i = b0; i < end; i++) {
                memcpy(&bits, &all[i], sizeof bits);
                if (bits >> 19 < (uint32_t)B) mass[bits >> 19] += all[i]; /* NaN weighs nothing */
            }
    }
    double cum = 0;
    int b = B - 1;
    for (; b >= 0 && cum + mass[b] <= target; b--) cum += mass[b];
    *tw = -1.0f, *ti = V; /* rounding put the whole vocabulary within top_p: all kept */
    if (b < 0) return;
    int64_t nb = 0;
    for (int64_t b0 = 0; b0 < V; b0 += 64) {
        const int64_t end = b0 + 64 < V ? b0 + 64 : V;
        if (end - b0 < 64 || any_at_least(all + b0, tau))
            for (int64_t i = b0; i < end; i++) {
                memcpy(&bits, &all[i], sizeof bits);
                if ((int)(bits >> 19) == b) r->sorted[nb++] = (entry){all[i], (int32_t)i};
            }
    }
    qsort(r->sorted, (size_t)nb, sizeof *r->sorted, by_value_desc);
    int64_t j = 0;
    while (j < nb - 1 && (cum += r->sorted[j].v) <= target) j++;
    *tw = r->sorted[j].v, *ti = r->sorted[j].i;
}

/* Without top-k: every token's weight in r->all, those top-p and min-p leave out set to 0. */
static void vocabulary_weights(const float *x, int64_t V, float m, const dn_sample_opts *o, row_work *r) {
    const double mass = exp_row(x, V, m, 1.0f / o->temperature, r->all);
    float tw = -1.0f;
    int64_t ti = V;
    if (o->top_p < 1.0f) nucleus_edge(r->all, V, mass, o->top_p * mass, r, &tw, &ti);
    if (o->min_p > 0.0f || tw >= 0.0f) cut_row(r->all, V, o->min_p > 0.0f ? o->min_p : 0.0f, tw, ti);
}

/* This thread's row_work for a vocabulary of V; -1 when out of memory. */
static int row_scratch(int64_t V, row_work *r) {
    char *p = dn_scratch(DN_SCRATCH_SAMPLE, (size_t)V * (sizeof(entry) + sizeof(int32_t) + 2 * sizeof(float)) +
                                                (size_t)(V / BLOCK + 2) * sizeof(double));
    if (!p) return -1;
    *r = (row_work){(int32_t *)(p + 8 * V), (float *)(p + 12 * V), (float *)(p + 16 * V), (entry *)p,
                    (double *)(p + 20 * V + (8 - 20 * V % 8) % 8)};
    return 0;
}

/* Row x's token, or with dense set its weights into dense [V] (returning 0). -1: no memory. */
static int64_t sample_row(const float *x, int64_t V, const dn_sample_opts *o, float *dense) {
    const int64_t first = row_argmax(x, V);
    const float m = x[first];
    const int greedy = o->temperature <= 0.0f || !isfinite(m);
    if (greedy && !dense) return first;
    row_work r;
    if (row_scratch(V, &r)) return -1;
    const float *w = r.w;
    const int32_t *ids = r.ids;
    int64_t n = 0;
    if (!greedy && o->top_k > 0 && o->top_k < V) {
        n = top_k_list(x, V, o, &r);
    } else if (!greedy) {
        vocabulary_weights(x, V, m, o, &r);
        w = r.all, ids = NULL, n = V;
    }
    if (n == 0) /* greedy, or only NaN logits left nothing: the first largest logit */
        r.ids[0] = (int32_t)first, r.w[0] = 1.0f, w = r.w, ids = r.ids, n = 1;
    if (!dense) {
        const int64_t at = invert_cdf(w, n, o->u, r.sums);
        return ids ? ids[at] : at;
    }
    if (!ids) memcpy(dense, w, (size_t)V * sizeof *dense);
    else {
        memset(dense, 0, (size_t)V * sizeof *dense);
        for (int64_t j = 0; j < n; j++) dense[ids[j]] = w[j];
    }
    return 0;
}

int dn_sample(const float *logits, int64_t rows, int64_t V, const dn_sample_opts *opts, int32_t *ids) {
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(dn_team(rows))
    for (int64_t r = 0; r < rows; r++) {
        const int64_t id = sample_row(logits + r * V, V, &opts[r], NULL);
        ids[r] = id < 0 ? 0 : (int32_t)id;
        if (id < 0) {
#pragma omp atomic write
            failed = 1;
        }
    }
    return failed ? -1 : 0;
}

/* log_softmax(x) at token id, and its n largest (n <= V) into top_ids / top_lp, decreasing. */
static int logprobs_row(const float *x, int64_t V, int32_t id, int32_t n, float *token_lp, int32_t *top_ids,
                        float *top_lp) {
    row_work r;
    if (row_scratch(V, &r)) return -1;
    const float m = x[row_argmax(x, V)];
    const double lse = isfinite(m) ? m + log(exp_row(x, V, m, 1.0f, r.all)) : m;
    *token_lp = (float)(x[id] - lse);
    if (n <= 0) return 0;
    top_k_sorted(x, V, n, &r);
    for (int32_t j = 0; j < n; j++) top_ids[j] = r.sorted[j].i, top_lp[j] = (float)(r.sorted[j].v - lse);
    return 0;
}

int dn_logprobs(const float *logits, int64_t rows, int64_t V, const int32_t *ids, const int32_t *n, int32_t width,
                float *token_logprob, int32_t *top_ids, float *top_logprob) {
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(dn_team(rows))
    for (int64_t r = 0; r < rows; r++)
        if (n[r] >= 0 && logprobs_row(logits + r * V, V, ids[r], n[r], &token_logprob[r], top_ids + r * width,
                                      top_logprob + r * width)) {
#pragma omp atomic write
            failed = 1;
        }
    return failed ? -1 : 0;
}

int dn_sample_weights(const float *logits, int64_t V, const dn_sample_opts *opts, float *w) {
    return sample_row(logits, V, opts, w) < 0 ? -1 : 0;
}
