/* The one Python extension, dashinfer_server._native: each kernel family contributes its
 * method table from its py_*.c binding file. */
#include "pyarg.h"

extern PyMethodDef dn_runtime_methods[];
extern PyMethodDef dn_linear_methods[];
extern PyMethodDef dn_kv_cache_methods[];
extern PyMethodDef dn_attention_methods[];
extern PyMethodDef dn_elementwise_methods[];
extern PyMethodDef dn_probe_methods[];
extern PyMethodDef dn_comm_methods[];
extern PyMethodDef dn_decoder_methods[];
extern PyMethodDef dn_moe_methods[];
extern PyMethodDef dn_sample_methods[];

static PyMethodDef *const families[] = {
    dn_runtime_methods, dn_linear_methods, dn_kv_cache_methods, dn_attention_methods,
    dn_elementwise_methods, dn_probe_methods, dn_comm_methods, dn_decoder_methods, dn_moe_methods,
    dn_sample_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "dashinfer-py C kernels (see native/)", -1, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        if (PyModule_AddFunctions(m, families[f]) != 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
