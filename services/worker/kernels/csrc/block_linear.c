/* y = x W^T on CPU with W in `BlockCodes`' form (`block_weights.h`): every GGUF block type ztgi
 * multiplies as stored, 4-, 5-, 6- or 8-bit codes with a scale and offset per sub-block of 16 or
 * 32 inputs, each a float16 (or float32) factor per super-block times an int8 per sub-block, as
 * the file stores them: the product forms each scale (exact in float32) as it reads the block.
 *
 * Integer products, as llama.cpp computes these formats: each row of x is rounded per block of 32
 * inputs to int8 codes c1 in steps of its largest magnitude over 127. Rows of bfloat16 keep c1
 * alone, 8 bits as llama.cpp's (and as fine as bfloat16's own mantissa), one VNNI product per
 * group. Rows of float32, the exactness dtype, also round what c1 leaves to int8 codes c2 in
 * steps 254 times finer, so x = step (254 c1 + c2) / 254 to about 16 bits, for a second product
 * per group: 8-bit rows moved greedy texts off float weights' twice as often, and the second
 * product costs a step of many rows half again its time. Each sub-block's products of codes are
 * summed exactly in int32 with AVX512-VNNI, then per output step * (scale * dot + offset * sum of
 * x's codes) in float32. VNNI multiplies unsigned bytes by signed ones: the weights' codes are
 * unsigned. Where the offsets are -center scales, center times the code sum is taken off the
 * integer dot instead (exact).
 *
 * The weights' layout is `block_weights.h`'s. x [rows, in_features] float32 or bfloat16 (`bf16`),
 * in_features a multiple of 32; out [rows, out_stride] in x's dtype (bfloat16 rounded to nearest
 * even), the first out_features of each row written. The tiles are shared among the OpenMP
 * threads of the runtime torch loaded. `block_dequantize` writes the weights as the product sees
 * them, [out, in] bfloat16 or float32. Both return 0, or non-zero when they cannot run.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "block_product.h"

#if !defined(__AVX512VNNI__) || !defined(__AVX512BW__) || !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "these kernels need AVX512-VNNI and AVX512-BF16: the worker keeps torch's layers"
#endif

#define ROWS_PER_PASS 8     /* rows of x sharing each loaded block of weights */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline __m512 load16(const void *row, int64_t at, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)row + at);
    __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* 16 values times `inverse` (first-level steps per unit) to c1 (at `codes`); returns their sum,
 * or with two `levels` also c2 (BLOCK further) and the sum of 254 c1 + c2. What c1 leaves is taken
 * from the exact product (one fused operation), so it does not hang on the compiler's choice to fuse. */
static inline int32_t round16(__m512 x, __m512 inverse, int8_t *codes, int levels) {
    __m512i first = _mm512_cvtps_epi32(_mm512_mul_ps(x, inverse));  /* nearest, ties to even */
    if (levels == 1) {
        _mm_storeu_si128((__m128i *)codes, _mm512_cvtsepi32_epi8(first));
        return _mm512_reduce_add_epi32(first);
    }
    __m512 left = _mm512_fmsub_ps(x, inverse, _mm512_cvtepi32_ps(first));
    __m512i second = _mm512_cvtps_epi32(_mm512_mul_ps(left, _mm512_set1_ps((float)FINER)));
    _mm_storeu_si128((__m128i *)codes, _mm512_cvtsepi32_epi8(first));
    _mm_storeu_si128((__m128i *)(codes + BLOCK), _mm512_cvtsepi32_epi8(second));
    return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_mullo_epi32(first, _mm512_set1_epi32(FINER)), second));
}

/* `blocks` blocks of one row of x (all of it or a piece) rounded per block of 32 to `levels` codes:
 * their codes, each block's step, the sums of codes per 16 and those sums times the step (once per
 * row, not once per tile of outputs). */
