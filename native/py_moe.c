/* Bindings: moe (moe.h), and dn_take_moe, which decoder_new uses for a sparse layer's fields. */
#include <string.h>

#include "moe.h"
#include "py_shared.h"

const char *const DN_MOE_FIELDS[] = {"router", "experts_gate_up", "experts_down", "shared_gate_up",
                                     "shared_down", "shared_gate", "router_bias", "router_choice_bias",
                                     "experts_gate_up_bias", "experts_down_bias", NULL};

static PyObject *item(PyObject *fields, const char *name) {
    PyObject *o = PyDict_GetItemString(fields, name);
    return o ? o : Py_None;
}

int dn_open_linear(dn_args *a, const char *name, const uint8_t *buf, size_t len, dn_linear_w *w, int64_t n,
                   int64_t k) {
    const char *why = dn_linear_open(w, buf, len);
    if (why) {
        PyErr_Format(PyExc_ValueError, "%s: %s: %s", a->fn, name, why);
        return -1;
    }
    if (w->n != n || w->k != k) {
        PyErr_Format(PyExc_ValueError, "%s: %s is [%lld, %lld], expected [%lld, %lld]", a->fn, name,
                     (long long)w->n, (long long)w->k, (long long)n, (long long)k);
        return -1;
    }
    return 0;
}

/* One packed linear per row of a [n_local, stride] uint8 array, into a PyMem array *out. */
static int take_experts(dn_args *a, PyObject *obj, const char *name, int n_local, int64_t n, int64_t k,
                        dn_linear_w **out) {
    Py_buffer *v = dn_take(a, obj, name, 'B', 2, 0);
    if (!v || dn_check_dim(a, v, name, 0, n_local)) return -1;
    if (!(*out = PyMem_Calloc((size_t)n_local, sizeof **out))) {
        PyErr_NoMemory();
        return -1;
    }
    for (int j = 0; j < n_local; j++)
        if (dn_open_linear(a, name, (const uint8_t *)v->buf + (size_t)j * v->shape[1], (size_t)v->shape[1],
                        &(*out)[j], n, k))
            return -1;
    return 0;
}

/* An optional float32 bias array of the given shape (rows 0: a vector), or NULL. */
static int take_bias(dn_args *a, PyObject *obj, const char *name, int64_t rows, int64_t n, const float **out) {
    *out = NULL;
    if (obj == Py_None) return 0;
    Py_buffer *v = dn_take(a, obj, name, 'f', rows ? 2 : 1, 0);
    if (!v || (rows && dn_check_dim(a, v, name, 0, rows)) || dn_check_dim(a, v, name, rows ? 1 : 0, n)) return -1;
    *out = v->buf;
    return 0;
}

void dn_moe_weights_release(dn_moe_weights *w) {
    PyMem_Free(w->gate_up);
    PyMem_Free(w->down);
    w->gate_up = w->down = NULL;
}

