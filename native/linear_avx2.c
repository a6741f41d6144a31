#include "linear_kernels.h"
const dn_linear_kernels dn_linear_avx2 = {0};
