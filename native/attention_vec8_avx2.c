/* attention_vec8.h's tile compiled for AVX2 + FMA: attn_tile_avx2 (8 lanes in one register). */
#include "common.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define TILE_FN attn_tile_avx2
#define DEQUANT_FN dequant_rows_avx2
#include "attention_vec8.h"

#pragma GCC pop_options
