/* Bindings: machine-limit probes (bench/machine.py). They need AVX2 (AVX-512 where it exists). */
#include "pyarg.h"
#include "probe.h"

static int need_avx2(const char *fn) {
    if (dn_isa_supported() >= DN_ISA_AVX2) return 0;
    PyErr_Format(PyExc_RuntimeError, "%s: needs AVX2", fn);
    return -1;
}

static PyObject *py_probe_read(PyObject *self, PyObject *args) {
    long long mbytes;
    int threads, passes;
    if (!PyArg_ParseTuple(args, "Lii", &mbytes, &threads, &passes) || need_avx2("probe_read")) return NULL;
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
    if (!PyArg_ParseTuple(args, "ili", &bf16, &iters, &threads) || need_avx2("probe_peak"))
        return NULL;
    if (bf16 < 0 || bf16 > 2 || iters < 1 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "probe_peak: kind 0, 1 or 2; iters and threads at least 1");
        return NULL;
    }
    double flops;
    Py_BEGIN_ALLOW_THREADS
    flops = dn_probe_peak(bf16, iters, threads);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(flops);
}

static PyObject *py_probe_amx_peak(PyObject *self, PyObject *args) {
    int threads;
    long iters;
    if (!PyArg_ParseTuple(args, "li", &iters, &threads)) return NULL;
    if (iters < 1 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "probe_amx_peak: iters and threads must be at least 1");
        return NULL;
    }
    double flops;
    Py_BEGIN_ALLOW_THREADS
    flops = dn_probe_amx_peak(iters, threads);
    Py_END_ALLOW_THREADS
    if (flops < 0) {
        PyErr_SetString(PyExc_RuntimeError, "probe_amx_peak: no AMX tiles here (amx_available() is False)");
        return NULL;
    }
    return PyFloat_FromDouble(flops);
}

PyMethodDef dn_probe_methods[] = {
    {"probe_amx_peak", py_probe_amx_peak, METH_VARARGS,
     "probe_amx_peak(iters, threads) -> flop/s of tdpbf16ps on AMX tiles (RuntimeError without AMX)"},
    {"probe_read", py_probe_read, METH_VARARGS,
     "probe_read(mbytes, threads, passes) -> best seconds of `threads` threads streaming mbytes MiB"},
    {"probe_peak", py_probe_peak, METH_VARARGS,
     "probe_peak(kind, iters, threads) -> flop/s of an fp32 FMA loop (0) or vdpbf16ps on 12 (1) or 24 (2) accumulators"},
    {NULL, NULL, 0, NULL},
};
