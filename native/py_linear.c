/* Bindings: pack_linear, unpack_linear, linear (see linear.h for the packed layout). */
#include "linear.h"
#include "pyarg.h"

static const char *const wtype_names[] = {"f32", "bf16", "i8", "u4", "i8q", "u4q", "mxfp4"};
#define N_WTYPES 7

/* numpy.empty(shape, dtype): arrays users get back are plain numpy arrays. */
static PyObject *np_empty(PyObject *shape, const char *dtype) {
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np) return NULL;
    PyObject *arr = PyObject_CallMethod(np, "empty", "(Os)", shape, dtype);
    Py_DECREF(np);
    return arr;
}

/* A 1-D uint8 array of `bytes` whose data is 64-byte aligned (a view into a slightly larger
 * array), so panels start on cache lines. */
static PyObject *aligned_bytes(Py_ssize_t bytes) {
    PyObject *shape = Py_BuildValue("(n)", bytes + 63);
    if (!shape) return NULL;
    PyObject *base = np_empty(shape, "uint8");
    Py_DECREF(shape);
    if (!base) return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(base, &v, PyBUF_SIMPLE) != 0) {
        Py_DECREF(base);
        return NULL;
    }
    Py_ssize_t off = (Py_ssize_t)(-(uintptr_t)v.buf & 63);
    PyBuffer_Release(&v);
    PyObject *lo = PyLong_FromSsize_t(off), *hi = PyLong_FromSsize_t(off + bytes);
    PyObject *slice = lo && hi ? PySlice_New(lo, hi, NULL) : NULL;
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    PyObject *view = slice ? PyObject_GetItem(base, slice) : NULL;
    Py_XDECREF(slice);
    Py_DECREF(base);
    return view;
}

static int parse_wtype(const char *fn, const char *name, dn_wtype *t) {
    for (int i = 0; i < N_WTYPES; i++)
        if (strcmp(name, wtype_names[i]) == 0) {
            *t = (dn_wtype)i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "%s: unknown wtype '%s' (f32, bf16, i8, u4, i8q, u4q or mxfp4)", fn, name);
    return -1;
}

