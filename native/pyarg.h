/* Argument checking for the bindings: numpy arrays come in through the buffer protocol,
 * are checked for item type, rank and contiguity, and are released on every exit path. */
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "glu.h"

#define DN_MAX_ARGS 24 /* a decoder layer with every optional array takes 20 */

/* The buffers one call holds; dn_done/dn_fail release them all. */
typedef struct {
    Py_buffer views[DN_MAX_ARGS];
    int n;
    const char *fn; /* the Python-visible function name, for messages */
} dn_args;

/* Item type codes (numpy buffer format characters):
 * 'f' float32, 'H' uint16 (bf16 bits), 'B' uint8, 'b' int8, 'i' int32, 'd' float64. */

/* Take `obj` as a C-contiguous array of item type `fmt` and rank `ndim` (-1: any rank).
 * Returns NULL with a Python exception set when it is not. */
Py_buffer *dn_take(dn_args *a, PyObject *obj, const char *name, char fmt, int ndim, int writable);

/* A weight w [N][K] of float32, or of bf16 bits (uint16: *bf16 set to 1), as dn_take takes it. */
Py_buffer *dn_take_weight(dn_args *a, PyObject *obj, int *bf16);

/* As dn_take, but None gives NULL without an exception (check PyErr_Occurred()). */
Py_buffer *dn_take_opt(dn_args *a, PyObject *obj, const char *name, char fmt, int ndim,
                       int writable);

/* Raise `exc` with a message prefixed by the function name, release everything, return NULL. */
PyObject *dn_fail(dn_args *a, PyObject *exc, const char *fmt, ...);

/* Release everything and return `ret` (None when ret is NULL and no error is set). */
PyObject *dn_done(dn_args *a, PyObject *ret);

/* Require view->shape[dim] == want; on mismatch raise ValueError naming the argument. */
int dn_check_dim(dn_args *a, Py_buffer *v, const char *name, int dim, Py_ssize_t want);

static inline Py_ssize_t dn_numel(const Py_buffer *v) {
    return v->itemsize ? v->len / v->itemsize : 0;
}

/* The gate activation named `name` ("silu", "gelu_tanh" or "clamped_swiglu"; NULL means "silu")
 * into *act: 0, or
 * -1 with a ValueError naming the choices. */
int dn_parse_act(dn_args *a, const char *name, dn_act *act);
/* The same, a plain MLP's relu2 and xielu taken too (decoder_new, whose gated says which MLP it runs). */
int dn_parse_mlp_act(dn_args *a, const char *name, dn_act *act);
