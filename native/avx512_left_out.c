/* What the AVX-512 files define, for a build that leaves them out (setup.py, DASHINFER_BUILD_ISA=
 * native on a CPU without the avx512 path): dn_isa_supported() then never returns DN_ISA_AVX512,
 * so nothing here is reached; the linker only needs the names. */
#include <stdlib.h>

#include "attention_tile.h"
#include "linear.h"
#include "linear_kernels.h"

const dn_linear_kernels dn_linear_avx512, dn_linear_mxfp4_avx512, dn_linear_q8_vnni;

int dn_linear_vnni(void) { return 0; }

int attn_decode_avx512_fits(const dn_kv_cache_t *c, int M) { return 0; }

void attn_decode_avx512(const attn_tile_t *t) { abort(); }

void attn_tile_avx512(const attn_tile_t *t) { abort(); }
