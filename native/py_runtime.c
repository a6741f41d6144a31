/* Bindings: ISA path and thread count. */
#include "amx.h"
#include "common.h"
#include "pyarg.h"

static const char *const isa_names[] = {"portable", "avx2", "avx512"};

static PyObject *py_isa(PyObject *self, PyObject *noargs) {
    return PyUnicode_FromString(isa_names[dn_isa()]);
}

static PyObject *py_supported_isa(PyObject *self, PyObject *noargs) {
    return PyUnicode_FromString(isa_names[dn_isa_supported()]);
}

static PyObject *py_cpu_isa(PyObject *self, PyObject *noargs) {
    return PyUnicode_FromString(isa_names[dn_isa_cpu()]);
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int i = 0; i < 3; i++)
        if (strcmp(name, isa_names[i]) == 0) {
            if (dn_set_isa((dn_isa_t)i) != 0)
                return PyErr_Format(PyExc_ValueError,
                                    i <= (int)dn_isa_cpu()
                                        ? "set_isa: this build left the %s kernels out (built with "
                                          "DASHINFER_BUILD_ISA=native on a CPU without them; best: %s)"
                                        : "set_isa: this CPU does not run the %s path (best: %s)",
                                    name, isa_names[dn_isa_supported()]);
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

static const char *const amx_names[] = {"off", "tiles", "emulated"};

static PyObject *py_amx(PyObject *self, PyObject *noargs) { return PyUnicode_FromString(amx_names[dn_amx()]); }

static PyObject *py_amx_available(PyObject *self, PyObject *noargs) { return PyBool_FromLong(dn_amx_available()); }

static PyObject *py_set_amx(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int i = 0; i < 3; i++)
        if (strcmp(name, amx_names[i]) == 0) {
            if (dn_set_amx((dn_amx_mode)i) != 0)
                return PyErr_Format(PyExc_ValueError,
                                    "set_amx: no AMX tiles here (the CPU lacks AMX-TILE/BF16/INT8 or AVX-512 "
                                    "BF16, or the kernel refused the tile state)");
            Py_RETURN_NONE;
        }
    return PyErr_Format(PyExc_ValueError, "set_amx: unknown mode '%s' (off, tiles or emulated)", name);
}

PyMethodDef dn_runtime_methods[] = {
    {"amx", py_amx, METH_NOARGS, "amx() -> how bf16 GEMMs run: off, tiles (AMX) or emulated (AMX's driver in plain C)"},
    {"amx_available", py_amx_available, METH_NOARGS,
     "amx_available() -> whether the CPU has AMX and this process was granted the tile state"},
    {"set_amx", py_set_amx, METH_O, "set_amx(mode): off, tiles (only where amx_available()) or emulated"},
    {"isa", py_isa, METH_NOARGS, "isa() -> the kernel path in use: portable, avx2 or avx512"},
    {"supported_isa", py_supported_isa, METH_NOARGS,
     "supported_isa() -> the best path this CPU runs and this build has"},
    {"cpu_isa", py_cpu_isa, METH_NOARGS, "cpu_isa() -> the best path this CPU runs, built or not"},
    {"set_isa", py_set_isa, METH_O, "set_isa(name): force a path no better than supported_isa()"},
    {"num_threads", py_num_threads, METH_NOARGS, "num_threads() -> OpenMP threads per kernel"},
    {"set_num_threads", py_set_num_threads, METH_O, "set_num_threads(n)"},
    {NULL, NULL, 0, NULL},
};
