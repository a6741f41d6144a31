/* AMX tiles: whether this process may use them, which mode the linear kernels run in, and the one
 * tile operation the bf16 GEMM needs (linear_amx.c), in two builds: the tile instructions, and a
 * plain-C emulation with the same inputs, outputs and rounding, so that a CPU without AMX tests
 * everything around the instructions (packing, strides, threading). */
#pragma once
#include <stdint.h>

typedef enum { DN_AMX_OFF = 0, DN_AMX_TILES = 1, DN_AMX_EMULATED = 2 } dn_amx_mode;

/* 1 when CPUID has AMX-TILE, AMX-BF16 and AMX-INT8 and Linux granted this process the tile
 * state (arch_prctl ARCH_REQ_XCOMP_PERM; asked once, the grant holds for every thread). */
int dn_amx_available(void);
dn_amx_mode dn_amx(void);             /* default: DN_AMX_TILES where available, else off */
int dn_set_amx(dn_amx_mode mode);     /* 0, or -1 when mode is DN_AMX_TILES and not available */

/* Tile geometry of the bf16 block: 16 rows, 64 bytes a row (16 fp32, or 16 bf16 pairs). */
#define DN_AMX_ROWS 16
#define DN_AMX_PAIRS 16  /* k pairs of one tile step */

/* c[mt*16][16 nt] fp32 (row stride ldc floats) = a . b over `steps` steps of 16 k pairs, then one
 * more step from b_tail when it is not NULL (+= when accumulate: c holds earlier k's sums):
 *   a      [steps (+1)][32][16] bf16 pairs as uint32: a 32-row block's tiles step by step, each
 *          16 x 16 tile 1 KB contiguous (rows 16-31 read only when mt is 2);
 *   b      [steps*16][ldb] bf16 pairs as uint32 (k pair rows of a packed bf16 panel, linear.h),
 *          of which this block reads 32 columns: step s at b + 16 s ldb;
 *   b_tail [16][32] pairs, the last (zero-padded) k pair rows of the same 32 columns.
 * mt is 1 or 2 (16 or 32 rows). row_bf16 is the same product for one row tile (the first 16 rows
 * of a's blocks) across a whole 64-column panel (ldb 64, b_tail [16][64]): every step reads the
 * step's 16 k pair rows front to back, 4 KB in order, and a loads once for four products, where
 * two 32-column blocks would each read every other 128 bytes. Few rows stream their weights from
 * DRAM; read in order they arrive faster (one core: 11.5-12.8 GB/s against 10.3-11.4), and
 * with `stream` set (b comes from memory) each step asks L2 for the step 8 ahead: 14.4-14.8 in two
 * rounds of three (the third, noisy, 10.2-13.6).
 * block_bf16's `stream` asks L2 for the whole 4 KB step 8 ahead of b's (ldb 64): the first block
 * of a chunk's first column block, whose weights come from DRAM (2 threads, 128 rows: 1234 GFLOP/s
 * against 1155, medians of 6; 512 rows 1337 against 1316).
 * Each thread calls begin() once before its first block and end() after its last. */
#define DN_AMX_A_STEP (2 * DN_AMX_ROWS * DN_AMX_PAIRS) /* uint32 of one step of a row block */
typedef struct {
    void (*begin)(void);
    void (*end)(void);
    void (*block_bf16)(const uint32_t *a, const uint32_t *b, int64_t ldb, int64_t steps,
                       const uint32_t *b_tail, int mt, int nt, float *c, int64_t ldc, int accumulate, int stream);
    void (*row_bf16)(const uint32_t *a, const uint32_t *b, int64_t steps, const uint32_t *b_tail, float *c,
                     int64_t ldc, int accumulate, int stream);
} dn_amx_ops;

extern const dn_amx_ops dn_amx_tile_ops, dn_amx_emulated_ops;
