/* Bindings: elementwise kernels (being written). */
#include "pyarg.h"

PyMethodDef dn_elementwise_methods[] = {
    {NULL, NULL, 0, NULL},
};
