/* Bindings: decoder_new, decoder_run (decoder.h). decoder_new checks every weight, workspace
 * and cache array once and holds their buffers for the decoder's life; decoder_run checks only
 * the step's plan, so a step costs one call. */
#include <math.h>
#include <string.h>

#include "decoder.h"
#include "py_shared.h"

#define CAPSULE "dashinfer.decoder"

/* A layer's fields: weights.py's LayerWeights, kv_cache.py's arrays, its rope table and window. */
static const char *const LAYER_FIELDS[] = {
    "attn_norm", "attn_out_norm", "mlp_norm", "mlp_out_norm", "q_norm", "k_norm", "q", "k", "v", "o",
    "gate_up", "down", "q_bias", "k_bias", "v_bias", "o_bias", "gate_up_bias", "down_bias",
    "k_cache", "v_cache", "k_scale", "v_scale", "k_zero", "v_zero", "cos_sin", "window", "sinks", "act_params",
    "attn_norm_bias", "mlp_norm_bias", NULL};
static const char *const KV_FIELDS[6] = {"k_cache", "v_cache", "k_scale", "v_scale", "k_zero", "v_zero"};

typedef struct {
    dn_decoder_t d;
    dn_args *held; /* the buffers d points into: [0] workspace, then 3 per layer (its weights, its
                      cache, its experts) */
    int n_held;
    dn_moe_weights *moe; /* [n_layers]: a sparse layer's experts (l->moe points here) */
} box_t;

static void release(box_t *b) {
    for (int i = 0; i < b->n_held; i++) dn_done(&b->held[i], Py_None);
    for (int i = 0; b->moe && i < b->d.n_layers; i++) dn_moe_weights_release(&b->moe[i]);
    dn_moe_scratch_free(b->d.moe_scratch);
    PyMem_Free(b->moe);
    PyMem_Free(b->held);
    PyMem_Free(b->d.layers);
    PyMem_Free(b);
}

static void destroy(PyObject *cap) {
    box_t *b = PyCapsule_GetPointer(cap, CAPSULE);
    if (b) release(b);
}

static int take_linear(dn_args *a, PyObject *obj, const char *name, dn_linear_w *w, int64_t n,
                       int64_t k) {
    Py_buffer *v = dn_take(a, obj, name, 'B', 1, 0);
    return v ? dn_open_linear(a, name, v->buf, (size_t)v->len, w, n, k) : -1;
}

static const float *take_vector(dn_args *a, PyObject *obj, const char *name, int64_t n, int optional) {
    if (optional && obj == Py_None) return NULL;
    Py_buffer *v = dn_take(a, obj, name, 'f', 1, 0);
    if (!v || dn_check_dim(a, v, name, 0, n)) return NULL;
    return v->buf;
}

/* layer[name], borrowed; None when the layer lacks it (dn_take then names what is missing). */
static PyObject *field(PyObject *layer, const char *name) {
    PyObject *o = PyDict_GetItemString(layer, name);
    return o ? o : Py_None;
}

/* A layer names no field decoder_new does not know: a misspelt optional one (a bias, a cache
 * scale) would otherwise be dropped without a word. */
static int check_fields(PyObject *layer) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(layer, &pos, &key, &value)) {
        const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (!name) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "decoder_new: a layer's keys are field names (str)");
            return -1;
        }
        int known = 0;
        for (int i = 0; LAYER_FIELDS[i] && !known; i++) known = !strcmp(name, LAYER_FIELDS[i]);
        for (int i = 0; DN_MOE_FIELDS[i] && !known; i++) known = !strcmp(name, DN_MOE_FIELDS[i]);
        if (!known) {
            PyErr_Format(PyExc_ValueError, "decoder_new: a layer has no field %R", key);
            return -1;
        }
    }
    return 0;
}

/* A layer's arrays, by name: norms, weights, biases and rope table into held[0], the cache into
 * held[1], a sparse layer's experts (it has a router) into held[2] and *moe.
 * qk_whole: q_norm and k_norm span the rank's whole q and k rows (else one head). */
