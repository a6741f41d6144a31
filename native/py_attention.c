/* Bindings: attention kernels (being written). */
#include "pyarg.h"

PyMethodDef dn_attention_methods[] = {
    {NULL, NULL, 0, NULL},
};
