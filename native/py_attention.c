/* Bindings: attention over the paged KV cache (see attention.h). Every shape, type and index
 * is checked here, so the kernels can trust their arguments. */
#include <math.h>

#include "py_shared.h"

int dn_check_step(dn_args *a, const dn_kv_cache_t *c, int T, const int32_t *offs,
                  const int32_t *ctx, const int32_t *tables, int B, int max_blocks) {
    if (offs[0] != 0 || offs[B] != T) {
        dn_fail(a, PyExc_ValueError, "q_offsets must run from 0 to T_total = %d, got %d..%d", T,
                offs[0], offs[B]);
        return -1;
    }
    for (int b = 0; b < B; b++) {
        int ql = offs[b + 1] - offs[b];
        if (ql < 0) {
            dn_fail(a, PyExc_ValueError, "q_offsets decreases at sequence %d", b);
            return -1;
        }
        if (ctx[b] < ql) {
            dn_fail(a, PyExc_ValueError, "context_lens[%d] = %d is less than its %d queries", b,
                    ctx[b], ql);
            return -1;
        }
        if (ctx[b] > (int64_t)max_blocks * c->block_size) {
            dn_fail(a, PyExc_ValueError, "context_lens[%d] = %d does not fit %d blocks of %d tokens",
                    b, ctx[b], max_blocks, c->block_size);
            return -1;
        }
        int used = ql ? (ctx[b] + c->block_size - 1) / c->block_size : 0;
        for (int j = 0; j < used; j++) {
            int id = tables[(int64_t)b * max_blocks + j];
            if (id < 0 || id >= c->num_blocks) {
                dn_fail(a, PyExc_IndexError, "block_tables[%d, %d] = %d is out of range for %d blocks",
                        b, j, id, c->num_blocks);
                return -1;
            }
        }
    }
    return 0;
}

int dn_check_groups(dn_args *a, int n_heads, int n_kv_heads, int *group, int q_head0) {
    if (*group == 0) { /* whole groups */
        if (n_heads < 1 || q_head0 || n_heads % n_kv_heads) {
            dn_fail(a, PyExc_ValueError, "q has %d heads, not a multiple of the %d kv heads", n_heads,
                    n_kv_heads);
            return -1;
        }
        *group = n_heads / n_kv_heads;
        return 0;
    }
    if (*group < 1 || q_head0 < 0 || q_head0 >= *group || n_heads < 1 ||
        (q_head0 + n_heads + *group - 1) / *group != n_kv_heads) {
        dn_fail(a, PyExc_ValueError,
                "%d query heads from head %d of a group of %d do not read exactly %d kv heads",
                n_heads, q_head0, *group, n_kv_heads);
        return -1;
    }
    return 0;
}

static int overlaps(const Py_buffer *x, const Py_buffer *y) {
    const char *a = x->buf, *b = y->buf;
    return a < b + y->len && b < a + x->len;
}