static PyObject *py_pack_linear(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"w", "wtype", "group_size", "scales", "zeros", "row_scales", NULL};
    PyObject *w_obj, *s_obj = Py_None, *z_obj = Py_None, *r_obj = Py_None;
    const char *tname;
    Py_ssize_t group = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|nOOO:pack_linear", kwlist, &w_obj, &tname,
                                     &group, &s_obj, &z_obj, &r_obj))
        return NULL;
    dn_args a = {.fn = "pack_linear"};
    dn_wtype t;
    if (parse_wtype(a.fn, tname, &t) != 0) return NULL;
    static const char fmts[] = {'f', 'H', 'B', 'B', 'B', 'B', 'B'};
    Py_buffer *w = dn_take(&a, w_obj, "w", fmts[t], 2, 0);
    if (!w) return dn_done(&a, NULL);
    int mxfp4 = t == DN_W_MXFP4, u4 = dn_linear_nibbles(t);
    int64_t n = w->shape[0], k = w->shape[1] * (u4 || mxfp4 ? 2 : 1);
    int quant = dn_linear_quantized(t);
    if (mxfp4 && group == 0) group = DN_MXFP4_GROUP;
    if (quant && group == 0)
        return dn_fail(&a, PyExc_ValueError, "%s needs group_size (32, 64, 128, 256 or K)", tname);
    const char *why = dn_linear_check_shape(t, n, k, group);
    if (why)
        return dn_fail(&a, PyExc_ValueError, "%s weight [N=%lld, K=%lld], group_size %zd: %s",
                       tname, (long long)n, (long long)k, group, why);
    Py_buffer *s = NULL, *z = NULL, *r = NULL;
    if (mxfp4) {
        if (!(s = dn_take(&a, s_obj, "scales", 'B', 2, 0)) || dn_check_dim(&a, s, "scales", 0, n) ||
            dn_check_dim(&a, s, "scales", 1, k / group))
            return dn_done(&a, NULL);
        if (z_obj != Py_None) return dn_fail(&a, PyExc_ValueError, "mxfp4 has no zeros (its scales are powers of two)");
    } else if (quant) {
        char code = u4 ? 'B' : 'f'; /* u4/u4q: uint8 scale and zero codes (linear.h) */
        if (!(s = dn_take(&a, s_obj, "scales", code, 2, 0)) || dn_check_dim(&a, s, "scales", 0, n) ||
            dn_check_dim(&a, s, "scales", 1, k / group) ||
            !(z = dn_take(&a, z_obj, "zeros", code, 2, 0)) || dn_check_dim(&a, z, "zeros", 0, n) ||
            dn_check_dim(&a, z, "zeros", 1, k / group))
            return dn_done(&a, NULL);
        if (u4 && (!(r = dn_take(&a, r_obj, "row_scales", 'f', 1, 0)) || dn_check_dim(&a, r, "row_scales", 0, n)))
            return dn_done(&a, NULL);
    } else if (s_obj != Py_None || z_obj != Py_None) {
        return dn_fail(&a, PyExc_ValueError, "scales and zeros apply to i8/u4 only (and i8q/u4q), not %s", tname);
    }
    if (!u4 && r_obj != Py_None)
        return dn_fail(&a, PyExc_ValueError, "row_scales apply to u4/u4q only, not %s", tname);
    int64_t bytes = dn_linear_packed_bytes(t, n, k, group);
    PyObject *out = aligned_bytes((Py_ssize_t)bytes);
    if (!out) return dn_done(&a, NULL);
    Py_buffer *o = dn_take(&a, out, "packed", 'B', 1, 1);
    if (!o) {
        Py_DECREF(out);
        return dn_done(&a, NULL);
    }
    Py_BEGIN_ALLOW_THREADS;
    dn_linear_pack(o->buf, t, n, k, group, w->buf, s ? s->buf : NULL, z ? z->buf : NULL, r ? r->buf : NULL);
    Py_END_ALLOW_THREADS;
    return dn_done(&a, out);
}

static Py_buffer *take_packed(dn_args *a, PyObject *obj, dn_linear_w *w) {
    Py_buffer *v = dn_take(a, obj, "packed", 'B', 1, 0);
    if (!v) return NULL;
    const char *why = dn_linear_open(w, v->buf, (size_t)v->len);
    if (why) {
        PyErr_Format(PyExc_ValueError, "%s: packed: %s", a->fn, why);
        return NULL;
    }
    return v;
}

static PyObject *py_unpack_linear(PyObject *self, PyObject *arg) {
    dn_args a = {.fn = "unpack_linear"};
    dn_linear_w w;
    if (!take_packed(&a, arg, &w)) return dn_done(&a, NULL);
    return dn_done(&a, Py_BuildValue("(sLLL)", wtype_names[w.wtype], (long long)w.n,
                                     (long long)w.k, (long long)w.group));
}

static PyObject *new_array(const char *dtype, int64_t n, int64_t k);

static PyObject *py_dequantize_linear(PyObject *self, PyObject *arg) {
    dn_args a = {.fn = "dequantize_linear"};
    dn_linear_w w;
    if (!take_packed(&a, arg, &w)) return dn_done(&a, NULL);
    if (dn_linear_act_quantized(w.wtype))
        return dn_fail(&a, PyExc_ValueError, "packed: %s weights are laid out for the int8-activation kernels; dequantize the codes instead",
                       wtype_names[w.wtype]);
    PyObject *out = new_array("float32", w.n, w.k);
    Py_buffer *o = out ? dn_take(&a, out, "out", 'f', 2, 1) : NULL;
    if (!o) {
        Py_XDECREF(out);
        return dn_done(&a, NULL);
    }
    Py_BEGIN_ALLOW_THREADS;
    dn_linear_unpack(&w, o->buf);
    Py_END_ALLOW_THREADS;
    return dn_done(&a, out);
}

