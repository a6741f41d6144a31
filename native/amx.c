/* AMX: detection, the tile-state permission, the mode, and the bf16 tile block in its two builds
 * (amx.h). The emulation follows the instruction's definition: each bf16 product exact in fp32,
 * the pair's two products added to the accumulator in turn, denormal inputs and outputs as zero
 * (DAZ/FTZ), round to nearest even. */
#include <cpuid.h>
#include <math.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "amx.h"
#include "common.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int available = -1;
static dn_amx_mode mode = (dn_amx_mode)-1;

int dn_amx_available(void) {
    if (available >= 0) return available;
    unsigned a, b, c, d;
    available = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1) && (d >> 25 & 1) &&
        dn_isa_supported() == DN_ISA_AVX512)
        available = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return available;
}

dn_amx_mode dn_amx(void) {
    if ((int)mode < 0) mode = dn_amx_available() ? DN_AMX_TILES : DN_AMX_OFF;
    return mode;
}

int dn_set_amx(dn_amx_mode m) {
    if (m == DN_AMX_TILES && !dn_amx_available()) return -1;
    mode = m;
    return 0;
}

/* ---- the tile instructions ---------------------------------------------------------------- */
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,amx-int8,avx512f")
#include <immintrin.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Every tile 16 rows of 64 bytes: tmm0-3 accumulators (2 x 2), tmm4-5 a, tmm6-7 b. A static
 * configuration: GCC 12's _tile_loadconfig declares that it reads 8 bytes of its operand, so the
 * stores filling a local one were dropped as dead and ldtilecfg faulted on stack garbage. */
static const tile_config CONFIG __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {DN_AMX_ROWS, DN_AMX_ROWS, DN_AMX_ROWS, DN_AMX_ROWS, DN_AMX_ROWS, DN_AMX_ROWS, DN_AMX_ROWS, DN_AMX_ROWS},
};

#define PREFETCH_STEPS 8 /* one core, 4 KB steps from DRAM: 14.4-14.8 GB/s at 4-8, 14.0-14.3 at 32 */

/* Asks L2 for the whole k step PREFETCH_STEPS past `step` (16 pair rows of ldb): past a chunk's
 * end lie the panel's next steps and panels, in the order they are read. */
static inline void prefetch_ahead(const uint32_t *step, int64_t ldb) {
    const char *ahead = (const char *)(step + PREFETCH_STEPS * DN_AMX_PAIRS * ldb);
    for (int64_t line = 0; line < DN_AMX_PAIRS * ldb * 4; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
}

static void tiles_begin(void) { _tile_loadconfig(&CONFIG); }

static void tiles_end(void) { _tile_release(); }

static void tiles_block_bf16(const uint32_t *a, const uint32_t *b, int64_t ldb, int64_t steps,
                             const uint32_t *b_tail, int mt, int nt, float *c, int64_t ldc, int accumulate,
                             int stream) {
    if (accumulate) { /* only the tiles this block stores: the others may lie past c's rows */
        _tile_loadd(0, c, ldc * 4);
        if (nt == 2) _tile_loadd(1, c + 16, ldc * 4);
        if (mt == 2) _tile_loadd(2, c + 16 * ldc, ldc * 4);
        if (mt == 2 && nt == 2) _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    const int64_t sb = ldb * 4;
    for (int64_t s = 0; s <= steps; s++) {
        const uint32_t *bs = b + s * DN_AMX_PAIRS * ldb;
        int64_t stride = sb;
        if (s == steps) {
            if (!b_tail) break;
            bs = b_tail, stride = 32 * 4;
        }
        const uint32_t *as = a + s * DN_AMX_A_STEP;
        _tile_loadd(4, as, DN_AMX_PAIRS * 4);
        _tile_loadd(6, bs, stride);
        _tile_dpbf16ps(0, 4, 6);
        if (nt == 2) {
            _tile_loadd(7, bs + 16, stride);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (mt == 2) {
            _tile_loadd(5, as + DN_AMX_ROWS * DN_AMX_PAIRS, DN_AMX_PAIRS * 4);
            _tile_dpbf16ps(2, 5, 6);
            if (nt == 2) _tile_dpbf16ps(3, 5, 7);
        }
        if (stream) prefetch_ahead(bs, ldb);
    }
    _tile_stored(0, c, ldc * 4);
    if (nt == 2) _tile_stored(1, c + 16, ldc * 4);
    if (mt == 2) {
        _tile_stored(2, c + 16 * ldc, ldc * 4);
        if (nt == 2) _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
    }
}

/* Four accumulators, a in tmm4, b through tmm5-7 (the fourth load reuses tmm5 once its product
 * has read it). */
static void tiles_row_bf16(const uint32_t *a, const uint32_t *b, int64_t steps, const uint32_t *b_tail, float *c,
                           int64_t ldc, int accumulate, int stream) {
    if (accumulate) {
        _tile_loadd(0, c, ldc * 4);
        _tile_loadd(1, c + 16, ldc * 4);
        _tile_loadd(2, c + 32, ldc * 4);
        _tile_loadd(3, c + 48, ldc * 4);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t s = 0; s <= steps; s++) {
        const uint32_t *bs = b + s * DN_AMX_PAIRS * 64;
        if (s == steps) {
            if (!b_tail) break;
            bs = b_tail;
        }
        _tile_loadd(4, a + s * DN_AMX_A_STEP, DN_AMX_PAIRS * 4);
        _tile_loadd(5, bs, 64 * 4);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, bs + 16, 64 * 4);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, bs + 32, 64 * 4);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, bs + 48, 64 * 4);
        _tile_dpbf16ps(3, 4, 5);
        if (stream) prefetch_ahead(bs, 64);
    }
    _tile_stored(0, c, ldc * 4);
    _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 32, ldc * 4);
    _tile_stored(3, c + 48, ldc * 4);
}
#pragma GCC pop_options