static void round_row(const void *x, int bf16, int levels, int64_t blocks, int8_t *codes, float *steps,
                      int32_t *sums, float *terms) {
    for (int64_t b = 0; b < blocks; b++) {
        __m512 low = load16(x, b * BLOCK, bf16), high = load16(x, b * BLOCK + HALF, bf16);
        float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
        __m512 inverse = _mm512_set1_ps(largest > 0.f ? 127.f / largest : 0.f);
        int8_t *block = codes + b * 2 * BLOCK;
        sums[2 * b] = round16(low, inverse, block, levels);
        sums[2 * b + 1] = round16(high, inverse, block + HALF, levels);
        steps[b] = levels == 1 ? largest / 127.f : largest / 127.f / (float)FINER;
        terms[3 * b] = steps[b] * (float)sums[2 * b];
        terms[3 * b + 1] = steps[b] * (float)sums[2 * b + 1];
        terms[3 * b + 2] = steps[b] * (float)(sums[2 * b] + sums[2 * b + 1]);
    }
}

/* The VNNI operands of one tile's block: eight groups of four inputs, codes of `bits`. */
ALWAYS_INLINE void load_groups(const BlockWeights *w, int64_t blocks, int64_t tile, int64_t b, const int bits,
                               __m512i groups[GROUPS]) {
    int64_t at = tile * blocks + b;
    if (bits == 8) {
        const uint8_t *codes = w->codes + at * (BLOCK * TILE);
        for (int g = 0; g < GROUPS; g++) groups[g] = _mm512_loadu_si512(codes + g * 64);
        return;
    }
    const uint8_t *codes = w->codes + at * (BLOCK * TILE / 2);
    __m512i nibbles = _mm512_set1_epi8(0x0f);
    for (int g = 0; g < GROUPS / 2; g++) {
        __m512i both = _mm512_loadu_si512(codes + g * 64);
        groups[g] = _mm512_and_si512(both, nibbles);
        groups[g + GROUPS / 2] = _mm512_and_si512(_mm512_srli_epi16(both, 4), nibbles);
    }
    const uint64_t *planes = w->planes + at * (bits - 4) * GROUPS;
    for (int p = 0; p < bits - 4; p++) {
        __m512i bit = _mm512_set1_epi8((char)(16 << p));
        for (int g = 0; g < GROUPS; g++)
            groups[g] = _mm512_mask_add_epi8(groups[g], (__mmask64)planes[p * GROUPS + g], groups[g], bit);
    }
}

/* acc + the VNNI product of `group` with the four codes at `codes` broadcast, the broadcast folded
 * into the instruction's memory operand (GCC keeps a separate broadcast for the intrinsics). */
ALWAYS_INLINE __m512i dpbusd_broadcast(__m512i acc, __m512i group, const int32_t *codes) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(group), "m"(*codes));
    return acc;
}

/* A tile's groups [from, to) against one row block's c1, or 254 c1 + c2 with two `levels`, per output. */
ALWAYS_INLINE __m512i block_dot(const __m512i groups[GROUPS], const int8_t *codes, const int from, const int to,
                                const int levels) {
    const int32_t *c1 = (const int32_t *)codes, *c2 = (const int32_t *)(codes + BLOCK);
    __m512i first = _mm512_setzero_si512(), second = _mm512_setzero_si512();
    for (int g = from; g < to; g++) {
        first = dpbusd_broadcast(first, groups[g], c1 + g);
        if (levels == 2) second = dpbusd_broadcast(second, groups[g], c2 + g);
    }
    if (levels == 1) return first;
    return _mm512_add_epi32(_mm512_mullo_epi32(first, _mm512_set1_epi32(FINER)), second);
}

/* `count` rows' dots with a tile's groups [from, to) of one block (`block_dot`'s), one accumulator
 * per row and the rows' products interleaved, so that no row waits on another's. */
ALWAYS_INLINE void rows_dot(const __m512i groups[GROUPS], const int8_t *const codes[ROWS_PER_PASS], const int count,
                            const int from, const int to, const int levels, __m512i dots[ROWS_PER_PASS]) {
    if (levels == 2) {
        for (int r = 0; r < count; r++) dots[r] = block_dot(groups, codes[r], from, to, levels);
        return;
    }
#pragma GCC unroll 8
    for (int r = 0; r < count; r++) dots[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int g = from; g < to; g++) {
#pragma GCC unroll 8
        for (int r = 0; r < count; r++) dots[r] = dpbusd_broadcast(dots[r], groups[g], (const int32_t *)codes[r] + g);
    }
}