static int take_layer(dn_args held[3], PyObject *layer, dn_decoder_t *d, dn_layer_t *l, int qk_whole,
                      dn_moe_weights *moe) {
    if (!PyDict_Check(layer)) {
        PyErr_SetString(PyExc_TypeError, "decoder_new: each layer is a dict of named arrays");
        return -1;
    }
    if (check_fields(layer)) return -1;
    dn_args *a = &held[0];
    int64_t H = d->hidden, D = d->head_dim, qw = (int64_t)d->n_heads * D, I = d->inter, GU = (d->gated ? 2 : 1) * I;
    /* the cache first: it gives the kv heads */
    PyObject *cache[6];
    for (int i = 0; i < 6; i++) cache[i] = field(layer, KV_FIELDS[i]);
    if (dn_take_kv_cache(&held[1], cache, 1, d->head_dim, &l->kv)) return -1;
    int64_t kvw = (int64_t)l->kv.n_kv_heads * D;
    struct {
        const char *name;
        const float **v;
        int64_t n;
    } vectors[] = {{"attn_norm", &l->attn_norm, H}, {"attn_out_norm", &l->attn_out_norm, H},
                   {"mlp_norm", &l->mlp_norm, H},   {"mlp_out_norm", &l->mlp_out_norm, H},
                   {"q_norm", &l->q_norm, qk_whole ? qw : D}, {"k_norm", &l->k_norm, qk_whole ? kvw : D},
                   {"q_bias", &l->q_bias, qw},      {"k_bias", &l->k_bias, kvw},
                   {"v_bias", &l->v_bias, kvw},     {"o_bias", &l->o_bias, H},
                   {"gate_up_bias", &l->gate_up_bias, GU}, {"down_bias", &l->down_bias, H},
                   {"sinks", &l->sinks, d->n_heads}, {"act_params", &l->act_params, 4},
                   {"attn_norm_bias", &l->attn_norm_bias, H}, {"mlp_norm_bias", &l->mlp_norm_bias, H}};
    for (size_t i = 0; i < sizeof vectors / sizeof *vectors; i++) {
        *vectors[i].v = take_vector(a, field(layer, vectors[i].name), vectors[i].name, vectors[i].n, 1);
        if (PyErr_Occurred()) return -1;
    }
    if ((l->attn_norm_bias || l->mlp_norm_bias) && !d->layer_norm) {
        PyErr_SetString(PyExc_ValueError, "decoder_new: norm biases are LayerNorms' (layer_norm=1)");
        return -1;
    }
    if ((d->glu == DN_ACT_XIELU) != !!l->act_params) {
        PyErr_SetString(PyExc_ValueError, "decoder_new: act 'xielu' and each layer's act_params come together");
        return -1;
    }
    if (!l->q_norm != !l->k_norm) {
        PyErr_SetString(PyExc_ValueError, "decoder_new: q_norm and k_norm come together");
        return -1;
    }
    struct {
        const char *name;
        dn_linear_w *w;
        int64_t n, k;
    } linears[] = {{"q", &l->q, qw, H},  {"k", &l->k, kvw, H},          {"v", &l->v, kvw, H},
                   {"o", &l->o, H, qw}, {"gate_up", &l->gate_up, GU, H}, {"down", &l->down, H, I}};
    int sparse = field(layer, "router") != Py_None;
    if (sparse && !d->moe.n_experts) {
        PyErr_SetString(PyExc_ValueError, "decoder_new: a layer has a router but n_experts is 0");
        return -1;
    }
    for (int i = 0; i < (sparse ? 4 : 6); i++) /* a sparse layer's MLP is its experts */
        if (take_linear(a, field(layer, linears[i].name), linears[i].name, linears[i].w,
                        linears[i].n, linears[i].k))
            return -1;
    if (sparse) {
        if (dn_take_moe(&held[2], layer, &d->moe, moe)) return -1;
        l->moe = moe;
    }
    Py_buffer *c = dn_take(a, field(layer, "cos_sin"), "cos_sin", 'f', 2, 0);
    if (!c || dn_check_dim(a, c, "cos_sin", 1, d->rot_dim)) return -1;
    if (c->shape[0] < d->max_pos || !d->max_pos) d->max_pos = (int)c->shape[0];
    l->cos_sin = c->buf;
    PyObject *w = field(layer, "window");
    long window = w == Py_None ? 0 : PyLong_AsLong(w);
    if (window == -1 && PyErr_Occurred()) return -1;
    if (window < 0 || window > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "decoder_new: window %ld must be 0 (none) or a positive int", window);
        return -1;
    }
    l->window = (int)window;
    return 0;
}

