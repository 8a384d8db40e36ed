/* y = x W^T on CPU with W in GGUF's block formats: Q8_0 (int8 codes, a scale per block of 32
 * inputs) and Q4_1 (4-bit codes, a scale and an offset per block; Q4_0 is Q4_1 with the offset -8
 * scales).
 *
 * As llama.cpp computes these products: each row of x is first rounded to int8 per block of 32
 * inputs with a scale of its own (the block's largest magnitude over 127), each block's product of
 * codes is summed exactly in int32 with AVX512-VNNI, then scaled by the weight block's and the row
 * block's scales and added up in float32. VNNI multiplies unsigned bytes by signed ones: 4-bit
 * codes are unsigned already (w = scale * code + offset, so a block gives scale * dot + offset *
 * the sum of x's codes), int8 weights are stored plus 128 and 128 times the sum of x's codes is
 * taken off.
 *
 * Layout (made by the caller, `block_linear.py`), outputs in tiles of 16, for each tile and block:
 * Q8_0 weights [8][16][4] uint8: eight groups of four inputs, each with the tile's 16 outputs'
 * four bytes side by side (one VNNI operand); Q4_1 codes [4][16][4] bytes, group g in the low
 * nibbles and group g + 4 in the high ones; scales and offsets [16] float16. x [rows, in_features]
 * float32 or bfloat16 (`bf16`), in_features a multiple of 32; out [rows, out_features] in x's
 * dtype (bfloat16 rounded to nearest even). The tiles are shared among the OpenMP threads of the
 * runtime torch loaded. Returns 0, or non-zero when it cannot run.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#if !defined(__AVX512VNNI__) || !defined(__AVX512BW__) || !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "these kernels need AVX512-VNNI: the worker keeps torch's layers"
#endif

#define BLOCK 32
#define TILE 16
#define GROUPS (BLOCK / 4)  /* four inputs per VNNI lane */
#define ROWS_PER_PASS 8     /* rows of x sharing each loaded block of weights */

typedef struct {
    const uint8_t *weights;
    const uint16_t *scales, *offsets;  /* offsets: Q4_1 only */
    int64_t blocks, out_features;
    const int8_t *codes;               /* x rounded: [rows][blocks * 32] */
    const float *row_scales;           /* [rows][blocks] */
    const int32_t *code_sums;          /* [rows][blocks] */
    void *out;
    int bf16;                          /* x and out bfloat16, else float32 */
} Product;

static inline __m512 load16(const void *row, int64_t at, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)row + at);
    __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* One row of x as int8 codes per block of 32, with each block's scale and sum of codes. */
