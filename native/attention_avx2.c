/* The AVX2 attention tile: the generic C tile compiled for AVX2 + FMA (8-lane vectors). */
#include "common.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define TILE_FN attn_tile_avx2
#define DEQUANT_FN dequant_rows_avx2
#include "attention_generic.h"

#pragma GCC pop_options
