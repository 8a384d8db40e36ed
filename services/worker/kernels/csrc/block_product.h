/* What `block_linear.c` and its AVX2 twin `block_linear_avx2.c` share beyond their instructions:
 * the arguments of one product (`Product`), the checks of a weight descriptor and its parts, and
 * the two exported calls, `block_linear` (rows rounded by `round_row`, then every tile of 16
 * outputs by the kernel's `tile_function`, both shared among the OpenMP threads of one parallel
 * region) and `block_dequantize`
 * (every tile's blocks by `dequantize_block`). Each kernel source includes it once and defines
 * those three functions; see `block_linear.c` for the arithmetic.
 */
#ifndef ZTGI_BLOCK_PRODUCT_H
#define ZTGI_BLOCK_PRODUCT_H
#include <stdint.h>
#include <stdlib.h>

#include "block_weights.h"

#define BLOCK 32
#define HALF 16
#define TILE 16
#define GROUPS (BLOCK / 4)  /* four inputs per group */
#define FINER 254           /* second-level steps per first-level step */
#define MAX_PARTS 8         /* of a stacked matrix */
#define ROUND_PIECE 16      /* blocks of a row one thread rounds at a time */

typedef struct {
    const BlockWeights *w;
    int64_t blocks;
    const int8_t *codes;      /* x rounded: [rows][blocks][c1 32, c2 32] */
    const float *steps;       /* [rows][blocks]: what one unit of the row's code is worth */
    const int32_t *code_sums; /* [rows][blocks * 2]: sums of the codes per 16 inputs */
    const float *sum_terms;   /* [rows][blocks * 3]: step times the code sums of each 16 inputs and of the 32 */
    void *out;
    int64_t out_stride;
    int bf16;                 /* x and out bfloat16, else float32 */
} Product;

typedef void (*TileFn)(const Product *, int64_t, int64_t);

/* The including kernel's: `blocks` blocks of a row of x rounded per block of 32 to `levels` int8
 * codes (their codes, each block's step, the code sums per 16 and those times the step); the tile
 * function for a weight kind and levels (NULL for none); one tile's block of weights written as
 * floats. */
static void round_row(const void *x, int bf16, int levels, int64_t blocks, int8_t *codes, float *steps,
                      int32_t *sums, float *terms);
static TileFn tile_function(const BlockWeights *w, int levels);
static void dequantize_block(const BlockWeights *w, int64_t blocks, int64_t tile, int64_t b, int bf16, void *out);

static int valid(const BlockWeights *w) {
    int bits_ok = w->bits == 4 || w->bits == 5 || w->bits == 6 || w->bits == 8;
    int planes_ok = w->bits == 4 || w->bits == 8 || w->planes != NULL;
    int offsets_ok = (w->offset_factors != NULL) != (w->center != 0);
    int sub_ok = w->sub_block == HALF || w->sub_block == BLOCK;
    int super_ok = w->super_block >= w->sub_block && (w->super_block & (w->super_block - 1)) == 0
                   && w->in_features % w->super_block == 0;
    /* integers: the scales' where the factors are not the scales; then by super-blocks of blocks */
    int integers_ok = w->scale_integers == NULL ? w->super_block == w->sub_block && w->offset_integers == NULL
                                                : w->super_block >= BLOCK;
    return bits_ok && planes_ok && offsets_ok && sub_ok && super_ok && integers_ok && w->in_features >= BLOCK
           && w->in_features % BLOCK == 0 && w->out_features >= 1 && w->codes != NULL && w->scale_factors != NULL;
}

/* The matrix's parts (itself where it is not stacked) into `parts`; their count, or 0 where one is
 * invalid, stacked itself, of other inputs, or they do not add up to its outputs. */
static int parts_of(const BlockWeights *w, const BlockWeights *parts[MAX_PARTS]) {
    if (w->part_count == 0) {
        parts[0] = w;
        return valid(w);
    }
    if (w->part_count < 0 || w->part_count > MAX_PARTS || w->parts == NULL) return 0;
    int64_t outputs = 0;
    for (int i = 0; i < w->part_count; i++) {
        const BlockWeights *part = &w->parts[i];
        if (!valid(part) || part->part_count != 0 || part->in_features != w->in_features) return 0;
        parts[i] = part;
        outputs += part->out_features;
    }
    return outputs == w->out_features ? w->part_count : 0;
}