static int overlaps(const Py_buffer *a, const Py_buffer *b) {
    if (!a || !b) return 0;
    const char *a0 = a->buf, *b0 = b->buf;
    return a0 < b0 + b->len && b0 < a0 + a->len;
}

static PyObject *py_linear(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"x", "packed", "bias", "out", NULL};
    PyObject *x_obj, *p_obj, *b_obj = Py_None, *o_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OO:linear", kwlist, &x_obj, &p_obj, &b_obj,
                                     &o_obj))
        return NULL;
    dn_args a = {.fn = "linear"};
    dn_linear_w w;
    Py_buffer *p = take_packed(&a, p_obj, &w), *x, *b = NULL, *o;
    if (!p || !(x = dn_take(&a, x_obj, "x", 'f', 2, 0)) || dn_check_dim(&a, x, "x", 1, w.k))
        return dn_done(&a, NULL);
    int64_t m = x->shape[0];
    if (b_obj != Py_None &&
        (!(b = dn_take(&a, b_obj, "bias", 'f', 1, 0)) || dn_check_dim(&a, b, "bias", 0, w.n)))
        return dn_done(&a, NULL);
    PyObject *out;
    if (o_obj == Py_None) {
        PyObject *shape = Py_BuildValue("(LL)", (long long)m, (long long)w.n);
        out = shape ? np_empty(shape, "float32") : NULL;
        Py_XDECREF(shape);
        if (!out) return dn_done(&a, NULL);
    } else {
        out = o_obj;
        Py_INCREF(out);
    }
    if (!(o = dn_take(&a, out, "out", 'f', 2, 1)) || dn_check_dim(&a, o, "out", 0, m) ||
        dn_check_dim(&a, o, "out", 1, w.n)) {
        Py_DECREF(out);
        return dn_done(&a, NULL);
    }
    if (overlaps(o, x) || overlaps(o, b) || overlaps(o, p)) {
        Py_DECREF(out);
        return dn_fail(&a, PyExc_ValueError, "out must not share memory with x, packed or bias");
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = dn_linear(&w, x->buf, m, b ? b->buf : NULL, o->buf);
    Py_END_ALLOW_THREADS;
    if (rc != 0) {
        Py_DECREF(out);
        return dn_fail(&a, PyExc_MemoryError, "cannot allocate scratch for M=%lld",
                       (long long)m);
    }
    return dn_done(&a, out);
}

static PyObject *py_linear_glu(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"x", "packed", "gate_up", "out", "act", NULL};
    PyObject *x_obj, *p_obj, *g_obj, *o_obj;
    const char *act_name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|s:linear_glu", names, &x_obj, &p_obj, &g_obj, &o_obj,
                                     &act_name))
        return NULL;
    dn_args a = {.fn = "linear_glu"};
    dn_act act;
    if (dn_parse_act(&a, act_name, &act)) return NULL;
    dn_linear_w w;
    Py_buffer *p = take_packed(&a, p_obj, &w), *x, *g, *o;
    if (!p || !(x = dn_take(&a, x_obj, "x", 'f', 2, 0)) || dn_check_dim(&a, x, "x", 1, w.k))
        return dn_done(&a, NULL);
    if (w.n % 2) return dn_fail(&a, PyExc_ValueError, "packed: N=%lld is not gate and up rows", (long long)w.n);
    int64_t m = x->shape[0];
    if (!(g = dn_take(&a, g_obj, "gate_up", 'f', 2, 1)) || dn_check_dim(&a, g, "gate_up", 0, m) ||
        dn_check_dim(&a, g, "gate_up", 1, w.n) || !(o = dn_take(&a, o_obj, "out", 'f', 2, 1)) ||
        dn_check_dim(&a, o, "out", 0, m) || dn_check_dim(&a, o, "out", 1, w.n / 2))
        return dn_done(&a, NULL);
    if (overlaps(o, x) || overlaps(o, p) || overlaps(o, g) || overlaps(g, x) || overlaps(g, p))
        return dn_fail(&a, PyExc_ValueError, "out, gate_up, x and packed must not share memory");
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = dn_linear_glu(&w, x->buf, m, act, g->buf, o->buf);
    Py_END_ALLOW_THREADS;
    if (rc != 0) return dn_fail(&a, PyExc_MemoryError, "cannot allocate scratch for M=%lld", (long long)m);
    Py_INCREF(o_obj);
    return dn_done(&a, o_obj);
}