/* 16 outputs' factors from `at`, float16 (`half`) or float32. */
ALWAYS_INLINE __m512 load_factors(const void *factors, int64_t at, int half) {
    if (half) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)factors + at)));
    return _mm512_loadu_ps((const float *)factors + at);
}

/* 16 outputs' `factor` times their integers at `at` (exact in float32), or `factor` where there are none. */
ALWAYS_INLINE __m512 times_integers(__m512 factor, const int8_t *integers, int64_t at) {
    if (integers == NULL) return factor;
    __m128i small = _mm_loadu_si128((const __m128i *)(integers + at));
    return _mm512_mul_ps(factor, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(small)));
}

/* 16 outputs' scales (or offsets) of one sub-block: the factors at `factor_at` times the integers
 * at `integer_at`. */
ALWAYS_INLINE __m512 factored(const void *factors, const int8_t *integers, int half, int64_t factor_at,
                              int64_t integer_at) {
    return times_integers(load_factors(factors, factor_at, half), integers, integer_at);
}

/* Where tile `tile`'s factors (`*factor_at`) and integers (`*integer_at`) of the sub-block holding
 * input `input` lie. */
static inline void scale_at(const BlockWeights *w, int64_t tile, int64_t input, int64_t *factor_at,
                            int64_t *integer_at) {
    int super_shift = __builtin_ctz((unsigned)w->super_block), sub_shift = __builtin_ctz((unsigned)w->sub_block);
    *factor_at = ((tile * (w->in_features >> super_shift)) + (input >> super_shift)) * TILE;
    *integer_at = ((tile * (w->in_features >> sub_shift)) + (input >> sub_shift)) * TILE;
}

/* One sub-block's term added to a row's sums: step * (scale * dot + offset * code_sum), with
 * `*sum_term` = step * code_sum. */
ALWAYS_INLINE __m512 add_term(__m512 sums, __m512i dot, int32_t code_sum, const float *sum_term, const float *step,
                              __m512 scales, __m512 offsets, const int center, const int has_offsets) {
    if (has_offsets)
        sums = _mm512_fmadd_ps(offsets, _mm512_set1_ps(*sum_term), sums);
    else
        dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(center * code_sum));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scales, _mm512_set1_ps(*step)), sums);
}

