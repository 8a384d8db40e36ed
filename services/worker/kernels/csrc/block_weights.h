/* A weight matrix in `BlockCodes`' form, packed for `block_linear.c`: what its product, its
 * de-quantizing and the decode stack read (`block_layout.py` packs it, `block_linear.py` fills it).
 *
 * weight[o, i] = scale(o, i / sub_block) * code[o, i] + offset(o, i / sub_block), codes of `bits`
 * (4, 5, 6 or 8), sub-blocks of 16 or 32 inputs. Outputs in tiles of 16, inputs in blocks of 32;
 * for each tile and block, eight VNNI groups of four inputs, each 64 bytes: the tile's 16 outputs'
 * four codes side by side. `codes`: 8 bits, the eight groups as bytes [8][64]; fewer bits, their
 * low four bits as nibbles [4][64] (group g low, g + 4 high); `planes`: for 5 and 6 bits, bit 4
 * (and 5) of the codes, one 64-bit mask per group [bits - 4][8].
 *
 * Scales and offsets factored as GGUF stores them: scale(o, s) = scale_factors[o, s * sub_block /
 * super_block] * scale_integers[o, s] in float32 (exact: the factors float16, the integers int8),
 * offsets likewise. Factors [tiles][in / super_block][16], float16 where `half_factors`, else
 * float32; integers int8 [tiles][in / sub_block][16], or NULL for ones (then super_block ==
 * sub_block: the factors are the scales). super_block a power of two, a multiple of sub_block.
 * Where every offset is -center times its scale (Q4_0, Q5_0, Q6_K, Q8_0, and those widened),
 * `center` is that integer and `offset_factors` NULL: the product takes center times the row's
 * code sum off the exact integer dot. Else `center` is 0.
 *
 * Where `part_count` > 0 the matrix is `parts` stacked by rows (a fused q/k/v whose parts the file
 * stores in different types: each keeps its own codes rather than all widened to the widest),
 * each of these `in_features` and none stacked itself; `out_features` is their sum and no other
 * field is read.
 */
#ifndef ZTGI_BLOCK_WEIGHTS_H
#define ZTGI_BLOCK_WEIGHTS_H
#include <stdint.h>

typedef struct BlockWeights {
    int32_t bits, sub_block, super_block, center;
    int64_t in_features, out_features;
    const uint8_t *codes;
    const uint64_t *planes;
    const void *scale_factors, *offset_factors;
    const int8_t *scale_integers, *offset_integers;
    int32_t half_factors, part_count;
    const struct BlockWeights *parts;
} BlockWeights;

/* How x's rows (and out) come and are rounded per block of 32 (`format`): */
#define ROWS_FLOAT32 0            /* float32, to two int8 levels (about 16 bits) */
#define ROWS_BFLOAT16 1           /* bfloat16, to one int8 level, as llama.cpp's activations */
#define ROWS_FLOAT32_ONE_LEVEL 2  /* float32, to one int8 level (the serving dtype where there is no bfloat16) */

/* y[r * out_stride + o] = (x W^T)[r, o]; `block_linear`'s signature, for callers through a pointer. */
typedef int (*BlockLinearFn)(const void *x, int format, int64_t rows, const BlockWeights *w, void *out,
                             int64_t out_stride, int num_threads);

#endif