static PyObject *new_array(const char *dtype, int64_t n, int64_t k) {
    PyObject *shape = Py_BuildValue("(LL)", (long long)n, (long long)k);
    PyObject *out = shape ? np_empty(shape, dtype) : NULL;
    Py_XDECREF(shape);
    return out;
}

static PyObject *py_quantize(PyObject *self, PyObject *args) {
    PyObject *w_obj;
    Py_ssize_t group;
    int bits = 8;
    if (!PyArg_ParseTuple(args, "On|i:quantize", &w_obj, &group, &bits)) return NULL;
    dn_args a = {.fn = "quantize"};
    if (bits != 8 && bits != 4) return dn_fail(&a, PyExc_ValueError, "bits must be 8 or 4, got %d", bits);
    int bf16;
    Py_buffer *w = dn_take_weight(&a, w_obj, &bf16);
    if (!w) return dn_done(&a, NULL);
    int64_t n = w->shape[0], k = w->shape[1];
    if (group < 1 || k % group || (bits == 4 && group % 2))
        return dn_fail(&a, PyExc_ValueError, "group_size %zd does not divide K=%lld%s", group, (long long)k,
                       bits == 4 ? " in even groups" : "");
    const char *param = bits == 8 ? "float32" : "uint8"; /* uint4: scale and zero codes (linear.h) */
    PyObject *codes = new_array("uint8", n, bits == 8 ? k : k / 2), *scales = new_array(param, n, k / group);
    PyObject *zeros = new_array(param, n, k / group), *rows = bits == 4 ? new_array("float32", n, 1) : NULL;
    Py_buffer *c = codes ? dn_take(&a, codes, "codes", 'B', 2, 1) : NULL;
    Py_buffer *s = c && scales ? dn_take(&a, scales, "scales", param[0] == 'f' ? 'f' : 'B', 2, 1) : NULL;
    Py_buffer *z = s && zeros ? dn_take(&a, zeros, "zeros", param[0] == 'f' ? 'f' : 'B', 2, 1) : NULL;
    Py_buffer *r = z && rows ? dn_take(&a, rows, "row_scales", 'f', 2, 1) : NULL;
    if (!z || (bits == 4 && !r)) {
        Py_XDECREF(codes), Py_XDECREF(scales), Py_XDECREF(zeros), Py_XDECREF(rows);
        return dn_done(&a, NULL);
    }
    int64_t bad;
    Py_BEGIN_ALLOW_THREADS;
    bad = dn_quantize(w->buf, bf16, n, k, group, bits, c->buf, s->buf, z->buf, r ? r->buf : NULL);
    Py_END_ALLOW_THREADS;
    if (bad >= 0) {
        Py_DECREF(codes), Py_DECREF(scales), Py_DECREF(zeros), Py_XDECREF(rows);
        return dn_fail(&a, PyExc_ValueError, DN_NONFINITE_ROW_ERROR, (long long)bad, (long long)n, (long long)k);
    }
    if (bits == 8) return dn_done(&a, Py_BuildValue("(NNN)", codes, scales, zeros));
    /* row_scales [N]: a view of the [N, 1] array */
    PyObject *flat = PyObject_CallMethod(rows, "reshape", "(n)", (Py_ssize_t)n);
    Py_DECREF(rows);
    if (!flat) {
        Py_DECREF(codes), Py_DECREF(scales), Py_DECREF(zeros);
        return dn_done(&a, NULL);
    }
    return dn_done(&a, Py_BuildValue("(NNNN)", codes, scales, zeros, flat));
}