static PyObject *py_attention(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"q", "k_cache", "v_cache", "block_tables", "q_offsets",
                             "context_lens", "out", "scale", "k_scale", "v_scale", "k_zero",
                             "v_zero", "group", "q_head0", "window", "softcap", "sinks", NULL};
    PyObject *q, *bt, *qo, *cl, *out, *cache[6] = {NULL, NULL, Py_None, Py_None, Py_None, Py_None};
    PyObject *sinks_obj = Py_None;
    double scale, softcap = 0.0;
    int group = 0, q_head0 = 0, window = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOd|OOOOiiidO:attention", kwlist, &q,
                                     &cache[0], &cache[1], &bt, &qo, &cl, &out, &scale, &cache[2],
                                     &cache[3], &cache[4], &cache[5], &group, &q_head0, &window,
                                     &softcap, &sinks_obj))
        return NULL;
    dn_args a = {.fn = "attention"};
    if (window < 0) return dn_fail(&a, PyExc_ValueError, "window must be >= 0 (0: none), got %d", window);
    if (!(softcap >= 0.0 && isfinite((float)softcap))) /* NaN fails both */
        return dn_fail(&a, PyExc_ValueError, "softcap must be finite and >= 0 (0: none), got %g",
                       softcap);
    Py_buffer *qb = dn_take(&a, q, "q", 'f', 3, 0);
    if (!qb) return dn_done(&a, NULL);
    Py_buffer *ob = dn_take(&a, out, "out", 'f', 3, 1);
    if (!ob) return dn_done(&a, NULL);
    for (int d = 0; d < 3; d++)
        if (dn_check_dim(&a, ob, "out", d, qb->shape[d])) return dn_done(&a, NULL);
    if (overlaps(qb, ob)) return dn_fail(&a, PyExc_ValueError, "out must not overlap q");
    dn_kv_cache_t c;
    if (dn_take_kv_cache(&a, cache, 0, (int)qb->shape[2], &c)) return dn_done(&a, NULL);
    int T = (int)qb->shape[0], n_heads = (int)qb->shape[1];
    if (dn_check_groups(&a, n_heads, c.n_kv_heads, &group, q_head0)) return dn_done(&a, NULL);
    Py_buffer *btb = dn_take(&a, bt, "block_tables", 'i', 2, 0);
    if (!btb) return dn_done(&a, NULL);
    int B = (int)btb->shape[0], max_blocks = (int)btb->shape[1];
    Py_buffer *qob = dn_take(&a, qo, "q_offsets", 'i', 1, 0);
    if (!qob || dn_check_dim(&a, qob, "q_offsets", 0, (Py_ssize_t)B + 1)) return dn_done(&a, NULL);
    Py_buffer *clb = dn_take(&a, cl, "context_lens", 'i', 1, 0);
    if (!clb || dn_check_dim(&a, clb, "context_lens", 0, B)) return dn_done(&a, NULL);
    const int32_t *offs = qob->buf, *ctx = clb->buf, *tables = btb->buf;
    if (dn_check_step(&a, &c, T, offs, ctx, tables, B, max_blocks)) return dn_done(&a, NULL);
    Py_buffer *sb = dn_take_opt(&a, sinks_obj, "sinks", 'f', 1, 0);
    if (PyErr_Occurred() || (sb && dn_check_dim(&a, sb, "sinks", 0, n_heads))) return dn_done(&a, NULL);
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = dn_attention(&c, qb->buf, tables, max_blocks, offs, ctx, B, n_heads, group, q_head0,
                      (float)scale, window, (float)softcap, sb ? sb->buf : NULL, ob->buf);
    Py_END_ALLOW_THREADS;
    if (rc) return dn_fail(&a, PyExc_MemoryError, "no memory for the scratch buffer");
    return dn_done(&a, NULL);
}

PyMethodDef dn_attention_methods[] = {
    {"attention", (PyCFunction)(void (*)(void))py_attention, METH_VARARGS | METH_KEYWORDS,
     "attention(q, k_cache, v_cache, block_tables, q_offsets, context_lens, out, scale, "
     "k_scale=None, v_scale=None, k_zero=None, v_zero=None, group=0, q_head0=0, window=0, "
     "softcap=0.0, sinks=None): causal GQA attention of a batch step over the paged cache. q, out [T_total, "
     "n_heads, head_dim] float32; sequence b owns rows q_offsets[b]..q_offsets[b+1], the last "
     "positions of its context_lens[b] cached tokens. Head h reads kv head (h + q_head0) // group "
     "(group 0: n_heads / n_kv_heads): a tensor-parallel rank's heads may start or end inside a "
     "group. window > 0: the query at position p sees the keys at p - window < j <= p only. "
     "softcap > 0: each score s = scale * q.k becomes softcap * tanh(s / softcap) before the "
     "softmax. sinks: float32 [n_heads] or None: gpt-oss's per-head sink logit, one more term "
     "exp(sink) in each softmax's denominator (a key every query sees, with value 0)."},
    {NULL, NULL, 0, NULL},
};
