/* y = x W^T on CPU with W in GGUF's block formats: Q8_0 (int8 codes, a scale per block of 32
 * inputs) and Q4_1 (4-bit codes, a scale and an offset per block; Q4_0 is Q4_1 with the offset -8
 * scales).
 *
 * Integer products, as llama.cpp computes these formats, with finer activations: each row of x is
 * rounded per block of 32 inputs to int8 codes c1 in steps of its largest magnitude over 127, and
 * what that leaves to int8 codes c2 in steps 254 times finer, so x = step (254 c1 + c2) / 254 to
 * about 16 bits (llama.cpp keeps c1 alone, 8 bits, which moved greedy texts off float weights'
 * twice as often). Each block's products of codes are summed exactly in int32 with AVX512-VNNI,
 * then scaled by the weight block's scale and the row block's step in float32. VNNI multiplies
 * unsigned bytes by signed ones: 4-bit codes are unsigned as they are (w = scale code + offset, so
 * a block gives scale dot + offset times the sum of x's codes); int8 weights are stored plus 128,
 * and 128 times the sum of x's codes is taken off.
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
#error "these kernels need AVX512-VNNI and AVX512-BF16: the worker keeps torch's layers"
#endif

#define BLOCK 32
#define TILE 16
#define GROUPS (BLOCK / 4)  /* four inputs per VNNI lane */
#define ROWS_PER_PASS 8     /* rows of x sharing each loaded block of weights */
#define FINER 254           /* second-level steps per first-level step */

typedef struct {
    const uint8_t *weights;
    const uint16_t *scales, *offsets;  /* offsets: Q4_1 only */
    int64_t blocks, out_features;
    const int8_t *codes;               /* x rounded: [rows][blocks][c1 32, c2 32] */
    const float *steps;                /* [rows][blocks]: what one unit of 254 c1 + c2 is worth */
    const int32_t *code_sums;          /* [rows][blocks]: sums of 254 c1 + c2 */
    void *out;
    int bf16;                          /* x and out bfloat16, else float32 */
} Product;

static inline __m512 load16(const void *row, int64_t at, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)row + at);
    __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* 16 values times `inverse` (first-level steps per unit) to c1 (at `codes`) and c2 (BLOCK further);
 * returns 254 c1 + c2. What c1 leaves is taken from the exact product (one fused operation), so it
 * does not hang on the compiler's choice to fuse. */
static inline __m512i round16(__m512 x, __m512 inverse, int8_t *codes) {
    __m512i first = _mm512_cvtps_epi32(_mm512_mul_ps(x, inverse));  /* nearest, ties to even */
    __m512 left = _mm512_fmsub_ps(x, inverse, _mm512_cvtepi32_ps(first));
    __m512i second = _mm512_cvtps_epi32(_mm512_mul_ps(left, _mm512_set1_ps((float)FINER)));
    _mm_storeu_si128((__m128i *)codes, _mm512_cvtsepi32_epi8(first));
    _mm_storeu_si128((__m128i *)(codes + BLOCK), _mm512_cvtsepi32_epi8(second));
    return _mm512_add_epi32(_mm512_mullo_epi32(first, _mm512_set1_epi32(FINER)), second);
}

/* One row of x rounded per block of 32: its codes, each block's step and sum of codes. */
static void round_row(const void *x, int bf16, int64_t blocks, int8_t *codes, float *steps, int32_t *sums) {
    for (int64_t b = 0; b < blocks; b++) {
        __m512 low = load16(x, b * BLOCK, bf16), high = load16(x, b * BLOCK + 16, bf16);
        float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
        __m512 inverse = _mm512_set1_ps(largest > 0.f ? 127.f / largest : 0.f);
        int8_t *block = codes + b * 2 * BLOCK;
        __m512i combined = _mm512_add_epi32(round16(low, inverse, block), round16(high, inverse, block + 16));
        sums[b] = _mm512_reduce_add_epi32(combined);
        steps[b] = largest / 127.f / (float)FINER;
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

/* A tile's weight codes against one row block's 254 c1 + c2, per output. */
static inline __attribute__((always_inline)) __m512i block_dot(const __m512i groups[GROUPS], const int8_t *codes) {
    const int32_t *c1 = (const int32_t *)codes, *c2 = (const int32_t *)(codes + BLOCK);
    __m512i first = _mm512_setzero_si512(), second = _mm512_setzero_si512();
    for (int g = 0; g < GROUPS; g++) {
        first = _mm512_dpbusd_epi32(first, groups[g], _mm512_set1_epi32(c1[g]));
        second = _mm512_dpbusd_epi32(second, groups[g], _mm512_set1_epi32(c2[g]));
    }
    return _mm512_add_epi32(_mm512_mullo_epi32(first, _mm512_set1_epi32(FINER)), second);
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
            int32_t code_sum = p->code_sums[row_block];
            float step = p->steps[row_block];
            __m512i dot = block_dot(groups, p->codes + row_block * 2 * BLOCK);
            if (q4)
                sums[r] = _mm512_fmadd_ps(offsets, _mm512_set1_ps(step * (float)code_sum), sums[r]);
            else
                dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * code_sum));
            sums[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scales, _mm512_set1_ps(step)), sums[r]);
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

/* Every row of x against tile t, a pass of up to 8 rows at a time: one function per format, with
 * the row count a constant in each pass so the sums stay in registers. */
#define TILE_FUNCTION(name, q4)                                                          \
    static void name(const Product *p, int64_t t, int64_t rows) {                        \
        for (int64_t first = 0; first < rows; first += ROWS_PER_PASS) {                 \
            switch (rows - first < ROWS_PER_PASS ? (int)(rows - first) : ROWS_PER_PASS) { \
            case 1: tile_rows(p, t, first, 1, q4); break;                                \
            case 2: tile_rows(p, t, first, 2, q4); break;                                \
            case 3: tile_rows(p, t, first, 3, q4); break;                                \
            case 4: tile_rows(p, t, first, 4, q4); break;                                \
            case 5: tile_rows(p, t, first, 5, q4); break;                                \
            case 6: tile_rows(p, t, first, 6, q4); break;                                \
            case 7: tile_rows(p, t, first, 7, q4); break;                                \
            default: tile_rows(p, t, first, 8, q4); break;                               \
            }                                                                            \
        }                                                                                \
    }

TILE_FUNCTION(tile_q8, 0)
TILE_FUNCTION(tile_q4, 1)

static int product(const void *x, int64_t rows, int64_t in_features, Product p, int q4, int num_threads) {
    if (rows < 1 || in_features < BLOCK || in_features % BLOCK || p.out_features < 1) return 1;
    int64_t blocks = in_features / BLOCK, tiles = (p.out_features + TILE - 1) / TILE;
    int8_t *codes = malloc((size_t)(rows * in_features * 2));
    float *steps = malloc(sizeof(float) * (size_t)(rows * blocks));
    int32_t *code_sums = malloc(sizeof(int32_t) * (size_t)(rows * blocks));
    int failed = codes == NULL || steps == NULL || code_sums == NULL;
    if (!failed) {
        for (int64_t r = 0; r < rows; r++)
            round_row((const char *)x + r * in_features * (p.bf16 ? 2 : 4), p.bf16, blocks,
                      codes + r * in_features * 2, steps + r * blocks, code_sums + r * blocks);
        p.blocks = blocks;
        p.codes = codes;
        p.steps = steps;
        p.code_sums = code_sums;
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (q4) tile_q4(&p, t, rows);
            else tile_q8(&p, t, rows);
        }
    }
    free(codes);
    free(steps);
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