static PyObject *py_linear_q8_path(PyObject *self, PyObject *unused) { return PyUnicode_FromString(dn_linear_q8_path()); }

PyMethodDef dn_linear_methods[] = {
    {"pack_linear", (PyCFunction)(void (*)(void))py_pack_linear, METH_VARARGS | METH_KEYWORDS,
     "pack_linear(w, wtype, group_size=0, scales=None, zeros=None, row_scales=None) -> packed uint8\n"
     "array. wtype 'f32' (w float32 [N,K]), 'bf16' (w uint16 bits [N,K]), 'i8' (w uint8 codes [N,K]),\n"
     "'u4' (w uint8 [N,K/2], low nibble = even k). i8: scales, zeros float32 [N, K/group_size],\n"
     "weight = (code - zero) * scale. u4: scales, zeros uint8 codes [N, K/group_size], row_scales\n"
     "float32 [N], weight = (code - zeros/16) * (row_scale * scales) (the product in float32).\n"
     "group_size 32, 64, 128, 256 or K. 'i8q'/'u4q': the same\n"
     "codes, computed with x quantized to int8 per 32 k (see linear_q8_path). 'mxfp4': w uint8\n"
     "[N,K/2] e2m1 codes (a checkpoint's *_blocks [N,K/32,16] reshaped), scales uint8 e8m0\n"
     "[N,K/32] (*_scales), weight = e2m1(code) * 2^(scale - 127); group_size 32 (or 0)."},
    {"dequantize_linear", py_dequantize_linear, METH_O,
     "dequantize_linear(packed) -> float32 [N,K]: the weight a packed f32/bf16/i8/u4/mxfp4 buffer\n"
     "holds, exactly (the portable kernel's reading of the layout)"},
    {"linear_glu", (PyCFunction)(void (*)(void))py_linear_glu, METH_VARARGS | METH_KEYWORDS,
     "linear_glu(x, packed, gate_up, out, act='silu') -> out: out[M,I] = act(x . Wg^T) * (x . Wu^T)\n"
     "of a packed [2I,K] gate_up weight (gate rows, then up rows), act 'silu' or 'gelu_tanh' (GELU\n"
     "with the tanh approximation); gate_up [M,2I] is scratch (the AVX-512 GEMM applies act(g) * u\n"
     "as it stores, where I is a multiple of 64)."},
    {"unpack_linear", py_unpack_linear, METH_O,
     "unpack_linear(packed) -> (wtype, N, K, group_size) of a packed weight"},
    {"linear", (PyCFunction)(void (*)(void))py_linear, METH_VARARGS | METH_KEYWORDS,
     "linear(x, packed, bias=None, out=None) -> out: out[M,N] = x[M,K] . W^T (+ bias), float32.\n"
     "Releases the GIL. On the avx512 path with M > 4, activations are rounded to bf16 for\n"
     "vdpbf16ps (and i8/u4 weights dequantized to bf16); M <= 4 and the other paths stay fp32."},
    {"quantize", py_quantize, METH_VARARGS,
     "quantize(w, group_size, bits=8) -> (codes uint8, scales, zeros float32 [N, K/group_size]):\n"
     "InstantQuant int8 (codes [N,K]) or uint4 (bits=4: codes [N,K/2], even k in the low nibble,\n"
     "and (scales, zeros uint8 [N, K/group_size], row_scales float32 [N]) as pack_linear takes them) of w\n"
     "(float32, or uint16 bf16 bits) [N,K], the rule of quant.quantize"},
    {"linear_q8_path", py_linear_q8_path, METH_NOARGS,
     "linear_q8_path() -> the kernel i8q/u4q weights run on here: 'vnni' (AVX512-VNNI integer dot\n"
     "products), 'avx2' (vpmaddubsw; fast for u4q, while exact i8 is as fast as i8q) or 'portable'"},
    {NULL, NULL, 0, NULL},
};