/* `count` rows of x from `first` against one tile of 16 outputs. */
ALWAYS_INLINE void tile_rows(const Product *p, int64_t tile, int64_t first, const int count, const int bits,
                             const int sub_block, const int has_offsets, const int levels) {
    const BlockWeights *w = p->w;
    const int center = w->center, subs = BLOCK / sub_block, half = w->half_factors;
    const int super_shift = __builtin_ctz((unsigned)w->super_block);
    const int64_t factor_base = tile * (w->in_features >> super_shift) * TILE, integer_base = tile * p->blocks * subs * TILE;
    __m512 scale_factor = _mm512_setzero_ps(), offset_factor = _mm512_setzero_ps(), sums[ROWS_PER_PASS];
    for (int r = 0; r < count; r++) sums[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < p->blocks; b++) {
        __m512i groups[GROUPS];
        load_groups(w, p->blocks, tile, b, bits, groups);
        __m512 scales[2], offsets[2];
        if (w->scale_integers != NULL && ((b * BLOCK) & (w->super_block - 1)) == 0) { /* one per super-block */
            int64_t factor_at = factor_base + ((b * BLOCK) >> super_shift) * TILE;
            scale_factor = load_factors(w->scale_factors, factor_at, half);
            if (has_offsets) offset_factor = load_factors(w->offset_factors, factor_at, half);
        }
        for (int s = 0; s < subs; s++) {
            int64_t factor_at = factor_base + ((b * BLOCK + s * sub_block) >> super_shift) * TILE;
            int64_t integer_at = integer_base + (b * subs + s) * TILE;
            if (w->scale_integers != NULL) {
                scales[s] = times_integers(scale_factor, w->scale_integers, integer_at);
                offsets[s] = times_integers(offset_factor, w->offset_integers, integer_at);
            } else {
                scales[s] = load_factors(w->scale_factors, factor_at, half);
                offsets[s] = has_offsets ? load_factors(w->offset_factors, factor_at, half) : _mm512_setzero_ps();
            }
        }
        const int8_t *codes[ROWS_PER_PASS];
#pragma GCC unroll 8
        for (int r = 0; r < count; r++) codes[r] = p->codes + ((first + r) * p->blocks + b) * 2 * BLOCK;
#pragma GCC unroll 2
        for (int s = 0; s < subs; s++) {
            __m512i dots[ROWS_PER_PASS];
            rows_dot(groups, codes, count, s * GROUPS / subs, (s + 1) * GROUPS / subs, levels, dots);
#pragma GCC unroll 8
            for (int r = 0; r < count; r++) {
                int64_t row_block = (first + r) * p->blocks + b;
                const int32_t *code_sums = p->code_sums + 2 * row_block;
                int32_t code_sum = has_offsets ? 0 : subs == 1 ? code_sums[0] + code_sums[1] : code_sums[s];
                const float *sum_term = p->sum_terms + 3 * row_block + (subs == 1 ? 2 : s);
                sums[r] = add_term(sums[r], dots[r], code_sum, sum_term, p->steps + row_block, scales[s], offsets[s],
                                   center, has_offsets);
            }
        }
    }
    int64_t left = w->out_features - tile * TILE;
    __mmask16 keep = left >= TILE ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    for (int r = 0; r < count; r++) {
        int64_t at = (first + r) * p->out_stride + tile * TILE;
        if (p->bf16)
            _mm256_mask_storeu_epi16((uint16_t *)p->out + at, keep, (__m256i)_mm512_cvtneps_pbh(sums[r]));
        else
            _mm512_mask_storeu_ps((float *)p->out + at, keep, sums[r]);
    }
}

/* Every row of x against tile t, a pass of up to 8 rows at a time: one function per weight kind
 * and levels, with the row count a constant in each pass so the sums stay in registers. */
#define TILE_FUNCTION(name, bits, sub_block, has_offsets, levels)                                     \
    static void name(const Product *p, int64_t t, int64_t rows) {                                      \
        for (int64_t first = 0; first < rows; first += ROWS_PER_PASS) {                               \
            int n = rows - first < ROWS_PER_PASS ? (int)(rows - first) : ROWS_PER_PASS;               \
            switch (n) {                                                                               \
            case 1: tile_rows(p, t, first, 1, bits, sub_block, has_offsets, levels); break;            \
            case 2: tile_rows(p, t, first, 2, bits, sub_block, has_offsets, levels); break;            \
            case 3: tile_rows(p, t, first, 3, bits, sub_block, has_offsets, levels); break;            \
            case 4: tile_rows(p, t, first, 4, bits, sub_block, has_offsets, levels); break;            \
            case 5: tile_rows(p, t, first, 5, bits, sub_block, has_offsets, levels); break;            \
            case 6: tile_rows(p, t, first, 6, bits, sub_block, has_offsets, levels); break;            \
            case 7: tile_rows(p, t, first, 7, bits, sub_block, has_offsets, levels); break;            \
            default: tile_rows(p, t, first, 8, bits, sub_block, has_offsets, levels); break;           \
            }                                                                                          \
        }                                                                                              \
    }

