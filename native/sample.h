/* One token per row of logits: greedy, or drawn after temperature, top-k, top-p and min-p, in
 * the order DashInfer and transformers apply them (dashinfer_server/sampler.py documents each).
 * Rows run in parallel, one thread a row, so a batch's sampling does not stay serial beside
 * kernels that scale with the cores. */
#pragma once
#include <stdint.h>

typedef struct {
    float temperature; /* <= 0: greedy (the first largest logit) */
    int32_t top_k;     /* 0 or >= V: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    double u;          /* the row's uniform number in [0, 1): the token is the inverse CDF at u */
} dn_sample_opts;

/* ids[r] for each of `rows` rows of logits [rows][V]. -1 when scratch memory ran out. */
int dn_sample(const float *logits, int64_t rows, int64_t V, const dn_sample_opts *opts, int32_t *ids);

/* log_softmax of each row r with n[r] >= 0 (n[r] <= V): at token ids[r] into token_logprob[r],
 * and its n[r] largest, decreasing (ties: lower id), into top_ids / top_logprob [rows][width].
 * Rows with n[r] < 0 are left alone. -1 when scratch memory ran out. */
int dn_logprobs(const float *logits, int64_t rows, int64_t V, const int32_t *ids, const int32_t *n, int32_t width,
                float *token_logprob, int32_t *top_ids, float *top_logprob);

/* The weights the token of one row of logits [V] is drawn from, unnormalized, into w [V] (0 for
 * every token left out): what dn_sample inverts at u, for tests. -1 when scratch memory ran out. */
int dn_sample_weights(const float *logits, int64_t V, const dn_sample_opts *opts, float *w);