int dn_take_moe(dn_args *a, PyObject *fields, dn_moe_shape *s, dn_moe_weights *w) {
    const int64_t H = s->hidden;
    Py_buffer *r = dn_take(a, item(fields, "router"), "router", 'B', 1, 0);
    if (!r || dn_open_linear(a, "router", r->buf, (size_t)r->len, &w->router, s->n_experts, H)) return -1;
    if (w->router.wtype != DN_W_F32) {
        PyErr_Format(PyExc_ValueError, "%s: router must be packed f32 (its logits choose the experts)", a->fn);
        return -1;
    }
    /* the first sparse layer gives one expert's width on this rank; every other must agree */
    PyObject *gu = item(fields, "experts_gate_up");
    if (!s->inter) {
        Py_buffer *probe = dn_take(a, gu, "experts_gate_up", 'B', 2, 0);
        dn_linear_w first;
        if (!probe || probe->shape[0] != s->n_local ||
            dn_linear_open(&first, probe->buf, (size_t)probe->shape[1])) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "%s: experts_gate_up must hold %d packed experts", a->fn,
                             s->n_local);
            return -1;
        }
        s->inter = (int)(first.n / 2);
    }
    if (take_experts(a, gu, "experts_gate_up", s->n_local, 2 * (int64_t)s->inter, H, &w->gate_up) ||
        take_experts(a, item(fields, "experts_down"), "experts_down", s->n_local, H, s->inter, &w->down) ||
        take_bias(a, item(fields, "router_bias"), "router_bias", 0, s->n_experts, &w->router_bias) ||
        take_bias(a, item(fields, "router_choice_bias"), "router_choice_bias", 0, s->n_experts, &w->choice_bias) ||
        take_bias(a, item(fields, "experts_gate_up_bias"), "experts_gate_up_bias", s->n_local, 2 * (int64_t)s->inter,
                  &w->gate_up_bias) ||
        take_bias(a, item(fields, "experts_down_bias"), "experts_down_bias", s->n_local, H, &w->down_bias))
        return -1;
    PyObject *sgu = item(fields, "shared_gate_up");
    if ((sgu == Py_None) != (item(fields, "shared_down") == Py_None) || (sgu == Py_None) == !!s->shared_inter ||
        (sgu == Py_None && item(fields, "shared_gate") != Py_None)) {
        PyErr_Format(PyExc_ValueError, "%s: shared_gate_up and shared_down (and shared_gate, when the shared expert "
                     "has one) come together, in every sparse layer or none", a->fn);
        return -1;
    }
    if (sgu == Py_None) return 0;
    Py_buffer *g = dn_take(a, sgu, "shared_gate_up", 'B', 1, 0);
    if (!g || dn_open_linear(a, "shared_gate_up", g->buf, (size_t)g->len, &w->shared_gate_up,
                          2 * (int64_t)s->shared_inter, H))
        return -1;
    Py_buffer *d = dn_take(a, item(fields, "shared_down"), "shared_down", 'B', 1, 0);
    if (!d || dn_open_linear(a, "shared_down", d->buf, (size_t)d->len, &w->shared_down, H, s->shared_inter))
        return -1;
    if (item(fields, "shared_gate") == Py_None) return 0; /* GLM-4.5's: added ungated */
    Py_buffer *sg = dn_take(a, item(fields, "shared_gate"), "shared_gate", 'f', 1, 0);
    if (!sg || dn_check_dim(a, sg, "shared_gate", 0, H)) return -1;
    w->shared_gate = sg->buf;
    return 0;
}

int dn_moe_parse_scoring(const char *fn, const char *name, int *sigmoid) {
    if (!name || !strcmp(name, "softmax")) *sigmoid = 0;
    else if (!strcmp(name, "sigmoid")) *sigmoid = 1;
    else {
        PyErr_Format(PyExc_ValueError, "%s: scoring must be 'softmax' or 'sigmoid', not '%s'", fn, name);
        return -1;
    }
    return 0;
}

int dn_moe_shape_init(dn_moe_shape *s, int n_experts, int top_k, int norm_topk, int sigmoid, double routed_scale,
                      int expert0, int expert_step, int hidden, int shared_inter, dn_act act) {
    if (n_experts < 1 || top_k < 1 || top_k > n_experts || expert_step < 1 || expert0 < 0 ||
        expert0 >= expert_step || expert0 >= n_experts || shared_inter < 0 || !(routed_scale > 0) ||
        isinf(routed_scale)) {
        PyErr_Format(PyExc_ValueError, "moe: need 1 <= top_k (%d) <= n_experts (%d) and 0 <= expert0 (%d) < "
                     "expert_step (%d), shared_inter (%d) >= 0, routed_scale (%g) > 0", top_k, n_experts, expert0,
                     expert_step, shared_inter, routed_scale);
        return -1;
    }
    *s = (dn_moe_shape){.n_experts = n_experts, .top_k = top_k, .norm_topk = !!norm_topk, .sigmoid = !!sigmoid,
                        .routed_scale = (float)routed_scale, .expert0 = expert0,
                        .expert_step = expert_step, .n_local = (n_experts - expert0 + expert_step - 1) / expert_step,
                        .hidden = hidden, .shared_inter = shared_inter, .act = act};
    return 0;
}

