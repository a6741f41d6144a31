/* Bindings: shared-memory collectives between ranks on one host (comm.c). A group is a capsule
 * around its dn_comm; dashinfer_server.parallel.MPIGroup sets it up through MPI. */
#include "py_shared.h"

#define CAPSULE "dashinfer.comm"

/* The capsule holds a box so comm_close can empty it before the capsule dies. */
typedef struct {
    dn_comm *c;
} box_t;

static void destroy(PyObject *cap) {
    box_t *b = PyCapsule_GetPointer(cap, CAPSULE);
    if (!b) return;
    dn_comm_close(b->c);
    PyMem_Free(b);
}

dn_comm *dn_comm_of(PyObject *cap, const char *fn) {
    box_t *b = PyCapsule_IsValid(cap, CAPSULE) ? PyCapsule_GetPointer(cap, CAPSULE) : NULL;
    if (!b) {
        PyErr_Format(PyExc_TypeError, "%s: comm must come from comm_open", fn);
        return NULL;
    }
    if (!b->c) PyErr_Format(PyExc_ValueError, "%s: comm is closed", fn);
    return b->c;
}

static PyObject *py_comm_open(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"name", "rank", "world", "capacity", NULL};
    const char *name;
    int rank, world;
    Py_ssize_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "siin:comm_open", names, &name, &rank, &world,
                                     &capacity))
        return NULL;
    if (name[0] != '/' || strchr(name + 1, '/'))
        return PyErr_Format(PyExc_ValueError, "comm_open: name '%s' must be '/' + a file name", name);
    if (capacity <= 0)
        return PyErr_Format(PyExc_ValueError, "comm_open: capacity must be > 0, got %zd", capacity);
    char err[256] = "";
    dn_comm *c;
    Py_BEGIN_ALLOW_THREADS
    c = dn_comm_open(name, rank, world, (size_t)capacity, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (!c) return PyErr_Format(PyExc_OSError, "comm_open: %s", err);
    box_t *b = PyMem_Malloc(sizeof *b);
    if (!b) {
        dn_comm_close(c);
        return PyErr_NoMemory();
    }
    b->c = c;
    PyObject *cap = PyCapsule_New(b, CAPSULE, destroy);
    if (!cap) {
        dn_comm_close(c);
        PyMem_Free(b);
    }
    return cap;
}

static PyObject *py_comm_unlink(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    if (dn_comm_unlink(name) != 0)
        return PyErr_Format(PyExc_OSError, "comm_unlink(%s): %s", name, strerror(errno));
    Py_RETURN_NONE;
}

static PyObject *py_comm_close(PyObject *self, PyObject *cap) {
    box_t *b = PyCapsule_IsValid(cap, CAPSULE) ? PyCapsule_GetPointer(cap, CAPSULE) : NULL;
    if (!b) return PyErr_Format(PyExc_TypeError, "comm_close: comm must come from comm_open");
    dn_comm_close(b->c);
    b->c = NULL;
    Py_RETURN_NONE;
}

static PyObject *py_comm_allreduce(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"comm", "x", "timeout", NULL};
    PyObject *cap, *ox;
    double timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|d:comm_allreduce", names, &cap, &ox, &timeout))
        return NULL;
    dn_comm *c = dn_comm_of(cap, "comm_allreduce");
    if (!c) return NULL;
    if (!(timeout > 0.0))
        return PyErr_Format(PyExc_ValueError, "comm_allreduce: timeout must be > 0 seconds");
    dn_args a = {.fn = "comm_allreduce"};
    Py_buffer *x = dn_take(&a, ox, "x", 'f', -1, 1);
    if (!x) return dn_done(&a, NULL);
    char err[256] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dn_comm_allreduce(c, x->buf, (size_t)dn_numel(x), timeout, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc) return dn_fail(&a, PyExc_RuntimeError, "%s", err);
    return dn_done(&a, NULL);
}

