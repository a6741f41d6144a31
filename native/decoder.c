/* The decoder's layers in one call (decoder.h): the kernels of every op, in model.py's order. */
#include <stdio.h>

#include "decoder.h"
#include "elementwise.h"

int dn_decoder_run(const dn_decoder_t *d, dn_comm *comm, double timeout, int T,
                   const int32_t *positions, const int32_t *slots, const int32_t *block_tables,
                   int max_blocks, const int32_t *q_offsets, const int32_t *context_lens, int B,
                   char *err, size_t errlen) {
    const int H = d->hidden, D = d->head_dim, qw = d->n_heads * D, kvw = d->n_kv_heads * D;
    for (int i = 0; i < d->n_layers; i++) {
        const dn_layer_t *l = &d->layers[i];
        /* res += o (the previous layer's output), h = norm(res) */
        if (i == 0) dn_rms_norm(d->res, l->input_norm, NULL, d->h, T, H, d->eps);
        else dn_rms_norm(d->o, l->input_norm, d->res, d->h, T, H, d->eps);
        if (dn_linear(&l->q, d->h, T, l->q_bias, d->q) || dn_linear(&l->k, d->h, T, l->k_bias, d->k) ||
            dn_linear(&l->v, d->h, T, l->v_bias, d->v))
            goto no_memory;
        dn_rope(d->q, d->n_heads, qw, d->k, d->n_kv_heads, kvw, positions, d->cos_sin, T, D,
                d->rotary_dim);
        dn_kv_write(&l->kv, d->k, d->v, slots, T);
        if (dn_attention(&l->kv, d->q, block_tables, max_blocks, q_offsets, context_lens, B,
                         d->n_heads, d->group, d->q_head0, d->scale, d->attn) ||
            dn_linear(&l->o, d->attn, T, NULL, d->o))
            goto no_memory;
        if (comm && dn_comm_allreduce(comm, d->o, (size_t)T * H, timeout, err, errlen)) return -1;
        dn_rms_norm(d->o, l->post_norm, d->res, d->h, T, H, d->eps);
        if (dn_linear_glu(&l->gate_up, d->h, T, DN_ACT_SILU, d->gate_up, d->act)) goto no_memory;
        if (dn_linear(&l->down, d->act, T, NULL, d->o)) goto no_memory;
        if (comm && dn_comm_allreduce(comm, d->o, (size_t)T * H, timeout, err, errlen)) return -1;
    }
    return 0;
no_memory:
    snprintf(err, errlen, "no memory for kernel scratch buffers");
    return -1;
}
