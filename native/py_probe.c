/* Bindings: machine-limit probes (bench/kernels.py). They need AVX-512 + BF16. */
#include "pyarg.h"
#include "probe.h"

static int need_avx512(const char *fn) {
    if (dn_isa_supported() == DN_ISA_AVX512) return 0;
    PyErr_Format(PyExc_RuntimeError, "%s: needs AVX-512 with BF16", fn);
    return -1;
}

static PyObject *py_probe_read(PyObject *self, PyObject *args) {
    PyObject *o;
    int threads, reps;
    if (!PyArg_ParseTuple(args, "Oii", &o, &threads, &reps) || need_avx512("probe_read")) return NULL;
    dn_args a = {.fn = "probe_read"};
    Py_buffer *buf = dn_take(&a, o, "buf", 'f', -1, 0);
    if (!buf) return dn_done(&a, NULL);
    double dt;
    Py_BEGIN_ALLOW_THREADS
    dt = dn_probe_read(buf->buf, (size_t)dn_numel(buf), threads, reps);
    Py_END_ALLOW_THREADS
    return dn_done(&a, PyFloat_FromDouble(dt < 0 ? -dt : dt));
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
     "probe_read(buf: float32 array, threads, reps) -> seconds to stream buf reps times"},
    {"probe_peak", py_probe_peak, METH_VARARGS,
     "probe_peak(bf16: bool, iters, threads) -> flop/s of an FMA (or vdpbf16ps) loop"},
    {NULL, NULL, 0, NULL},
};
