/* The decoder's layers in one call (decoder.h): the kernels of every op, in model.py's order. */
#include <math.h>
#include <stdio.h>

#include "decoder.h"
#include "elementwise.h"
#include "residual.h"

/* q and k through their norms: one weight over each head, or over the whole projection (its
 * sum of squares completed over the ranks when the heads are split). */
static int qk_norm(const dn_decoder_t *d, const dn_layer_t *l, dn_comm *comm, double timeout, int T,
                   char *err, size_t errlen) {
    const int D = d->head_dim, qw = d->n_heads * D, kvw = d->n_kv_heads * D;
    if (!d->qk_whole) {
        dn_rms_norm(d->q, l->q_norm, NULL, d->q, T * d->n_heads, D, d->eps);
        dn_rms_norm(d->k, l->k_norm, NULL, d->k, T * d->n_kv_heads, D, d->eps);
        return 0;
    }
    if (!comm) {
        dn_rms_norm(d->q, l->q_norm, NULL, d->q, T, qw, d->eps);
        dn_rms_norm(d->k, l->k_norm, NULL, d->k, T, kvw, d->eps);
        return 0;
    }
    int skip = d->k_shared_first ? D : 0;
    dn_sum_squares(d->q, T, qw, qw, d->norm_ss, 2);
    dn_sum_squares(d->k + skip, T, kvw - skip, kvw, d->norm_ss + 1, 2);
    if (dn_comm_allreduce(comm, d->norm_ss, (size_t)T * 2, timeout, err, errlen)) return -1;
    dn_scale_by_rms(d->q, T, qw, d->norm_ss, 2, (float)d->q_total, l->q_norm, d->eps);
    dn_scale_by_rms(d->k, T, kvw, d->norm_ss + 1, 2, (float)d->k_total, l->k_norm, d->eps);
    return 0;
}

/* The input of a sub-layer: norm(res + prev) into h, or (no norm) res += prev and res itself. */
static const float *sublayer_input(const dn_decoder_t *d, const float *norm, const float *bias, const float *prev,
                                   int T) {
    const int H = d->hidden;
    if (norm && d->layer_norm) {
        dn_layer_norm(prev ? prev : d->res, norm, bias, prev ? d->res : NULL, d->h, T, H, d->eps);
        return d->h;
    }
    if (norm) {
        dn_rms_norm(prev ? prev : d->res, norm, prev ? d->res : NULL, d->h, T, H, d->eps);
        return d->h;
    }
    if (prev) dn_add(d->res, prev, (long)T * H);
    return d->res;
}

/* out = the dense MLP of x, gated or plain: 0, or -1 when a kernel has no scratch memory. */
static int dense_mlp(const dn_decoder_t *d, const dn_layer_t *l, const float *x, int T, float *out) {
    if (!d->gated) { /* a plain MLP: act(x up^T + b) down^T */
        if (dn_linear(&l->gate_up, x, T, l->gate_up_bias, d->gate_up)) return -1;
        dn_act_rows(d->gate_up, d->act, (long)T * d->inter, d->glu, l->act_params);
    } else if (l->gate_up_bias) {
        if (dn_linear(&l->gate_up, x, T, l->gate_up_bias, d->gate_up)) return -1;
        dn_glu_mul(d->gate_up, d->act, T, d->inter, d->glu);
    } else if (dn_linear_glu(&l->gate_up, x, T, d->glu, d->gate_up, d->act)) {
        return -1;
    }
    return dn_linear(&l->down, d->act, T, l->down_bias, out);
}

int dn_decoder_run(const dn_decoder_t *d, dn_comm *comm, double timeout, int T,
                   const int32_t *positions, const int32_t *slots, const int32_t *block_tables,
                   int max_blocks, const int32_t *q_offsets, const int32_t *context_lens, int B,
                   char *err, size_t errlen) {
    const int H = d->hidden, D = d->head_dim, qw = d->n_heads * D, kvw = d->n_kv_heads * D;
    for (int i = 0; i < d->n_layers; i++) {
        const dn_layer_t *l = &d->layers[i];
        /* the previous layer's output o joins the residual stream as this layer reads it */
        const float *x = sublayer_input(d, l->attn_norm, l->attn_norm_bias, i ? d->o : NULL, T);
        /* one parallel region: a decode step's narrow k and v GEMVs (a few panels each) fill
         * the threads the q GEMV leaves idle instead of forking a team of their own */
        const dn_linear_job qkv[3] = {{&l->q, x, T, l->q_bias, d->q}, {&l->k, x, T, l->k_bias, d->k},
                                      {&l->v, x, T, l->v_bias, d->v}};
        if (dn_linear_jobs(qkv, 3)) goto no_memory;
        if (l->q_norm && !d->qk_after_rope && qk_norm(d, l, comm, timeout, T, err, errlen)) return -1;
        dn_rope(d->q, d->n_heads, qw, d->k, d->n_kv_heads, kvw, positions, l->cos_sin, T, D,
                d->rot_dim);
        if (l->q_norm && d->qk_after_rope && qk_norm(d, l, comm, timeout, T, err, errlen)) return -1;
        for (int t = 0; d->q_scale && t < T; t++) {
            float *q = d->q + (size_t)t * qw;
            const float s = d->q_scale[positions[t]];
            for (int j = 0; j < qw; j++) q[j] *= s;
        }
        dn_kv_write(&l->kv, d->k, d->v, slots, T);
        if (dn_attention(&l->kv, d->q, block_tables, max_blocks, q_offsets, context_lens, B,
                         d->n_heads, d->group, d->q_head0, d->scale, l->window, d->softcap,
                         l->sinks, d->attn) ||
            dn_linear(&l->o, d->attn, T, l->o_bias, d->o))
            goto no_memory;
        if (d->parallel) { /* the MLP of the same input; one allreduce sums both ranks' parts */
            if (dense_mlp(d, l, x, T, d->o2)) goto no_memory;
            dn_add(d->o, d->o2, (long)T * H);
            if (comm && dn_comm_allreduce(comm, d->o, (size_t)T * H, timeout, err, errlen)) return -1;
            continue;
        }
        if (comm && dn_comm_allreduce(comm, d->o, (size_t)T * H, timeout, err, errlen)) return -1;
        if (l->attn_out_norm) dn_rms_norm(d->o, l->attn_out_norm, NULL, d->o, T, H, d->eps);
        x = sublayer_input(d, l->mlp_norm, l->mlp_norm_bias, d->o, T);
        if (l->moe ? dn_moe(&d->moe, l->moe, d->moe_scratch, x, T, d->o) : dense_mlp(d, l, x, T, d->o))
            goto no_memory;
        if (comm && dn_comm_allreduce(comm, d->o, (size_t)T * H, timeout, err, errlen)) return -1;
        if (l->mlp_out_norm) dn_rms_norm(d->o, l->mlp_out_norm, NULL, d->o, T, H, d->eps);
    }
    return 0;
no_memory:
    snprintf(err, errlen, "no memory for kernel scratch buffers");
    return -1;
}