static PyObject *py_comm_gather_columns(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"comm", "local", "out", "starts", "timeout", NULL};
    PyObject *cap, *ol, *oo, *os;
    double timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|d:comm_gather_columns", names, &cap, &ol, &oo,
                                     &os, &timeout))
        return NULL;
    dn_comm *c = dn_comm_of(cap, "comm_gather_columns");
    if (!c) return NULL;
    const int rank = dn_comm_rank(c);
    if (!(timeout > 0.0))
        return PyErr_Format(PyExc_ValueError, "comm_gather_columns: timeout must be > 0 seconds");
    dn_args a = {.fn = "comm_gather_columns"};
    Py_buffer *l = dn_take(&a, ol, "local", 'f', 2, 0);
    Py_buffer *st = l ? dn_take(&a, os, "starts", 'i', 1, 0) : NULL;
    Py_buffer *o = st ? dn_take_opt(&a, oo, "out", 'f', 2, 1) : NULL;
    if (!st || PyErr_Occurred()) return dn_done(&a, NULL);
    const int32_t *s = st->buf;
    const Py_ssize_t world = dn_comm_world(c);
    if (dn_check_dim(&a, st, "starts", 0, world + 1)) return dn_done(&a, NULL);
    for (Py_ssize_t r = 0; r < world; r++)
        if (s[r] < 0 || s[r + 1] < s[r])
            return dn_fail(&a, PyExc_ValueError, "starts must ascend from 0");
    if (s[0] != 0) return dn_fail(&a, PyExc_ValueError, "starts must ascend from 0");
    if (dn_check_dim(&a, l, "local", 1, s[rank + 1] - s[rank])) return dn_done(&a, NULL);
    if (rank == 0 && !o) return dn_fail(&a, PyExc_TypeError, "rank 0 needs out");
    if (o && (dn_check_dim(&a, o, "out", 0, l->shape[0]) || dn_check_dim(&a, o, "out", 1, s[world])))
        return dn_done(&a, NULL);
    char err[256] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dn_comm_gather_columns(c, l->buf, rank == 0 ? o->buf : NULL, (size_t)l->shape[0], s,
                                timeout, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc) return dn_fail(&a, PyExc_RuntimeError, "%s", err);
    return dn_done(&a, NULL);
}

static PyObject *py_comm_set_split_threshold(PyObject *self, PyObject *args) {
    PyObject *cap;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "On:comm_set_split_threshold", &cap, &n)) return NULL;
    dn_comm *c = dn_comm_of(cap, "comm_set_split_threshold");
    if (!c) return NULL;
    if (n < 0)
        return PyErr_Format(PyExc_ValueError, "comm_set_split_threshold: n must be >= 0, got %zd", n);
    dn_comm_set_split_threshold(c, (size_t)n);
    Py_RETURN_NONE;
}

static PyObject *py_comm_waits(PyObject *self, PyObject *cap) {
    dn_comm *c = dn_comm_of(cap, "comm_waits");
    if (!c) return NULL;
    uint64_t waits;
    double seconds;
    dn_comm_waits(c, &waits, &seconds);
    return Py_BuildValue("(Kd)", (unsigned long long)waits, seconds);
}

PyMethodDef dn_comm_methods[] = {
    {"comm_open", (PyCFunction)(void (*)(void))py_comm_open, METH_VARARGS | METH_KEYWORDS,
     "comm_open(name, rank, world, capacity) -> comm: map the shared segment `name` (rank 0 "
     "creates it) with slots of `capacity` floats"},
    {"comm_unlink", py_comm_unlink, METH_O, "comm_unlink(name): remove the segment's name"},
    {"comm_close", py_comm_close, METH_O, "comm_close(comm): unmap the segment"},
    {"comm_allreduce", (PyCFunction)(void (*)(void))py_comm_allreduce,
     METH_VARARGS | METH_KEYWORDS,
     "comm_allreduce(comm, x, timeout=60.0): sum float32 x over the ranks, in place; "
     "RuntimeError when a peer died or did not arrive within timeout seconds"},
    {"comm_gather_columns", (PyCFunction)(void (*)(void))py_comm_gather_columns,
     METH_VARARGS | METH_KEYWORDS,
     "comm_gather_columns(comm, local, out, starts, timeout=60.0): rank 0 gets out [S, V] whose "
     "columns starts[r]:starts[r+1] (int32 [world+1]) are rank r's local [S, V_r]; other ranks "
     "pass out=None"},
    {"comm_waits", py_comm_waits, METH_O,
     "comm_waits(comm) -> (waits, seconds): how often this rank waited for its peers in a "
     "collective so far, and for how long in all"},
    {"comm_set_split_threshold", py_comm_set_split_threshold, METH_VARARGS,
     "comm_set_split_threshold(comm, n): from n floats on, reduce-scatter + allgather"},
    {NULL, NULL, 0, NULL},
};
