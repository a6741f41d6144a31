/* Bindings: rms_norm, rope, glu_mul, embedding (kernels in elementwise.c). */
#include "common.h"
#include "elementwise.h"
#include "pyarg.h"

/* Kernels index with int: refuse sizes beyond it rather than wrap. */
static int fits_int(dn_args *a, Py_buffer *v, const char *name) {
    for (int d = 0; d < v->ndim; d++)
        if (v->shape[d] > 0x7fffffff) {
            PyErr_Format(PyExc_ValueError, "%s: %s dimension %d is too large (%zd)", a->fn, name,
                         d, v->shape[d]);
            return -1;
        }
    return 0;
}

static int overlaps(const Py_buffer *x, const Py_buffer *y) {
    const char *a = x->buf, *b = y->buf;
    return x->len > 0 && y->len > 0 && a < b + y->len && b < a + x->len;
}

/* A written array must not share memory with another argument: the kernels read and write
 * row by row, so an overlap gives results that depend on the thread split. */
static int disjoint(dn_args *a, Py_buffer *w, const char *wname, Py_buffer *v, const char *vname) {
    if (!v || !overlaps(w, v)) return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s and %s share memory", a->fn, wname, vname);
    return -1;
}

static PyObject *py_rms_norm(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"x", "weight", "eps", "out", "residual", "centered", "bias", NULL};
    PyObject *ox, *ow, *oo, *orr = Py_None, *ob = Py_None;
    double eps;
    int centered = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOdO|OpO:rms_norm", names, &ox, &ow, &eps, &oo, &orr, &centered, &ob))
        return NULL;
    dn_args a = {.fn = "rms_norm"};
    Py_buffer *x = dn_take(&a, ox, "x", 'f', 2, 0);
    Py_buffer *w = x ? dn_take(&a, ow, "weight", 'f', 1, 0) : NULL;
    Py_buffer *o = w ? dn_take(&a, oo, "out", 'f', 2, 1) : NULL;
    Py_buffer *r = o ? dn_take_opt(&a, orr, "residual", 'f', 2, 1) : NULL;
    Py_buffer *b = o && !PyErr_Occurred() ? dn_take_opt(&a, ob, "bias", 'f', 1, 0) : NULL;
    if (!o || PyErr_Occurred()) return dn_done(&a, NULL);
    if (b && !centered) return dn_fail(&a, PyExc_ValueError, "a bias is a LayerNorm's (centered=True)");
    Py_ssize_t M = x->shape[0], N = x->shape[1];
    if (fits_int(&a, x, "x") || dn_check_dim(&a, w, "weight", 0, N) ||
        dn_check_dim(&a, o, "out", 0, M) || dn_check_dim(&a, o, "out", 1, N) ||
        (r && (dn_check_dim(&a, r, "residual", 0, M) || dn_check_dim(&a, r, "residual", 1, N))) ||
        (b && dn_check_dim(&a, b, "bias", 0, N)))
        return dn_done(&a, NULL);
    if (N == 0) return dn_fail(&a, PyExc_ValueError, "rows of x are empty (N = 0)");
    if (!(eps >= 0.0 && eps < 1.0)) /* NaN fails too */
        return dn_fail(&a, PyExc_ValueError, "eps must be in [0, 1), got %g", eps);
    /* out may be x itself (each element is read before it is written), nothing else */
    if (!(o->buf == x->buf && o->len == x->len) && disjoint(&a, o, "out", x, "x"))
        return dn_done(&a, NULL);
    if (disjoint(&a, o, "out", w, "weight") || disjoint(&a, o, "out", r, "residual") ||
        (r && (disjoint(&a, r, "residual", x, "x") || disjoint(&a, r, "residual", w, "weight"))))
        return dn_done(&a, NULL);
    Py_BEGIN_ALLOW_THREADS
    if (centered)
        dn_layer_norm(x->buf, w->buf, b ? b->buf : NULL, r ? r->buf : NULL, o->buf, (int)M, (int)N, (float)eps);
    else
        dn_rms_norm(x->buf, w->buf, r ? r->buf : NULL, o->buf, (int)M, (int)N, (float)eps);
    Py_END_ALLOW_THREADS
    return dn_done(&a, NULL);
}