static PyObject *py_decoder_new(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"layers", "workspace", "n_heads", "eps", "scale", "group", "q_head0",
                             "softcap", "act", "rot_dim", "qk_whole", "q_total", "k_total",
                             "k_shared_first", "n_experts", "top_k", "norm_topk", "expert0",
                             "expert_step", "shared_inter", "qk_after_rope", "scoring", "routed_scale", "q_scale",
                             "layer_norm", "parallel", "gated", NULL};
    PyObject *layers, *ws, *q_scale = Py_None;
    int n_heads, group = 0, q_head0 = 0, rot_dim = 0, qk_whole = 0, k_shared_first = 0;
    int q_total = 0, k_total = 0, n_experts = 0, top_k = 0, norm_topk = 0, expert0 = 0, expert_step = 1;
    int shared_inter = 0, qk_after_rope = 0, sigmoid, layer_norm = 0, parallel = 0, gated = 1;
    double eps, scale, softcap = 0.0, routed_scale = 1.0;
    const char *act = "silu", *scoring = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOidd|iidsiiiiiiiiiiiisdOiii:decoder_new", kwlist, &layers, &ws,
                                     &n_heads, &eps, &scale, &group, &q_head0, &softcap, &act,
                                     &rot_dim, &qk_whole, &q_total, &k_total, &k_shared_first,
                                     &n_experts, &top_k, &norm_topk, &expert0, &expert_step,
                                     &shared_inter, &qk_after_rope, &scoring, &routed_scale, &q_scale,
                                     &layer_norm, &parallel, &gated))
        return NULL;
    if (dn_moe_parse_scoring("decoder_new", scoring, &sigmoid)) return NULL;
    if (!PyList_Check(layers) || PyList_GET_SIZE(layers) < 1)
        return PyErr_Format(PyExc_TypeError, "decoder_new: layers must be a non-empty list");
    if (!PyDict_Check(ws))
        return PyErr_Format(PyExc_TypeError, "decoder_new: workspace must be a dict of named arrays "
                                             "(res, h, o, q, k, v, attn, gate_up, act, norm_ss)");
    if (n_heads < 1) return PyErr_Format(PyExc_ValueError, "decoder_new: n_heads must be >= 1");
    dn_args act_arg = {.fn = "decoder_new"};
    dn_act glu;
    if (dn_parse_mlp_act(&act_arg, act, &glu)) return NULL;
    if (gated && (glu == DN_ACT_RELU2 || glu == DN_ACT_XIELU))
        return PyErr_Format(PyExc_ValueError, "decoder_new: act '%s' is a plain MLP's (gated=0)", act);
    if (!(softcap >= 0.0) || isinf(softcap))
        return PyErr_Format(PyExc_ValueError, "decoder_new: softcap must be 0 (none) or positive");
    int n_layers = (int)PyList_GET_SIZE(layers);
    box_t *b = PyMem_Calloc(1, sizeof *b);
    if (!b) return PyErr_NoMemory();
    b->held = PyMem_Calloc(1 + 3 * (size_t)n_layers, sizeof *b->held);
    b->d.layers = PyMem_Calloc((size_t)n_layers, sizeof *b->d.layers);
    b->moe = PyMem_Calloc((size_t)n_layers, sizeof *b->moe);
    b->d.n_layers = n_layers;
    if (!b->held || !b->d.layers || !b->moe) {
        release(b);
        return PyErr_NoMemory();
    }
    for (int i = 0; i < 1 + 3 * n_layers; i++) b->held[i].fn = "decoder_new";
    b->n_held = 1 + 3 * n_layers;
    dn_decoder_t *d = &b->d;
    dn_args *a = &b->held[0];
    enum { N_WS = 10 };
    static const char *const names[N_WS] = {"res", "h", "o", "q", "k", "v", "attn", "gate_up", "act",
                                            "norm_ss"};
    float **dst[N_WS] = {&d->res, &d->h, &d->o, &d->q, &d->k, &d->v, &d->attn, &d->gate_up, &d->act,
                         &d->norm_ss};
    Py_buffer *v[N_WS];
    for (int i = 0; i < N_WS; i++) {
        if (!(v[i] = dn_take(a, field(ws, names[i]), names[i], 'f', 2, 1))) goto fail;
        if (i && dn_check_dim(a, v[i], names[i], 0, v[0]->shape[0])) goto fail;
        *dst[i] = v[i]->buf;
    }
    d->n_layers = n_layers, d->n_heads = n_heads, d->eps = (float)eps, d->scale = (float)scale;
    d->softcap = (float)softcap, d->glu = glu, d->qk_whole = !!qk_whole, d->qk_after_rope = !!qk_after_rope;
    d->k_shared_first = !!k_shared_first, d->layer_norm = !!layer_norm, d->parallel = !!parallel, d->gated = !!gated;
    if (d->parallel) { /* the MLP's output beside the attention's */
        Py_buffer *o2 = dn_take(a, field(ws, "o2"), "o2", 'f', 2, 1);
        if (!o2 || dn_check_dim(a, o2, "o2", 0, v[0]->shape[0]) || dn_check_dim(a, o2, "o2", 1, v[0]->shape[1]))
            goto fail;
        d->o2 = o2->buf;
    }
    d->max_tokens = (int)v[0]->shape[0], d->hidden = (int)v[0]->shape[1];
    d->inter = (int)v[8]->shape[1];
    if (v[3]->shape[1] % n_heads) {
        PyErr_Format(PyExc_ValueError, "decoder_new: q's %zd columns do not split into %d heads",
                     v[3]->shape[1], n_heads);
        goto fail;
    }
    d->head_dim = (int)(v[3]->shape[1] / n_heads);
    d->rot_dim = rot_dim ? rot_dim : d->head_dim;
    if (d->rot_dim % 2 || d->rot_dim < 0 || d->rot_dim > d->head_dim) {
        PyErr_Format(PyExc_ValueError, "decoder_new: rot_dim %d must be even and at most head_dim %d",
                     d->rot_dim, d->head_dim);
        goto fail;
    }
    if (dn_check_dim(a, v[1], "h", 1, d->hidden) || dn_check_dim(a, v[2], "o", 1, d->hidden) ||
        dn_check_dim(a, v[6], "attn", 1, v[3]->shape[1]) || dn_check_dim(a, v[5], "v", 1, v[4]->shape[1]) ||
        dn_check_dim(a, v[7], "gate_up", 1, 2 * (Py_ssize_t)d->inter) ||
        dn_check_dim(a, v[9], "norm_ss", 1, 2))
        goto fail;
    if (n_experts && dn_moe_shape_init(&d->moe, n_experts, top_k, norm_topk, sigmoid, routed_scale, expert0,
                                       expert_step, d->hidden, shared_inter, d->glu))
        goto fail;
    int sparse = 0;
    for (int i = 0; i < n_layers; i++) {
        dn_layer_t *l = &d->layers[i];
        if (take_layer(&b->held[1 + 3 * i], PyList_GET_ITEM(layers, i), d, l, d->qk_whole, &b->moe[i]))
            goto fail;
        sparse |= l->moe != NULL;
        const dn_kv_cache_t *k0 = &d->layers[0].kv;
        if (l->kv.n_kv_heads * d->head_dim != v[4]->shape[1] || l->kv.num_blocks != k0->num_blocks ||
            l->kv.block_size != k0->block_size) {
            PyErr_Format(PyExc_ValueError, "decoder_new: layer %d's cache does not match k's %zd "
                         "columns or layer 0's blocks", i, v[4]->shape[1]);
            goto fail;
        }
    }
    if (q_scale != Py_None) { /* read at every position a rope table holds */
        Py_buffer *qs = dn_take(a, q_scale, "q_scale", 'f', 1, 0);
        if (!qs || dn_check_dim(a, qs, "q_scale", 0, d->max_pos)) goto fail;
        d->q_scale = qs->buf;
    }
    if (sparse && !(d->moe_scratch = dn_moe_scratch_new(&d->moe, d->max_tokens))) {
        PyErr_NoMemory();
        goto fail;
    }
    d->n_kv_heads = d->layers[0].kv.n_kv_heads;
    if (dn_check_groups(a, d->n_heads, d->n_kv_heads, &group, q_head0)) goto fail;
    d->group = group, d->q_head0 = q_head0;
    /* a whole-projection norm's widths on every rank together (this rank's q and k when alone) */
    d->q_total = q_total ? q_total : d->n_heads * d->head_dim;
    d->k_total = k_total ? k_total : d->n_kv_heads * d->head_dim;
    PyObject *cap = PyCapsule_New(b, CAPSULE, destroy);
    if (!cap) goto fail;
    return cap;
