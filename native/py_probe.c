/* Bindings: machine-limit probes (bench/kernels.py). They need AVX-512 + BF16. */
#include "pyarg.h"
#include "probe.h"

static int need_avx512(const char *fn) {
    if (dn_isa_supported() == DN_ISA_AVX512) return 0;
    PyErr_Format(PyExc_RuntimeError, "%s: needs AVX-512 with BF16", fn);
    return -1;
}

static PyObject *py_probe_read(PyObject *self, PyObject *args) {
    long long mbytes;
    int threads, passes;
    if (!PyArg_ParseTuple(args, "Lii", &mbytes, &threads, &passes) || need_avx512("probe_read")) return NULL;
    if (mbytes < 1 || threads < 1 || passes < 1) {
        PyErr_SetString(PyExc_ValueError, "probe_read: mbytes, threads and passes must be at least 1");
        return NULL;
    }
    double dt;
    Py_BEGIN_ALLOW_THREADS
    dt = dn_probe_read((size_t)mbytes << 20, threads, passes);
    Py_END_ALLOW_THREADS
    if (dt == -1) return PyErr_NoMemory();
    return PyFloat_FromDouble(dt < 0 ? -dt : dt);
}

static PyObject *py_probe_peak(PyObject *self, PyObject *args) {
    int bf16, threads;
    long iters;
    if (!PyArg_ParseTuple(args, "pli", &bf16, &iters, &threads) || need_avx512("probe_peak"))
        return NULL;
    double flops;
    Py_BEGIN_ALLOW_THREADS
    flops = dn_probe_peak(bf16, iters, threads);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(flops);
}

PyMethodDef dn_probe_methods[] = {
    {"probe_read", py_probe_read, METH_VARARGS,
     "probe_read(mbytes, threads, passes) -> best seconds of `threads` threads streaming mbytes MiB"},
    {"probe_peak", py_probe_peak, METH_VARARGS,
     "probe_peak(bf16: bool, iters, threads) -> flop/s of an FMA (or vdpbf16ps) loop"},
    {NULL, NULL, 0, NULL},
};