static int64_t tile_count(const BlockWeights *w) { return (w->out_features + TILE - 1) / TILE; }

/* One Product per part, its outputs `first` columns on in `out`; returns the tiles of all. */
static int64_t products(const BlockWeights *parts[], int count, const Product *base, Product each[], TileFn fns[],
                        int64_t first_tiles[], int levels) {
    int64_t tiles = 0, first = 0;
    for (int i = 0; i < count; i++) {
        each[i] = *base;
        each[i].w = parts[i];
        each[i].out = (char *)base->out + first * (base->bf16 ? 2 : 4);
        fns[i] = tile_function(parts[i], levels);
        first_tiles[i] = tiles;
        tiles += tile_count(parts[i]);
        first += parts[i]->out_features;
    }
    return tiles;
}

int block_linear(const void *x, int format, int64_t rows, const BlockWeights *w, void *out, int64_t out_stride,
                 int num_threads) {
    const BlockWeights *parts[MAX_PARTS];
    int count = parts_of(w, parts);
    if (rows < 1 || count == 0 || out_stride < w->out_features || format < ROWS_FLOAT32
        || format > ROWS_FLOAT32_ONE_LEVEL)
        return 1;
    int64_t in_features = w->in_features, blocks = in_features / BLOCK;
    int bf16 = format == ROWS_BFLOAT16, levels = format == ROWS_FLOAT32 ? 2 : 1;
    int8_t *codes = malloc((size_t)(rows * in_features * 2));
    float *steps = malloc(sizeof(float) * (size_t)(rows * blocks));
    int32_t *code_sums = malloc(sizeof(int32_t) * (size_t)(rows * blocks * 2));
    float *sum_terms = malloc(sizeof(float) * (size_t)(rows * blocks * 3));
    int failed = codes == NULL || steps == NULL || code_sums == NULL || sum_terms == NULL;
    if (!failed) {
        Product base = {w, blocks, codes, steps, code_sums, sum_terms, out, out_stride, bf16}, each[MAX_PARTS];
        TileFn fns[MAX_PARTS];
        int64_t first_tiles[MAX_PARTS];
        int64_t tiles = products(parts, count, &base, each, fns, first_tiles, levels);
        int64_t pieces = (blocks + ROUND_PIECE - 1) / ROUND_PIECE;  /* of each row */
#pragma omp parallel num_threads(num_threads)
        {
#pragma omp for schedule(static)
            for (int64_t u = 0; u < rows * pieces; u++) {
                int64_t r = u / pieces, b = (u % pieces) * ROUND_PIECE, at = r * blocks + b;
                round_row((const char *)x + (r * in_features + b * BLOCK) * (bf16 ? 2 : 4), bf16, levels,
                          blocks - b < ROUND_PIECE ? blocks - b : ROUND_PIECE, codes + at * 2 * BLOCK, steps + at,
                          code_sums + at * 2, sum_terms + at * 3);
            }  /* every code rounded (the loop's barrier) before any tile reads them */
#pragma omp for schedule(static)
            for (int64_t t = 0; t < tiles; t++) {
                int i = count - 1;
                while (first_tiles[i] > t) i--;
                fns[i](&each[i], t - first_tiles[i], rows);
            }
        }
    }
    free(codes);
    free(steps);
    free(code_sums);
    free(sum_terms);
    return failed ? 2 : 0;
}

int block_dequantize(const BlockWeights *w, int bf16, void *out, int num_threads) {
    const BlockWeights *parts[MAX_PARTS];
    int count = parts_of(w, parts);
    if (count == 0) return 1;
    int64_t blocks = w->in_features / BLOCK, first = 0;
    for (int i = 0; i < count; i++) {
        void *rows = (char *)out + first * w->in_features * (bf16 ? 2 : 4);
        const BlockWeights *part = parts[i];
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (int64_t t = 0; t < tile_count(part); t++)
            for (int64_t b = 0; b < blocks; b++) dequantize_block(part, blocks, t, b, bf16, rows);
        first += part->out_features;
    }
    return 0;
}

#endif