static PyObject *py_rope(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"q", "k", "positions", "cos_sin", NULL};
    PyObject *oq, *ok, *op, *ocs;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO:rope", names, &oq, &ok, &op, &ocs))
        return NULL;
    dn_args a = {.fn = "rope"};
    Py_buffer *q = dn_take(&a, oq, "q", 'f', 3, 1);
    Py_buffer *k = q ? dn_take_opt(&a, ok, "k", 'f', 3, 1) : NULL;
    if (!q || PyErr_Occurred()) return dn_done(&a, NULL);
    Py_buffer *p = dn_take(&a, op, "positions", 'i', 1, 0);
    Py_buffer *cs = p ? dn_take(&a, ocs, "cos_sin", 'f', 2, 0) : NULL;
    if (!cs) return dn_done(&a, NULL);
    Py_ssize_t T = q->shape[0], H = q->shape[1], D = q->shape[2], P = cs->shape[0], R = cs->shape[1];
    if (fits_int(&a, q, "q") || (k && fits_int(&a, k, "k")) || fits_int(&a, cs, "cos_sin") ||
        (k && (dn_check_dim(&a, k, "k", 0, T) || dn_check_dim(&a, k, "k", 2, D))) ||
        dn_check_dim(&a, p, "positions", 0, T))
        return dn_done(&a, NULL);
    if (R % 2 != 0 || R == 0 || R > D)
        return dn_fail(&a, PyExc_ValueError,
                       "cos_sin has %zd columns: the rotary dim must be even, positive and at most "
                       "head_dim %zd", R, D);
    if (disjoint(&a, q, "q", k, "k") || disjoint(&a, q, "q", cs, "cos_sin") ||
        (k && disjoint(&a, k, "k", cs, "cos_sin")))
        return dn_done(&a, NULL);
    const int32_t *pos = p->buf;
    for (Py_ssize_t t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= P)
            return dn_fail(&a, PyExc_ValueError,
                           "positions[%zd] = %d is outside the cos_sin table [0, %zd)", t, pos[t],
                           P);
    int Hk = k ? (int)k->shape[1] : 0;
    Py_BEGIN_ALLOW_THREADS
    dn_rope(q->buf, (int)H, (long)(H * D), k ? k->buf : NULL, Hk, (long)Hk * D, pos, cs->buf,
            (int)T, (int)D, (int)R);
    Py_END_ALLOW_THREADS
    return dn_done(&a, NULL);
}

static PyObject *py_glu_mul(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"gate_up", "out", "act", NULL};
    PyObject *og, *oo;
    const char *act_name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|s:glu_mul", names, &og, &oo, &act_name)) return NULL;
    dn_args a = {.fn = "glu_mul"};
    dn_act act;
    if (dn_parse_act(&a, act_name, &act)) return NULL;
    Py_buffer *g = dn_take(&a, og, "gate_up", 'f', 2, 0);
    Py_buffer *o = g ? dn_take(&a, oo, "out", 'f', 2, 1) : NULL;
    if (!o) return dn_done(&a, NULL);
    Py_ssize_t M = g->shape[0], I = o->shape[1];
    if (fits_int(&a, g, "gate_up") || dn_check_dim(&a, o, "out", 0, M) ||
        dn_check_dim(&a, g, "gate_up", 1, 2 * I) || disjoint(&a, o, "out", g, "gate_up"))
        return dn_done(&a, NULL);
    Py_BEGIN_ALLOW_THREADS
    dn_glu_mul(g->buf, o->buf, (int)M, (int)I, act);
    Py_END_ALLOW_THREADS
    return dn_done(&a, NULL);
}

