/* Bindings: ISA path and thread count. */
#include "common.h"
#include "pyarg.h"

static const char *const isa_names[] = {"portable", "avx2", "avx512"};

static PyObject *py_isa(PyObject *self, PyObject *noargs) {
    return PyUnicode_FromString(isa_names[dn_isa()]);
}

static PyObject *py_supported_isa(PyObject *self, PyObject *noargs) {
    return PyUnicode_FromString(isa_names[dn_isa_supported()]);
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int i = 0; i < 3; i++)
        if (strcmp(name, isa_names[i]) == 0) {
            if (dn_set_isa((dn_isa_t)i) != 0)
                return PyErr_Format(PyExc_ValueError,
                                    "set_isa: this CPU does not run the %s path (best: %s)", name,
                                    isa_names[dn_isa_supported()]);
            Py_RETURN_NONE;
        }
    return PyErr_Format(PyExc_ValueError,
                        "set_isa: unknown path '%s' (portable, avx2 or avx512)", name);
}

static PyObject *py_num_threads(PyObject *self, PyObject *noargs) {
    return PyLong_FromLong(dn_num_threads());
}

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > 4096)
        return PyErr_Format(PyExc_ValueError, "set_num_threads: %ld is not in 1..4096", n);
    dn_set_num_threads((int)n);
    Py_RETURN_NONE;
}

PyMethodDef dn_runtime_methods[] = {
    {"isa", py_isa, METH_NOARGS, "isa() -> the kernel path in use: portable, avx2 or avx512"},
    {"supported_isa", py_supported_isa, METH_NOARGS, "supported_isa() -> the best path this CPU runs"},
    {"set_isa", py_set_isa, METH_O, "set_isa(name): force a path no better than supported_isa()"},
    {"num_threads", py_num_threads, METH_NOARGS, "num_threads() -> OpenMP threads per kernel"},
    {"set_num_threads", py_set_num_threads, METH_O, "set_num_threads(n)"},
    {NULL, NULL, 0, NULL},
};
