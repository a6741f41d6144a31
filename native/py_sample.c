/* Bindings: sample, logprobs, sample_weights (sample.c). */
#include <stdlib.h>

#include "pyarg.h"
#include "sample.h"

/* The kernels index a row with int32: a vocabulary of 1 .. 2^31 - 1. Raises and releases when not. */
static int bad_vocabulary(dn_args *a, Py_ssize_t V) {
    if (V > 0 && V <= 0x7fffffff) return 0;
    dn_fail(a, PyExc_ValueError, "vocabulary size %zd out of range", V);
    return 1;
}

static PyObject *py_sample(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"logits", "options", "ids", NULL};
    PyObject *ol, *oo, *oi;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:sample", names, &ol, &oo, &oi)) return NULL;
    dn_args a = {.fn = "sample"};
    Py_buffer *l = dn_take(&a, ol, "logits", 'f', 2, 0);
    Py_buffer *o = l ? dn_take(&a, oo, "options", 'd', 2, 0) : NULL;
    Py_buffer *ids = o ? dn_take(&a, oi, "ids", 'i', 1, 1) : NULL;
    if (!ids) return dn_done(&a, NULL);
    const Py_ssize_t B = l->shape[0], V = l->shape[1];
    if (dn_check_dim(&a, o, "options", 0, B) || dn_check_dim(&a, o, "options", 1, 5) ||
        dn_check_dim(&a, ids, "ids", 0, B))
        return dn_done(&a, NULL);
    if (bad_vocabulary(&a, V)) return NULL;
    dn_sample_opts *opts = malloc((size_t)(B ? B : 1) * sizeof *opts);
    if (!opts) return dn_fail(&a, PyExc_MemoryError, "no memory for %zd rows' options", B);
    for (Py_ssize_t r = 0; r < B; r++) {
        const double *row = (const double *)o->buf + 5 * r;
        const double k = row[1] < 0 ? 0 : row[1] > V ? (double)V : row[1]; /* beyond V: off */
        opts[r] = (dn_sample_opts){(float)row[0], (int32_t)k, (float)row[2], (float)row[3], row[4]};
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dn_sample(l->buf, B, V, opts, ids->buf);
    Py_END_ALLOW_THREADS
    free(opts);
    if (rc) return dn_fail(&a, PyExc_MemoryError, "no memory for the rows' scratch (vocabulary %zd)", V);
    return dn_done(&a, NULL);
}

static PyObject *py_logprobs(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"logits", "ids", "n", "token_logprob", "top_ids", "top_logprob", NULL};
    PyObject *ol, *oi, *on, *ot, *oti, *otl;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO:logprobs", names, &ol, &oi, &on, &ot, &oti, &otl)) return NULL;
    dn_args a = {.fn = "logprobs"};
    Py_buffer *l = dn_take(&a, ol, "logits", 'f', 2, 0);
    Py_buffer *ids = l ? dn_take(&a, oi, "ids", 'i', 1, 0) : NULL;
    Py_buffer *n = ids ? dn_take(&a, on, "n", 'i', 1, 0) : NULL;
    Py_buffer *t = n ? dn_take(&a, ot, "token_logprob", 'f', 1, 1) : NULL;
    Py_buffer *ti = t ? dn_take(&a, oti, "top_ids", 'i', 2, 1) : NULL;
    Py_buffer *tl = ti ? dn_take(&a, otl, "top_logprob", 'f', 2, 1) : NULL;
    if (!tl) return dn_done(&a, NULL);
    const Py_ssize_t B = l->shape[0], V = l->shape[1], W = ti->shape[1];
    if (dn_check_dim(&a, ids, "ids", 0, B) || dn_check_dim(&a, n, "n", 0, B) ||
        dn_check_dim(&a, t, "token_logprob", 0, B) || dn_check_dim(&a, ti, "top_ids", 0, B) ||
        dn_check_dim(&a, tl, "top_logprob", 0, B) || dn_check_dim(&a, tl, "top_logprob", 1, W))
        return dn_done(&a, NULL);
    if (bad_vocabulary(&a, V)) return NULL;
    for (Py_ssize_t r = 0; r < B; r++) {
        const int32_t id = ((int32_t *)ids->buf)[r], k = ((int32_t *)n->buf)[r];
        if (k >= 0 && (id < 0 || id >= V || k > W || k > V))
            return dn_fail(&a, PyExc_ValueError, "row %zd: token %d or %d top pairs outside the vocabulary %zd "
                           "or the width %zd", r, id, k, V, W);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dn_logprobs(l->buf, B, V, ids->buf, n->buf, (int32_t)W, t->buf, ti->buf, tl->buf);
    Py_END_ALLOW_THREADS
    if (rc) return dn_fail(&a, PyExc_MemoryError, "no memory for the rows' scratch (vocabulary %zd)", V);
    return dn_done(&a, NULL);
}

static PyObject *py_sample_weights(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"row", "temperature", "top_k", "top_p", "min_p", "out", NULL};
    PyObject *orow, *oo;
    dn_sample_opts o = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OfiffO:sample_weights", names, &orow, &o.temperature, &o.top_k,
                                     &o.top_p, &o.min_p, &oo))
        return NULL;
    dn_args a = {.fn = "sample_weights"};
    Py_buffer *row = dn_take(&a, orow, "row", 'f', 1, 0);
    Py_buffer *out = row ? dn_take(&a, oo, "out", 'f', 1, 1) : NULL;
    if (!out || dn_check_dim(&a, out, "out", 0, row->shape[0])) return dn_done(&a, NULL);
    if (bad_vocabulary(&a, row->shape[0])) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dn_sample_weights(row->buf, row->shape[0], &o, out->buf);
    Py_END_ALLOW_THREADS
    if (rc) return dn_fail(&a, PyExc_MemoryError, "no memory for the row's scratch");
    return dn_done(&a, NULL);
}

PyMethodDef dn_sample_methods[] = {
    {"sample", (PyCFunction)(void (*)(void))py_sample, METH_VARARGS | METH_KEYWORDS,
     "sample(logits, options, ids): one token a row of logits float32 [B, V] into ids int32 [B], "
     "rows in parallel. options float64 [B, 5], a row's (temperature (<= 0: greedy), top_k (0 or "
     ">= V: off), top_p (>= 1: off), min_p (<= 0: off), u in [0, 1): the number the kept weights' "
     "CDF is inverted at)."},
    {"logprobs", (PyCFunction)(void (*)(void))py_logprobs, METH_VARARGS | METH_KEYWORDS,
     "logprobs(logits, ids, n, token_logprob, top_ids, top_logprob): log_softmax of each row of logits "
     "float32 [B, V] whose n int32 [B] is >= 0: at ids int32 [B] into token_logprob float32 [B], and "
     "its n largest (decreasing, ties: lower id) into top_ids int32 / top_logprob float32 [B, W] "
     "(n <= W, n <= V). Rows with n < 0 are left alone."},
    {"sample_weights", (PyCFunction)(void (*)(void))py_sample_weights, METH_VARARGS | METH_KEYWORDS,
     "sample_weights(row, temperature, top_k, top_p, min_p, out): the unnormalized weights "
     "sample() draws row's token from, into out float32 [V] (0: left out)."},
    {NULL, NULL, 0, NULL},
};
