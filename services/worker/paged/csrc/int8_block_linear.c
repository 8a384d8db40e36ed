/* y = x W^T on CPU with W as int8 codes and one scale per block of 32 inputs (GGUF's Q8_0).
 *
 * As llama.cpp computes a Q8_0 product: each row of x is first rounded to int8 per block of 32
 * inputs with a scale of its own (the block's largest magnitude over 127), the block products are
 * summed exactly in int32 with AVX512-VNNI, and each block's sum is scaled by the weight block's and
 * the row block's scales and added up in float32. VNNI multiplies unsigned bytes by signed ones, so
 * the weights are stored plus 128 (0..255) and 128 times the block's sum of x codes is taken off.
 *
 * Layout (made by the caller, `Int8BlockLinear`): the outputs in tiles of 16; weights
 * [tiles][blocks][8][16][4] uint8: for a tile and a block, eight groups of four inputs, each with
 * the tile's 16 outputs' four bytes side by side (one VNNI operand); scales [tiles][blocks][16]
 * float16. x [rows, in_features] float32 with in_features a multiple of 32; out [rows, out_features]
 * float32. The tiles are shared among the OpenMP threads of the runtime torch loaded. Returns 0, or
 * non-zero when it cannot run.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#if !defined(__AVX512VNNI__) || !defined(__AVX512BW__) || !defined(__AVX512F__)
#error "this kernel needs AVX512-VNNI: the worker keeps the float layer"
#endif

#define BLOCK 32
#define TILE 16
#define GROUPS (BLOCK / 4)  /* four inputs per VNNI lane */
#define ROWS_PER_PASS 8     /* rows of x sharing each loaded block of weights */

typedef struct {
    const uint8_t *weights;
    const uint16_t *scales;
    int64_t blocks, out_features;
    const int8_t *codes;       /* x rounded: [rows][blocks * 32] */
    const float *row_scales;   /* [rows][blocks] */
    const int32_t *code_sums;  /* [rows][blocks] */
    float *out;
} Product;

/* One row of x as int8 codes per block of 32, with each block's scale and sum of codes. */
static void round_row(const float *x, int64_t blocks, int8_t *codes, float *scales, int32_t *sums) {
    for (int64_t b = 0; b < blocks; b++) {
        __m512 low = _mm512_loadu_ps(x + b * BLOCK), high = _mm512_loadu_ps(x + b * BLOCK + 16);
        float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
        __m512 inverse = _mm512_set1_ps(largest > 0.f ? 127.f / largest : 0.f);
        __m512i code_low = _mm512_cvtps_epi32(_mm512_mul_ps(low, inverse));  /* nearest, ties to even */
        __m512i code_high = _mm512_cvtps_epi32(_mm512_mul_ps(high, inverse));
        _mm_storeu_si128((__m128i *)(codes + b * BLOCK), _mm512_cvtsepi32_epi8(code_low));
        _mm_storeu_si128((__m128i *)(codes + b * BLOCK + 16), _mm512_cvtsepi32_epi8(code_high));
        sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(code_low, code_high));
        scales[b] = largest / 127.f;
    }
}

/* `count` rows of x from `first` against one tile of 16 outputs. */
static inline __attribute__((always_inline)) void tile_rows(const Product *p, int64_t tile, int64_t first,
                                                           const int count) {
    __m512 sums[ROWS_PER_PASS];
    for (int r = 0; r < count; r++) sums[r] = _mm512_setzero_ps();
    const uint8_t *w = p->weights + tile * p->blocks * BLOCK * TILE;
    const uint16_t *s = p->scales + tile * p->blocks * TILE;
    for (int64_t b = 0; b < p->blocks; b++) {
        __m512i groups[GROUPS];
        for (int g = 0; g < GROUPS; g++) groups[g] = _mm512_loadu_si512(w + (b * GROUPS + g) * 64);
        __m512 weight_scales = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + b * TILE)));
        for (int r = 0; r < count; r++) {
            int64_t row_block = (first + r) * p->blocks + b;
            const int32_t *x4 = (const int32_t *)(p->codes + row_block * BLOCK);
            __m512i dot = _mm512_set1_epi32(-128 * p->code_sums[row_block]);
            for (int g = 0; g < GROUPS; g++) dot = _mm512_dpbusd_epi32(dot, groups[g], _mm512_set1_epi32(x4[g]));
            __m512 scale = _mm512_mul_ps(weight_scales, _mm512_set1_ps(p->row_scales[row_block]));
            sums[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, sums[r]);
        }
    }
    int64_t left = p->out_features - tile * TILE;
    __mmask16 keep = left >= TILE ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    for (int r = 0; r < count; r++) _mm512_mask_storeu_ps(p->out + (first + r) * p->out_features + tile * TILE, keep,
                                                           sums[r]);
}

static void tile(const Product *p, int64_t t, int64_t rows) {
    for (int64_t first = 0; first < rows; first += ROWS_PER_PASS) {
        switch (rows - first < ROWS_PER_PASS ? (int)(rows - first) : ROWS_PER_PASS) {
        case 1: tile_rows(p, t, first, 1); break;  /* a constant count keeps the sums in registers */
        case 2: tile_rows(p, t, first, 2); break;
        case 3: tile_rows(p, t, first, 3); break;
        case 4: tile_rows(p, t, first, 4); break;
        case 5: tile_rows(p, t, first, 5); break;
        case 6: tile_rows(p, t, first, 6); break;
        case 7: tile_rows(p, t, first, 7); break;
        default: tile_rows(p, t, first, 8); break;
        }
    }
}

int int8_block_linear(const float *x, int64_t rows, int64_t in_features, const uint8_t *weights,
                      const uint16_t *scales, int64_t out_features, float *out, int num_threads) {
    if (rows < 1 || in_features < BLOCK || in_features % BLOCK || out_features < 1) return 1;
    int64_t blocks = in_features / BLOCK, tiles = (out_features + TILE - 1) / TILE;
    int8_t *codes = malloc((size_t)(rows * in_features));
    float *row_scales = malloc(sizeof(float) * (size_t)(rows * blocks));
    int32_t *code_sums = malloc(sizeof(int32_t) * (size_t)(rows * blocks));
    int failed = codes == NULL || row_scales == NULL || code_sums == NULL;
    if (!failed) {
        for (int64_t r = 0; r < rows; r++)
            round_row(x + r * in_features, blocks, codes + r * in_features, row_scales + r * blocks,
                      code_sums + r * blocks);
        Product p = {weights, scales, blocks, out_features, codes, row_scales, code_sums, out};
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (int64_t t = 0; t < tiles; t++) tile(&p, t, rows);
    }
    free(codes);
    free(row_scales);
    free(code_sums);
    return failed ? 2 : 0;
}