fail:
    release(b);
    return NULL;
}

static PyObject *py_decoder_run(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"decoder", "positions", "slots", "block_tables", "q_offsets",
                             "context_lens", "comm", "timeout", NULL};
    PyObject *cap, *op, *os, *obt, *oqo, *ocl, *ocomm = Py_None;
    double timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|Od:decoder_run", kwlist, &cap, &op, &os,
                                     &obt, &oqo, &ocl, &ocomm, &timeout))
        return NULL;
    box_t *b = PyCapsule_IsValid(cap, CAPSULE) ? PyCapsule_GetPointer(cap, CAPSULE) : NULL;
    if (!b) return PyErr_Format(PyExc_TypeError, "decoder_run: decoder must come from decoder_new");
    dn_comm *comm = ocomm == Py_None ? NULL : dn_comm_of(ocomm, "decoder_run");
    if (ocomm != Py_None && !comm) return NULL;
    if (comm && !(timeout > 0.0))
        return PyErr_Format(PyExc_ValueError, "decoder_run: timeout must be > 0 seconds");
    const dn_decoder_t *d = &b->d;
    const dn_kv_cache_t *c = &d->layers[0].kv;
    dn_args a = {.fn = "decoder_run"};
    Py_buffer *p = dn_take(&a, op, "positions", 'i', 1, 0);
    if (!p) return dn_done(&a, NULL);
    int T = (int)p->shape[0];
    if (T < 1 || T > d->max_tokens)
        return dn_fail(&a, PyExc_ValueError, "%d tokens: the workspace holds 1 to %d", T, d->max_tokens);
    Py_buffer *s = dn_take(&a, os, "slots", 'i', 1, 0);
    if (!s || dn_check_dim(&a, s, "slots", 0, T)) return dn_done(&a, NULL);
    Py_buffer *bt = dn_take(&a, obt, "block_tables", 'i', 2, 0);
    if (!bt) return dn_done(&a, NULL);
    int B = (int)bt->shape[0], max_blocks = (int)bt->shape[1];
    Py_buffer *qo = dn_take(&a, oqo, "q_offsets", 'i', 1, 0);
    if (!qo || dn_check_dim(&a, qo, "q_offsets", 0, (Py_ssize_t)B + 1)) return dn_done(&a, NULL);
    Py_buffer *cl = dn_take(&a, ocl, "context_lens", 'i', 1, 0);
    if (!cl || dn_check_dim(&a, cl, "context_lens", 0, B)) return dn_done(&a, NULL);
    const int32_t *pos = p->buf;
    for (int t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= d->max_pos)
            return dn_fail(&a, PyExc_IndexError, "positions[%d] = %d is outside the rope table of %d",
                           t, pos[t], d->max_pos);
    if (dn_check_slots(&a, c, s->buf, T) ||
        dn_check_step(&a, c, T, qo->buf, cl->buf, bt->buf, B, max_blocks))
        return dn_done(&a, NULL);
    char err[256] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = dn_decoder_run(d, comm, timeout, T, pos, s->buf, bt->buf, max_blocks, qo->buf, cl->buf, B,
                        err, sizeof err);
    Py_END_ALLOW_THREADS;
    if (rc) return dn_fail(&a, PyExc_RuntimeError, "%s", err);
    return dn_done(&a, NULL);
}

