/* Bindings: linear kernels (being written). */
#include "pyarg.h"

PyMethodDef dn_linear_methods[] = {
    {NULL, NULL, 0, NULL},
};