static void round_row(const void *x, int bf16, int64_t blocks, int8_t *codes, float *scales, int32_t *sums) {
    for (int64_t b = 0; b < blocks; b++) {
        __m512 low = load16(x, b * BLOCK, bf16), high = load16(x, b * BLOCK + 16, bf16);
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

static inline __m512 half16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* The VNNI operands of one tile's block: eight groups of four inputs. */
static inline __attribute__((always_inline)) void load_groups(const Product *p, int64_t tile, int64_t b, int q4,
                                                              __m512i groups[GROUPS]) {
    if (q4) {
        const uint8_t *w = p->weights + (tile * p->blocks + b) * (BLOCK * TILE / 2);
        __m512i nibbles = _mm512_set1_epi8(0x0f);
        for (int g = 0; g < GROUPS / 2; g++) {
            __m512i both = _mm512_loadu_si512(w + g * 64);
            groups[g] = _mm512_and_si512(both, nibbles);
            groups[g + GROUPS / 2] = _mm512_and_si512(_mm512_srli_epi16(both, 4), nibbles);
        }
    } else {
        const uint8_t *w = p->weights + (tile * p->blocks + b) * (BLOCK * TILE);
        for (int g = 0; g < GROUPS; g++) groups[g] = _mm512_loadu_si512(w + g * 64);
    }
}

/* `count` rows of x from `first` against one tile of 16 outputs. */
static inline __attribute__((always_inline)) void tile_rows(const Product *p, int64_t tile, int64_t first,
                                                           const int count, const int q4) {
    __m512 sums[ROWS_PER_PASS];
    for (int r = 0; r < count; r++) sums[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < p->blocks; b++) {
        __m512i groups[GROUPS];
        load_groups(p, tile, b, q4, groups);
        int64_t at = (tile * p->blocks + b) * TILE;
        __m512 scales = half16(p->scales + at), offsets = q4 ? half16(p->offsets + at) : _mm512_setzero_ps();
        for (int r = 0; r < count; r++) {
            int64_t row_block = (first + r) * p->blocks + b;
            const int32_t *x4 = (const int32_t *)(p->codes + row_block * BLOCK);
            int32_t code_sum = p->code_sums[row_block];
            __m512i dot = q4 ? _mm512_setzero_si512() : _mm512_set1_epi32(-128 * code_sum);
            for (int g = 0; g < GROUPS; g++) dot = _mm512_dpbusd_epi32(dot, groups[g], _mm512_set1_epi32(x4[g]));
            __m512 row_scale = _mm512_set1_ps(p->row_scales[row_block]);
            if (q4)
                sums[r] = _mm512_fmadd_ps(offsets, _mm512_set1_ps(p->row_scales[row_block] * (float)code_sum),
                                          sums[r]);
            sums[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scales, row_scale), sums[r]);
        }
    }
    int64_t left = p->out_features - tile * TILE;
    __mmask16 keep = left >= TILE ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    for (int r = 0; r < count; r++) {
        int64_t at = (first + r) * p->out_features + tile * TILE;
        if (p->bf16)
            _mm256_mask_storeu_epi16((uint16_t *)p->out + at, keep, (__m256i)_mm512_cvtneps_pbh(sums[r]));
        else
            _mm512_mask_storeu_ps((float *)p->out + at, keep, sums[r]);
    }
}

#define ROWS_CASES(q4)                                                     \
    switch (rows - first < ROWS_PER_PASS ? (int)(rows - first) : ROWS_PER_PASS) { \
    case 1: tile_rows(p, t, first, 1, q4); break;                         \
    case 2: tile_rows(p, t, first, 2, q4); break;                         \
    case 3: tile_rows(p, t, first, 3, q4); break;                         \
    case 4: tile_rows(p, t, first, 4, q4); break;                         \
    case 5: tile_rows(p, t, first, 5, q4); break;                         \
    case 6: tile_rows(p, t, first, 6, q4); break;                         \
    case 7: tile_rows(p, t, first, 7, q4); break;                         \
    default: tile_rows(p, t, first, 8, q4); break;                        \
    }

/* Every row of x against tile t, a pass of up to 8 rows at a time; constants keep the sums in registers. */
static void tile_q8(const Product *p, int64_t t, int64_t rows) {
    for (int64_t first = 0; first < rows; first += ROWS_PER_PASS) ROWS_CASES(0)
}

static void tile_q4(const Product *p, int64_t t, int64_t rows) {
    for (int64_t first = 0; first < rows; first += ROWS_PER_PASS) ROWS_CASES(1)
}

static int product(const void *x, int64_t rows, int64_t in_features, Product p, int q4, int num_threads) {
    if (rows < 1 || in_features < BLOCK || in_features % BLOCK || p.out_features < 1) return 1;
    int64_t blocks = in_features / BLOCK, tiles = (p.out_features + TILE - 1) / TILE;
    int8_t *codes = malloc((size_t)(rows * in_features));
    float *row_scales = malloc(sizeof(float) * (size_t)(rows * blocks));
    int32_t *code_sums = malloc(sizeof(int32_t) * (size_t)(rows * blocks));
    int failed = codes == NULL || row_scales == NULL || code_sums == NULL;
    if (!failed) {
        for (int64_t r = 0; r < rows; r++)
            round_row((const char *)x + r * in_features * (p.bf16 ? 2 : 4), p.bf16, blocks, codes + r * in_features,
                      row_scales + r * blocks, code_sums + r * blocks);
        p.blocks = blocks;
        p.codes = codes;
        p.row_scales = row_scales;
        p.code_sums = code_sums;
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (q4) tile_q4(&p, t, rows);
            else tile_q8(&p, t, rows);
        }
    }
    free(codes);
    free(row_scales);
    free(code_sums);
    return failed ? 2 : 0;
}

int int8_block_linear(const void *x, int bf16, int64_t rows, int64_t in_features, const uint8_t *weights,
                      const uint16_t *scales, int64_t out_features, void *out, int num_threads) {
    Product p = {weights, scales, NULL, 0, out_features, NULL, NULL, NULL, out, bf16};
    return product(x, rows, in_features, p, 0, num_threads);
}

int int4_block_linear(const void *x, int bf16, int64_t rows, int64_t in_features, const uint8_t *codes,
                      const uint16_t *scales, const uint16_t *offsets, int64_t out_features, void *out,
                      int num_threads) {
    Product p = {codes, scales, offsets, 0, out_features, NULL, NULL, NULL, out, bf16};
    return product(x, rows, in_features, p, 1, num_threads);
}
