#include "pyarg.h"

#include <stdarg.h>
#include <string.h>

static const char *type_name(char fmt) {
    switch (fmt) {
    case 'f': return "float32";
    case 'H': return "uint16 (bf16 bits)";
    case 'B': return "uint8";
    case 'b': return "int8";
    case 'i': return "int32";
    case 'd': return "float64";
    default: return "?";
    }
}

/* numpy writes native formats bare ('f'), sometimes with a byte-order prefix ('<f', '=f'). */
static char item_code(const char *format) {
    if (!format) return 'B';
    if (format[0] == '@' || format[0] == '=' || format[0] == '<') format++;
    if (format[0] && !format[1]) {
        /* int32 is 'i' on LP64 Linux; 'l' is int64 there */
        return format[0];
    }
    return '?';
}

Py_buffer *dn_take(dn_args *a, PyObject *obj, const char *name, char fmt, int ndim, int writable) {
    if (a->n >= DN_MAX_ARGS) {
        PyErr_Format(PyExc_RuntimeError, "%s: too many array arguments", a->fn);
        return NULL;
    }
    if (obj == NULL || obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: %s is required (an array), got None", a->fn, name);
        return NULL;
    }
    Py_buffer *v = &a->views[a->n];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) != 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *msg = value ? PyObject_Str(value) : NULL;
        PyErr_Format(PyExc_ValueError, "%s: %s must be a C-contiguous%s array (%s)", a->fn, name,
                     writable ? " writable" : "", msg ? PyUnicode_AsUTF8(msg) : "no buffer");
        Py_XDECREF(msg);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    a->n++;
    char code = item_code(v->format);
    if (code != fmt) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be %s, got buffer format '%s'", a->fn, name,
                     type_name(fmt), v->format ? v->format : "B");
        return NULL;
    }
    if (ndim >= 0 && v->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have %d dimensions, got %d", a->fn, name, ndim,
                     v->ndim);
        return NULL;
    }
    return v;
}

Py_buffer *dn_take_weight(dn_args *a, PyObject *obj, int *bf16) {
    Py_buffer probe; /* the item size picks the format: 2 bytes are bf16 bits, else float32 */
    if (PyObject_GetBuffer(obj, &probe, PyBUF_RECORDS_RO) != 0) return NULL;
    *bf16 = probe.itemsize == 2;
    PyBuffer_Release(&probe);
    return dn_take(a, obj, "w", *bf16 ? 'H' : 'f', 2, 0);
}

Py_buffer *dn_take_opt(dn_args *a, PyObject *obj, const char *name, char fmt, int ndim,
                       int writable) {
    if (obj == NULL || obj == Py_None) return NULL;
    return dn_take(a, obj, name, fmt, ndim, writable);
}

static void release_all(dn_args *a) {
    for (int i = 0; i < a->n; i++) PyBuffer_Release(&a->views[i]);
    a->n = 0;
}

PyObject *dn_fail(dn_args *a, PyObject *exc, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    PyOS_vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    release_all(a);
    PyErr_Format(exc, "%s: %s", a->fn, msg);
    return NULL;
}

PyObject *dn_done(dn_args *a, PyObject *ret) {
    release_all(a);
    if (ret == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return ret;
}

int dn_check_dim(dn_args *a, Py_buffer *v, const char *name, int dim, Py_ssize_t want) {
    if (v->shape[dim] == want) return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s has size %zd in dimension %d, expected %zd", a->fn, name,
                 v->shape[dim], dim, want);
    return -1;
}

/* The first n of dn_act's names: the GLU's three, or a plain MLP's relu2 and xielu too */
static int parse_act(dn_args *a, const char *name, dn_act *act, int n) {
    static const char *const names[] = {"silu", "gelu_tanh", "clamped_swiglu", "relu2", "xielu"}; /* dn_act's order */
    for (int i = 0; i < n; i++)
        if (!name ? i == 0 : strcmp(name, names[i]) == 0) {
            *act = (dn_act)i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, n == 3 ? "%s: act must be 'silu', 'gelu_tanh' or 'clamped_swiglu', got '%s'"
                                          : "%s: act must be 'silu', 'gelu_tanh', 'clamped_swiglu', 'relu2' or 'xielu', got '%s'",
                 a->fn, name);
    return -1;
}

int dn_parse_act(dn_args *a, const char *name, dn_act *act) { return parse_act(a, name, act, 3); }

int dn_parse_mlp_act(dn_args *a, const char *name, dn_act *act) { return parse_act(a, name, act, 5); }
