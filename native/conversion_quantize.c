/* dashinfer_client.model._quantize: InstantQuant for the conversion (dashinfer_client/model/quant.py),
 * linear_quantize.c's rows split over POSIX threads started and joined inside each call.
 *
 * A module of its own, built without OpenMP: a conversion runs in whatever process asks for it (a
 * CLI, a user's script, a server before it spawns its ranks), and loading the kernels' extension
 * there would start libgomp, which fixes its thread count and reads its settings at load; a
 * process placed afterwards (topology.place_rank) would keep them (kernels.py's load-order rule).
 * Threads joined before the call returns leave nothing behind, whatever the process does next. */
#include <pthread.h>

#include "linear.h"
#include "pyarg.h"

typedef struct {
    const void *w;
    int bf16, bits;
    int64_t r0, r1, k, group;
    uint8_t *codes;
    void *scales, *zeros;
    float *row_scales;
    double *error;
    int64_t bad; /* the first row with an infinity or a NaN, or -1 */
} rows_job;

static void *run_rows(void *arg) {
    rows_job *j = arg;
    j->bad = dn_quantize_rows(j->w, j->bf16, j->r0, j->r1, j->k, j->group, j->bits, j->codes, j->scales, j->zeros,
                              j->row_scales, j->error);
    return NULL;
}

/* Rows split evenly over `threads` (the caller's thread runs the first share); a thread that
 * cannot start leaves its share to the caller. Returns the first row with an infinity or a NaN,
 * or -1. */
static int64_t quantize_on_threads(rows_job job, int64_t n, int threads) {
    enum { MAX_THREADS = 256 };
    pthread_t ids[MAX_THREADS];
    rows_job jobs[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > n) threads = (int)(n > 0 ? n : 1);
    for (int t = 0; t < threads; t++) {
        jobs[t] = job;
        jobs[t].r0 = n * t / threads;
        jobs[t].r1 = n * (t + 1) / threads;
        if (t > 0) started[t] = pthread_create(&ids[t], NULL, run_rows, &jobs[t]) == 0;
    }
    run_rows(&jobs[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t]) pthread_join(ids[t], NULL);
        else run_rows(&jobs[t]);
    }
    for (int t = 0; t < threads; t++) /* the shares are in row order */
        if (jobs[t].bad >= 0) return jobs[t].bad;
    return -1;
}

static PyObject *py_quantize_into(PyObject *self, PyObject *args) {
    PyObject *w_obj, *c_obj, *s_obj, *z_obj, *r_obj, *e_obj;
    Py_ssize_t group;
    int bits, threads;
    if (!PyArg_ParseTuple(args, "OniOOOOOi:quantize_into", &w_obj, &group, &bits, &c_obj, &s_obj, &z_obj, &r_obj,
                          &e_obj, &threads))
        return NULL;
    dn_args a = {.fn = "quantize_into"};
    if (bits != 8 && bits != 4) return dn_fail(&a, PyExc_ValueError, "bits must be 8 or 4, got %d", bits);
    int bf16;
    Py_buffer *w = dn_take_weight(&a, w_obj, &bf16);
    if (!w) return dn_done(&a, NULL);
    int64_t n = w->shape[0], k = w->shape[1];
    if (group < 1 || (bits == 4 && (group % 2 || k % 2)))
        return dn_fail(&a, PyExc_ValueError, "group_size %zd on K=%lld: needs a positive group%s", group,
                       (long long)k, bits == 4 ? ", and K and the group even" : "");
    char param = bits == 8 ? 'f' : 'B';
    int64_t ng = (k + group - 1) / group;
    Py_buffer *c = dn_take(&a, c_obj, "codes", 'B', 2, 1);
    Py_buffer *s = c ? dn_take(&a, s_obj, "scales", param, 2, 1) : NULL;
    Py_buffer *z = s ? dn_take(&a, z_obj, "zeros", param, 2, 1) : NULL;
    Py_buffer *r = z && bits == 4 ? dn_take(&a, r_obj, "row_scales", 'f', 1, 1) : NULL;
    Py_buffer *e = z && (bits == 8 || r) ? dn_take_opt(&a, e_obj, "error", 'd', 2, 1) : NULL;
    if (!z || (bits == 4 && !r) || PyErr_Occurred()) return dn_done(&a, NULL);
    if (dn_check_dim(&a, c, "codes", 0, n) || dn_check_dim(&a, c, "codes", 1, bits == 8 ? k : k / 2) ||
        dn_check_dim(&a, s, "scales", 0, n) || dn_check_dim(&a, s, "scales", 1, ng) ||
        dn_check_dim(&a, z, "zeros", 0, n) || dn_check_dim(&a, z, "zeros", 1, ng) ||
        (r && dn_check_dim(&a, r, "row_scales", 0, n)) ||
        (e && (dn_check_dim(&a, e, "error", 0, n) || dn_check_dim(&a, e, "error", 1, 3))))
        return dn_done(&a, NULL); /* releases the buffers, the ValueError stays */
    rows_job job = {w->buf, bf16, bits, 0, n, k, group, c->buf, s->buf, z->buf, r ? r->buf : NULL,
                    e ? e->buf : NULL, -1};
    int64_t bad;
    Py_BEGIN_ALLOW_THREADS;
    bad = quantize_on_threads(job, n, threads < 1 ? 1 : threads);
    Py_END_ALLOW_THREADS;
    if (bad >= 0)
        return dn_fail(&a, PyExc_ValueError, DN_NONFINITE_ROW_ERROR, (long long)bad, (long long)n, (long long)k);
    return dn_done(&a, NULL);
}

static PyMethodDef methods[] = {
    {"quantize_into", py_quantize_into, METH_VARARGS,
     "quantize_into(w, group_size, bits, codes, scales, zeros, row_scales, error, threads) -> None:\n"
     "InstantQuant of w (float32, or uint16 bf16 bits) [N,K] into the given arrays\n"
     "(dashinfer_client/model/quant.py's parts; row_scales is ignored for 8 bits), rows split over\n"
     "`threads` threads; ValueError for a weight holding an infinity or a NaN. error: None, or\n"
     "float64 [N,3] given per row the sum of squared errors of the\n"
     "dequantized weight, the sum of squared weights and the largest |error| (linear.h)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_quantize", "InstantQuant for the conversion, without OpenMP (native/conversion_quantize.c)",
    -1, methods,
};

PyMODINIT_FUNC PyInit__quantize(void) { return PyModule_Create(&module); }