static PyObject *py_moe(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"x", "weights", "out", "n_experts", "top_k", "norm_topk", "act", "expert0",
                             "expert_step", "shared_inter", "max_tokens", "scoring", "routed_scale", NULL};
    PyObject *x_obj, *fields, *o_obj;
    int n_experts, top_k, norm_topk = 0, expert0 = 0, expert_step = 1, shared_inter = 0, max_tokens = 0, sigmoid;
    const char *act_name = NULL, *scoring = NULL;
    double routed_scale = 1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!Oii|psiiiisd:moe", kwlist, &x_obj, &PyDict_Type, &fields, &o_obj,
                                     &n_experts, &top_k, &norm_topk, &act_name, &expert0, &expert_step,
                                     &shared_inter, &max_tokens, &scoring, &routed_scale))
        return NULL;
    dn_args a = {.fn = "moe"};
    dn_act act;
    if (dn_parse_act(&a, act_name, &act) || dn_moe_parse_scoring("moe", scoring, &sigmoid)) return NULL;
    Py_buffer *x = dn_take(&a, x_obj, "x", 'f', 2, 0), *o;
    if (!x || !(o = dn_take(&a, o_obj, "out", 'f', 2, 1)) || dn_check_dim(&a, o, "out", 0, x->shape[0]) ||
        dn_check_dim(&a, o, "out", 1, x->shape[1]))
        return dn_done(&a, NULL);
    dn_moe_shape s;
    dn_moe_weights w = {0};
    dn_moe_scratch *sc = NULL;
    int T = (int)x->shape[0], rc = 0;
    if (dn_moe_shape_init(&s, n_experts, top_k, norm_topk, sigmoid, routed_scale, expert0, expert_step,
                          (int)x->shape[1], shared_inter, act) ||
        dn_take_moe(&a, fields, &s, &w))
        goto done;
    if (!(sc = dn_moe_scratch_new(&s, max_tokens > T ? max_tokens : T))) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    rc = dn_moe(&s, &w, sc, x->buf, T, o->buf);
    Py_END_ALLOW_THREADS;
    if (rc) PyErr_SetString(PyExc_MemoryError, "moe: no memory for kernel scratch buffers");
done:
    dn_moe_scratch_free(sc);
    dn_moe_weights_release(&w);
    return dn_done(&a, NULL);
}

PyMethodDef dn_moe_methods[] = {
    {"moe", (PyCFunction)(void (*)(void))py_moe, METH_VARARGS | METH_KEYWORDS,
     "moe(x, weights, out, n_experts, top_k, norm_topk=False, act='silu', expert0=0, expert_step=1,\n"
     "shared_inter=0, max_tokens=T, scoring='softmax', routed_scale=1.0): out[T, H] = the mixture-of-experts MLP\n"
     "of x[T, H] (native/moe.h), this rank's part; scoring 'sigmoid' scores each expert alone.\n"
     "weights: a dict: router (packed f32 [n_experts, H]); experts_gate_up, experts_down (uint8\n"
     "[n_local, stride], one packed linear per row: [2I, H] gate then up rows, [H, I]) for experts\n"
     "expert0, expert0 + expert_step, ...; with shared_inter, shared_gate_up, shared_down (packed) and\n"
     "optionally shared_gate (float32 [H]); optional float32 biases router_bias [n_experts], experts_gate_up_bias\n"
     "[n_local, 2I], experts_down_bias [n_local, H] (gpt-oss); router_choice_bias [n_experts], added to\n"
     "the scores to choose the experts only (GLM-4.5). max_tokens: the scratch's tokens, as a\n"
     "decoder's (its slots, T * top_k, past it run the experts as a prompt's work items). Releases the GIL."},
    {NULL, NULL, 0, NULL},
};