const dn_amx_ops dn_amx_tile_ops = {tiles_begin, tiles_end, tiles_block_bf16, tiles_row_bf16};

/* ---- the emulation ------------------------------------------------------------------------- */
static float flush(float f) { return fpclassify(f) == FP_SUBNORMAL ? copysignf(0.0f, f) : f; }

static float bf16_lo(uint32_t pair) { return flush(dn_bf16_to_f32((uint16_t)pair)); }
static float bf16_hi(uint32_t pair) { return flush(dn_bf16_to_f32((uint16_t)(pair >> 16))); }

/* c[16][16] += a[16][16 pairs] . b[16 pairs][16] (strides in uint32 / floats), as tdpbf16ps. */
static void emulated_dpbf16ps(float *c, int64_t ldc, const uint32_t *a, int64_t lda, const uint32_t *b,
                              int64_t ldb) {
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float acc = c[m * ldc + n];
            for (int p = 0; p < DN_AMX_PAIRS; p++) {
                uint32_t x = a[m * lda + p], w = b[p * ldb + n];
                acc = flush(acc + bf16_lo(x) * bf16_lo(w));
                acc = flush(acc + bf16_hi(x) * bf16_hi(w));
            }
            c[m * ldc + n] = acc;
        }
}

static void emulated_nothing(void) {}

/* The tile product of mt x nt tiles, as both blocks define it: b_tail's rows are ldt pairs long. */
static void emulated_product(const uint32_t *a, const uint32_t *b, int64_t ldb, int64_t steps, const uint32_t *b_tail,
                             int64_t ldt, int mt, int nt, float *c, int64_t ldc, int accumulate) {
    if (!accumulate)
        for (int r = 0; r < 16 * mt; r++) memset(c + r * ldc, 0, 16 * nt * sizeof(float));
    for (int64_t s = 0; s <= steps; s++) {
        const uint32_t *bs = b + s * DN_AMX_PAIRS * ldb;
        int64_t stride = ldb;
        if (s == steps) {
            if (!b_tail) break;
            bs = b_tail, stride = ldt;
        }
        for (int i = 0; i < mt; i++)
            for (int j = 0; j < nt; j++)
                emulated_dpbf16ps(c + 16 * i * ldc + 16 * j, ldc, a + s * DN_AMX_A_STEP + 16 * i * DN_AMX_PAIRS,
                                  DN_AMX_PAIRS, bs + 16 * j, stride);
    }
}

static void emulated_block_bf16(const uint32_t *a, const uint32_t *b, int64_t ldb, int64_t steps,
                                const uint32_t *b_tail, int mt, int nt, float *c, int64_t ldc, int accumulate,
                                int stream) {
    (void)stream;
    emulated_product(a, b, ldb, steps, b_tail, 32, mt, nt, c, ldc, accumulate);
}

static void emulated_row_bf16(const uint32_t *a, const uint32_t *b, int64_t steps, const uint32_t *b_tail, float *c,
                              int64_t ldc, int accumulate, int stream) {
    (void)stream;
    emulated_product(a, b, 64, steps, b_tail, 64, 1, 4, c, ldc, accumulate);
}

const dn_amx_ops dn_amx_emulated_ops = {emulated_nothing, emulated_nothing, emulated_block_bf16, emulated_row_bf16};
