/* attention_vec8.h's tile for baseline x86-64: attn_tile_portable, the path every CPU runs. */
#define TILE_FN attn_tile_portable
#define DEQUANT_FN dequant_rows_portable
#include "attention_vec8.h"