PyMethodDef dn_decoder_methods[] = {
    {"decoder_new", (PyCFunction)(void (*)(void))py_decoder_new, METH_VARARGS | METH_KEYWORDS,
     "decoder_new(layers, workspace, n_heads, eps, scale, group=0, q_head0=0, softcap=0.0,\n"
     "act='silu', rot_dim=0, qk_whole=0, q_total=0, k_total=0, k_shared_first=0, n_experts=0,\n"
     "top_k=0, norm_topk=0, expert0=0, expert_step=1, shared_inter=0, qk_after_rope=0, scoring='softmax',\n"
     "routed_scale=1.0, q_scale=None, layer_norm=0, parallel=0, gated=1) -> decoder\n"
     "(native/decoder.h: act, the MLP's activation; rot_dim 0: head_dim; qk_whole with q_total /\n"
     "k_total, whole-projection q/k norms and the widths they span over all ranks, 0: this rank's;\n"
     "qk_after_rope: the q/k norms follow RoPE; q_scale: float32 [max_pos], each query row times its\n"
     "position's factor after RoPE; layer_norm: the sub-layer norms are LayerNorms (biased where the\n"
     "layer has attn_norm_bias / mlp_norm_bias);\n"
     "parallel: attention and MLP read one norm and their sum joins the residual, workspace o2 beside;\n"
     "gated 0: a plain MLP, gate_up holding up's rows alone, act(x up) down)\n"
     "layers: a list, per layer a dict: float32 norms attn_norm, attn_out_norm, mlp_norm,\n"
     "mlp_out_norm, q_norm, k_norm, attn_norm_bias, mlp_norm_bias; act_params, float32 [4], the\n"
     "xielu activation's parameters; packed weights q, k, v, o, gate_up, down; float32 biases\n"
     "q_bias, k_bias, v_bias, o_bias, gate_up_bias, down_bias (norms and biases absent or None:\n"
     "none); the layer's KV cache k_cache, v_cache, k_scale, v_scale, k_zero, v_zero (as attention\n"
     "takes them); cos_sin, its rope table [max_pos, rot_dim]; window (int, 0: none). A sparse layer\n"
     "has router, experts_gate_up, experts_down (and shared_gate_up, shared_down, shared_gate) as\n"
     "moe() takes them instead of gate_up and down, routed as n_experts .. routed_scale say. A field it\n"
     "does not know is an error.\n"
     "workspace: a dict with the float32 [max_tokens, width] arrays res, h, o, q, k, v, attn,\n"
     "gate_up, act, norm_ss, and o2 where parallel (other entries are not read).\n"
     "The decoder holds every array until it dies."},
    {"decoder_run", (PyCFunction)(void (*)(void))py_decoder_run, METH_VARARGS | METH_KEYWORDS,
     "decoder_run(decoder, positions, slots, block_tables, q_offsets, context_lens, comm=None,\n"
     "timeout=60.0): every layer over the T tokens whose embeddings are in workspace res[:T]\n"
     "(int32 step arrays as kv_write and attention take them); leaves the last layer's output in\n"
     "o[:T] and the residual stream in res[:T]. comm (from comm_open) sums the row-parallel outputs\n"
     "over the ranks. Releases the GIL."},
    {NULL, NULL, 0, NULL},
};