#define KIND(bits, sub_block)                                            \
    TILE_FUNCTION(tile_##bits##_##sub_block##_c1, bits, sub_block, 0, 1) \
    TILE_FUNCTION(tile_##bits##_##sub_block##_o1, bits, sub_block, 1, 1) \
    TILE_FUNCTION(tile_##bits##_##sub_block##_c2, bits, sub_block, 0, 2) \
    TILE_FUNCTION(tile_##bits##_##sub_block##_o2, bits, sub_block, 1, 2)
KIND(4, 32)
KIND(4, 16)
KIND(5, 32)
KIND(5, 16)
KIND(6, 32)
KIND(6, 16)
KIND(8, 32)
KIND(8, 16)

#define PICK(bits, sub_block)                                                                     \
    (w->offset_factors ? (levels == 1 ? tile_##bits##_##sub_block##_o1 : tile_##bits##_##sub_block##_o2) \
                       : (levels == 1 ? tile_##bits##_##sub_block##_c1 : tile_##bits##_##sub_block##_c2))

static TileFn tile_function(const BlockWeights *w, int levels) {
    int fine = w->sub_block == HALF;
    switch (w->bits) {
    case 4: return fine ? PICK(4, 16) : PICK(4, 32);
    case 5: return fine ? PICK(5, 16) : PICK(5, 32);
    case 6: return fine ? PICK(6, 16) : PICK(6, 32);
    case 8: return fine ? PICK(8, 16) : PICK(8, 32);
    default: return NULL;
    }
}

/* One tile's block of weights, [16 outputs][32 inputs] from row `tile * 16` and column `b * 32`. */
static void dequantize_block(const BlockWeights *w, int64_t blocks, int64_t tile, int64_t b, int bf16, void *out) {
    __m512i groups[GROUPS];
    switch (w->bits) {
    case 4: load_groups(w, blocks, tile, b, 4, groups); break;
    case 5: load_groups(w, blocks, tile, b, 5, groups); break;
    case 6: load_groups(w, blocks, tile, b, 6, groups); break;
    default: load_groups(w, blocks, tile, b, 8, groups); break;
    }
    /* the groups' 8 x 16 four-code lanes turned to 16 outputs' 32 codes: after two unpacks, 128-bit
     * lane L of halves[j] holds output 4 L + j's inputs 0-15, of halves[4 + j] its inputs 16-31 */
    uint8_t halves[GROUPS][64] __attribute__((aligned(64)));
    for (int q = 0; q < 2; q++) {
        const __m512i *g = groups + 4 * q;
        __m512i low01 = _mm512_unpacklo_epi32(g[0], g[1]), high01 = _mm512_unpackhi_epi32(g[0], g[1]);
        __m512i low23 = _mm512_unpacklo_epi32(g[2], g[3]), high23 = _mm512_unpackhi_epi32(g[2], g[3]);
        _mm512_store_si512(halves[4 * q + 0], _mm512_unpacklo_epi64(low01, low23));
        _mm512_store_si512(halves[4 * q + 1], _mm512_unpackhi_epi64(low01, low23));
        _mm512_store_si512(halves[4 * q + 2], _mm512_unpacklo_epi64(high01, high23));
        _mm512_store_si512(halves[4 * q + 3], _mm512_unpackhi_epi64(high01, high23));
    }
    int64_t left = w->out_features - tile * TILE;
    float scales[2][TILE], offsets[2][TILE];
    for (int h = 0; h < 2; h++) {
        int64_t factor_at, integer_at;
        scale_at(w, tile, b * BLOCK + h * HALF, &factor_at, &integer_at);
        __m512 scale = factored(w->scale_factors, w->scale_integers, w->half_factors, factor_at, integer_at);
        _mm512_storeu_ps(scales[h], scale);
        _mm512_storeu_ps(offsets[h], w->offset_factors ? factored(w->offset_factors, w->offset_integers,
                                                                  w->half_factors, factor_at, integer_at)
                                                       : _mm512_mul_ps(scale, _mm512_set1_ps(-(float)w->center)));
    }
    for (int o = 0; o < TILE && o < left; o++) {
        for (int h = 0; h < 2; h++) {
            __m512 scale = _mm512_set1_ps(scales[h][o]), offset = _mm512_set1_ps(offsets[h][o]);
            __m128i part = _mm_load_si128((const __m128i *)(halves[4 * h + o % 4] + 16 * (o / 4)));
            __m512 value = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(part)), scale, offset);
            int64_t index = (tile * TILE + o) * w->in_features + b * BLOCK + h * HALF;
            if (bf16)
                _mm256_storeu_si256((__m256i *)((uint16_t *)out + index), (__m256i)_mm512_cvtneps_pbh(value));
            else
                _mm512_storeu_ps((float *)out + index, value);
        }
    }
}