/* The item code of a buffer ('f', 'H', ...), or 0 when it has none we know. */
static char buffer_code(PyObject *obj) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_FORMAT | PyBUF_STRIDES) != 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = v.format ? v.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    char code = f[0] && !f[1] ? f[0] : 0;
    PyBuffer_Release(&v);
    return code;
}

static PyObject *py_embedding(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"ids", "table", "out", NULL};
    PyObject *oi, *ot, *oo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:embedding", names, &oi, &ot, &oo)) return NULL;
    dn_args a = {.fn = "embedding"};
    char code = buffer_code(ot);
    if (code != 'f' && code != 'H')
        return dn_fail(&a, PyExc_TypeError,
                       "table must be a float32 or uint16 (bf16 bits) array, got %s",
                       Py_TYPE(ot)->tp_name);
    Py_buffer *ids = dn_take(&a, oi, "ids", 'i', 1, 0);
    Py_buffer *t = ids ? dn_take(&a, ot, "table", code, 2, 0) : NULL;
    Py_buffer *o = t ? dn_take(&a, oo, "out", 'f', 2, 1) : NULL;
    if (!o) return dn_done(&a, NULL);
    Py_ssize_t T = ids->shape[0], V = t->shape[0], D = t->shape[1];
    if (fits_int(&a, ids, "ids") || fits_int(&a, t, "table") || dn_check_dim(&a, o, "out", 0, T) ||
        dn_check_dim(&a, o, "out", 1, D) || disjoint(&a, o, "out", t, "table") ||
        disjoint(&a, o, "out", ids, "ids"))
        return dn_done(&a, NULL);
    long bad = dn_embedding_first_bad(ids->buf, (long)T, (long)V);
    if (bad >= 0)
        return dn_fail(&a, PyExc_ValueError, "ids[%ld] = %d is not a token id (vocabulary size %zd)",
                       bad, ((const int32_t *)ids->buf)[bad], V);
    Py_BEGIN_ALLOW_THREADS
    if (code == 'f')
        dn_embedding_f32(ids->buf, t->buf, o->buf, (int)T, (int)D);
    else
        dn_embedding_bf16(ids->buf, t->buf, o->buf, (int)T, (int)D);
    Py_END_ALLOW_THREADS
    return dn_done(&a, NULL);
}

PyMethodDef dn_elementwise_methods[] = {
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_VARARGS | METH_KEYWORDS,
     "rms_norm(x, weight, eps, out, residual=None, centered=False): out = x / sqrt(mean(x^2) + eps) * "
     "weight per row; x, out float32 [M, N] (out may be x), weight [N]. With residual [M, N]: residual += x "
     "in place first and the norm is taken of it. centered: LayerNorm, the row's mean taken out first, "
     "plus bias [N] where given."},
    {"rope", (PyCFunction)(void (*)(void))py_rope, METH_VARARGS | METH_KEYWORDS,
     "rope(q, k, positions, cos_sin): rotary embedding in place, half-rotation layout, over the "
     "first R dims of each head (R, the rotary dim, is the table's width; the rest pass through). "
     "q float32 [T, heads, D], k [T, kv_heads, D] or None, positions int32 [T], cos_sin float32 "
     "[max_pos, R] (cos in the first R/2 columns, sin in the last; see dashinfer_server.rope)."},
    {"glu_mul", (PyCFunction)(void (*)(void))py_glu_mul, METH_VARARGS | METH_KEYWORDS,
     "glu_mul(gate_up, out, act='silu'): out = act(gate) * up, act 'silu' or 'gelu_tanh' (GELU "
     "with the tanh approximation); gate_up float32 [M, 2I] (gate columns first), out [M, I]."},
    {"embedding", (PyCFunction)(void (*)(void))py_embedding, METH_VARARGS | METH_KEYWORDS,
     "embedding(ids, table, out): out[t] = table[ids[t]]; ids int32 [T], table [V, D] float32 or "
     "uint16 (bf16 bits), out float32 [T, D]. An id outside [0, V) raises ValueError, nothing "
     "written."},
    {NULL, NULL, 0, NULL},
};
