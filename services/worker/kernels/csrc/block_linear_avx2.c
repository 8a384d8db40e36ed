/* `block_linear.c`'s products for CPUs with AVX2 and no AVX512-VNNI: the same weights
 * (`block_weights.h`), the same rounding of x's rows (one int8 level for bfloat16 rows, two for
 * float32) and the same float32 epilogue, operation for operation, so both give the same outputs.
 *
 * AVX2 has no VNNI: a group of four inputs for eight outputs is multiplied by `vpmaddubsw`
 * (unsigned weight codes times signed row codes, pairs summed to int16) and the pairs summed to
 * int32 by `vpmaddwd` against ones, as llama.cpp's AVX2 dot products do. The int16 pairs of several
 * groups are summed before that widening while they cannot overflow: codes of 4 bits leave room
 * for all eight groups of a block, 5 bits for four, 6 bits for two. 8-bit codes would overflow one
 * pair, so they are multiplied signed (code - 128, sign moved onto the row's code, llama.cpp's
 * trick) and 128 times the row's code sum added back, exact. A tile's 16 outputs are two halves of
 * eight, one 256-bit vector each.
 *
 * The interface is `block_linear.c`'s (`block_product.h`, which both include): `block_linear` and
 * `block_dequantize`, the same arguments and statuses; bfloat16 values are converted by hand
 * (rounded to nearest even).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_product.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "these kernels need AVX2, FMA and F16C: the worker keeps torch's layers"
#endif

#define LANES 8             /* outputs per vector: a tile is two halves */
#define ROWS_PER_PASS 4     /* rows of x sharing each loaded half-block of weights */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline __m256 load8(const void *row, int64_t at, int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)row + at);
    __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

static inline int32_t sum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline float max8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 8 int32 in [-127, 127] stored as int8 */
static inline void store_codes8(__m256i v, int8_t *out) {
    __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)out, _mm_packs_epi16(words, words));
}

/* `block_linear.c`'s round16 for 8 values: c1 (and with two levels c2 BLOCK further); the sum. */
static inline int32_t round8(__m256 x, __m256 inverse, int8_t *codes, int levels) {
    __m256i first = _mm256_cvtps_epi32(_mm256_mul_ps(x, inverse));
    store_codes8(first, codes);
    if (levels == 1) return sum8(first);
    __m256 left = _mm256_fmsub_ps(x, inverse, _mm256_cvtepi32_ps(first));
    __m256i second = _mm256_cvtps_epi32(_mm256_mul_ps(left, _mm256_set1_ps((float)FINER)));
    store_codes8(second, codes + BLOCK);
    return sum8(_mm256_add_epi32(_mm256_mullo_epi32(first, _mm256_set1_epi32(FINER)), second));
}

static void round_row(const void *x, int bf16, int levels, int64_t blocks, int8_t *codes, float *steps,
                      int32_t *sums, float *terms) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int64_t b = 0; b < blocks; b++) {
        __m256 v[4];
        __m256 largest = _mm256_setzero_ps();
        for (int q = 0; q < 4; q++) {
            v[q] = load8(x, b * BLOCK + q * LANES, bf16);
            largest = _mm256_max_ps(largest, _mm256_andnot_ps(sign, v[q]));
        }
        float top = max8(largest);
        __m256 inverse = _mm256_set1_ps(top > 0.f ? 127.f / top : 0.f);
        int8_t *block = codes + b * 2 * BLOCK;
        int32_t low = 0, high = 0;
        for (int q = 0; q < 4; q++) {
            int32_t s = round8(v[q], inverse, block + q * LANES, levels);
            if (q < 2) low += s; else high += s;
        }
        sums[2 * b] = low;
        sums[2 * b + 1] = high;
        steps[b] = levels == 1 ? top / 127.f : top / 127.f / (float)FINER;
        terms[3 * b] = steps[b] * (float)low;
        terms[3 * b + 1] = steps[b] * (float)high;
        terms[3 * b + 2] = steps[b] * (float)(low + high);
    }
}

/* 0xff in each byte of half `h` of a 64-byte group whose bit of the group's 64-bit `mask` is set
 * (byte i of the group: bit i), from the mask broadcast straight from memory. */
static inline __m256i mask_bytes(const uint64_t *mask, int h) {
    const __m256i spread_low = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i spread_high = _mm256_setr_epi8(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5,
                                                 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)*mask), h ? spread_high : spread_low);
    return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits);
}

/* The eight groups of one half (`h`: outputs 8h..8h+7) of a tile's block, codes of `bits`: for
 * 8 bits the codes - 128 as signed bytes, else the unsigned codes. */
ALWAYS_INLINE void load_groups(const BlockWeights *w, int64_t blocks, int64_t tile, int64_t b, int h, const int bits,
                               __m256i groups[GROUPS]) {
    int64_t at = tile * blocks + b;
    if (bits == 8) {
        const uint8_t *codes = w->codes + at * (BLOCK * TILE) + h * 32;
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        for (int g = 0; g < GROUPS; g++)
            groups[g] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(codes + g * 64)), flip);
        return;
    }
    const uint8_t *codes = w->codes + at * (BLOCK * TILE / 2) + h * 32;
    const __m256i nibbles = _mm256_set1_epi8(0x0f);
    for (int g = 0; g < GROUPS / 2; g++) {
        __m256i both = _mm256_loadu_si256((const __m256i *)(codes + g * 64));
        groups[g] = _mm256_and_si256(both, nibbles);
        groups[g + GROUPS / 2] = _mm256_and_si256(_mm256_srli_epi16(both, 4), nibbles);
    }
    const uint64_t *planes = w->planes + at * (bits - 4) * GROUPS;
    for (int p = 0; p < bits - 4; p++) {
        const __m256i bit = _mm256_set1_epi8((char)(16 << p));
        for (int g = 0; g < GROUPS; g++)
            groups[g] = _mm256_add_epi8(groups[g], _mm256_and_si256(mask_bytes(planes + p * GROUPS + g, h), bit));
    }
}

/* Groups whose int16 pair sums can be added before widening without overflow, by the codes' bits. */
#define PAIRS_FIT(bits) ((bits) == 4 ? 8 : (bits) == 5 ? 4 : (bits) == 6 ? 2 : 1)

/* The dot of groups [from, to) with one row block's codes (4 per group, as int32 at `codes`),
 * per output: for 8 bits the signed codes' dot (the caller adds 128 times the code sum). */
ALWAYS_INLINE __m256i codes_dot(const __m256i groups[GROUPS], const int32_t *codes, const int from, const int to,
                                const int bits) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i dot = _mm256_setzero_si256();
    for (int g = from; g < to; g += PAIRS_FIT(bits)) {
        __m256i pairs = _mm256_setzero_si256();
        for (int k = g; k < g + PAIRS_FIT(bits) && k < to; k++) {
            __m256i row = _mm256_set1_epi32(codes[k]);
            __m256i product = bits == 8 ? _mm256_maddubs_epi16(_mm256_abs_epi8(groups[k]), _mm256_sign_epi8(row, groups[k]))
                                        : _mm256_maddubs_epi16(groups[k], row);
            pairs = _mm256_add_epi16(pairs, product);
        }
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, ones));
    }
    return dot;
}

/* `block_linear.c`'s block_dot: c1's dot, or 254 c1's + c2's with two levels; `code_sum` (of the
 * levels' combined codes over the groups) puts 8-bit codes' 128 back. */
ALWAYS_INLINE __m256i block_dot(const __m256i groups[GROUPS], const int8_t *codes, const int from, const int to,
                                const int levels, const int bits, int32_t code_sum) {
    __m256i dot = codes_dot(groups, (const int32_t *)codes, from, to, bits);
    if (levels == 2)
        dot = _mm256_add_epi32(_mm256_mullo_epi32(dot, _mm256_set1_epi32(FINER)),
                               codes_dot(groups, (const int32_t *)(codes + BLOCK), from, to, bits));
    if (bits == 8) dot = _mm256_add_epi32(dot, _mm256_set1_epi32(128 * code_sum));
    return dot;
}

ALWAYS_INLINE __m256 load_factors(const void *factors, int64_t at, int half) {
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)factors + at)));
    return _mm256_loadu_ps((const float *)factors + at);
}

ALWAYS_INLINE __m256 times_integers(__m256 factor, const int8_t *integers, int64_t at) {
    if (integers == NULL) return factor;
    __m128i small = _mm_loadl_epi64((const __m128i *)(integers + at));
    return _mm256_mul_ps(factor, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(small)));
}

/* `block_linear.c`'s add_term, eight outputs. */
ALWAYS_INLINE __m256 add_term(__m256 sums, __m256i dot, int32_t code_sum, const float *sum_term, const float *step,
                              __m256 scales, __m256 offsets, const int center, const int has_offsets) {
    if (has_offsets)
        sums = _mm256_fmadd_ps(offsets, _mm256_set1_ps(*sum_term), sums);
    else
        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(center * code_sum));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scales, _mm256_set1_ps(*step)), sums);
}

/* float32 to bfloat16, rounded to nearest even (no NaN comes out of a product of finite values). */
static inline __m128i to_bf16(__m256 v) {
    __m256i bits = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
    return packed;
}

/* The first `left` (at most 8) of eight outputs' sums, written at `at` in the output's dtype. */
static void store_outputs(const Product *p, int64_t at, int64_t left, __m256 sums) {
    int n = left < LANES ? (int)left : LANES;
    if (p->bf16) {
        uint16_t words[LANES];
        _mm_storeu_si128((__m128i *)words, to_bf16(sums));
        memcpy((uint16_t *)p->out + at, words, sizeof(uint16_t) * (size_t)n);
    } else {
        float values[LANES];
        _mm256_storeu_ps(values, sums);
        memcpy((float *)p->out + at, values, sizeof(float) * (size_t)n);
    }
}

/* One half (`h`) of one block of a tile against `count` rows: the half's groups and scales, then
 * each row's sub-block terms added to `sums`. */
ALWAYS_INLINE void half_block(const Product *p, int64_t tile, int64_t b, int h, int64_t first, const int count,
                              const int bits, const int sub_block, const int has_offsets, const int levels,
                              __m256 *scale_factor, __m256 *offset_factor, __m256 sums[ROWS_PER_PASS]) {
    const BlockWeights *w = p->w;
    const int center = w->center, subs = BLOCK / sub_block, half = w->half_factors;
    const int super_shift = __builtin_ctz((unsigned)w->super_block);
    const int64_t factor_base = tile * (w->in_features >> super_shift) * TILE + h * LANES;
    const int64_t integer_base = tile * p->blocks * subs * TILE + h * LANES;
    __m256i groups[GROUPS];
    load_groups(w, p->blocks, tile, b, h, bits, groups);
    __m256 scales[2], offsets[2];
    if (w->scale_integers != NULL && ((b * BLOCK) & (w->super_block - 1)) == 0) { /* one per super-block */
        int64_t factor_at = factor_base + ((b * BLOCK) >> super_shift) * TILE;
        *scale_factor = load_factors(w->scale_factors, factor_at, half);
        if (has_offsets) *offset_factor = load_factors(w->offset_factors, factor_at, half);
    }
    for (int s = 0; s < subs; s++) {
        int64_t factor_at = factor_base + ((b * BLOCK + s * sub_block) >> super_shift) * TILE;
        int64_t integer_at = integer_base + (b * subs + s) * TILE;
        if (w->scale_integers != NULL) {
            scales[s] = times_integers(*scale_factor, w->scale_integers, integer_at);
            offsets[s] = times_integers(*offset_factor, w->offset_integers, integer_at);
        } else {
            scales[s] = load_factors(w->scale_factors, factor_at, half);
            offsets[s] = has_offsets ? load_factors(w->offset_factors, factor_at, half) : _mm256_setzero_ps();
        }
    }
    for (int r = 0; r < count; r++) {
        int64_t row_block = (first + r) * p->blocks + b;
        const int8_t *codes = p->codes + row_block * 2 * BLOCK;
        const int32_t *code_sums = p->code_sums + 2 * row_block;
        for (int s = 0; s < subs; s++) {
            int32_t code_sum = subs == 1 ? code_sums[0] + code_sums[1] : code_sums[s];
            __m256i dot = block_dot(groups, codes, s * GROUPS / subs, (s + 1) * GROUPS / subs, levels, bits, code_sum);
            const float *sum_term = p->sum_terms + 3 * row_block + (subs == 1 ? 2 : s);
            sums[r] = add_term(sums[r], dot, has_offsets ? 0 : code_sum, sum_term, p->steps + row_block, scales[s],
                               offsets[s], center, has_offsets);
        }
    }
}

/* `count` rows of x from `first` against tile `tile`, both halves of each block before the next
 * (each 64-byte line of codes holds both halves' bytes). */
ALWAYS_INLINE void tile_rows(const Product *p, int64_t tile, int64_t first, const int count, const int bits,
                             const int sub_block, const int has_offsets, const int levels) {
    __m256 factors[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    __m256 sums[2][ROWS_PER_PASS];
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < count; r++) sums[h][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < p->blocks; b++)
        for (int h = 0; h < 2; h++)
            half_block(p, tile, b, h, first, count, bits, sub_block, has_offsets, levels, &factors[h][0],
                       &factors[h][1], sums[h]);
    for (int h = 0; h < 2; h++) {
        int64_t left = p->w->out_features - tile * TILE - h * LANES;
        for (int r = 0; r < count && left > 0; r++)
            store_outputs(p, (first + r) * p->out_stride + tile * TILE + h * LANES, left, sums[h][r]);
    }
}

#define TILE_FUNCTION(name, bits, sub_block, has_offsets, levels)                                     \
    static void name(const Product *p, int64_t t, int64_t rows) {                                      \
        for (int64_t first = 0; first < rows; first += ROWS_PER_PASS) {                               \
            int n = rows - first < ROWS_PER_PASS ? (int)(rows - first) : ROWS_PER_PASS;               \
            switch (n) {                                                                               \
            case 1: tile_rows(p, t, first, 1, bits, sub_block, has_offsets, levels); break;            \
            case 2: tile_rows(p, t, first, 2, bits, sub_block, has_offsets, levels); break;            \
            case 3: tile_rows(p, t, first, 3, bits, sub_block, has_offsets, levels); break;            \
            default: tile_rows(p, t, first, 4, bits, sub_block, has_offsets, levels); break;           \
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

/* One half of a tile's block of weights as floats: output 8h + o's 32 inputs. */
static void dequantize_half(const BlockWeights *w, int64_t blocks, int64_t tile, int64_t b, int h, int bf16,
                            void *out) {
    __m256i groups[GROUPS];
    switch (w->bits) {
    case 4: load_groups(w, blocks, tile, b, h, 4, groups); break;
    case 5: load_groups(w, blocks, tile, b, h, 5, groups); break;
    case 6: load_groups(w, blocks, tile, b, h, 6, groups); break;
    default: load_groups(w, blocks, tile, b, h, 8, groups); break;
    }
    uint8_t lanes[GROUPS][32];
    for (int g = 0; g < GROUPS; g++) _mm256_storeu_si256((__m256i *)lanes[g], groups[g]);
    int super_shift = __builtin_ctz((unsigned)w->super_block), sub_shift = __builtin_ctz((unsigned)w->sub_block);
    int64_t left = w->out_features - tile * TILE - h * LANES;
    for (int o = 0; o < LANES && o < left; o++) {
        uint8_t codes[BLOCK];
        for (int g = 0; g < GROUPS; g++) memcpy(codes + 4 * g, lanes[g] + 4 * o, 4);
        if (w->bits == 8)
            for (int i = 0; i < BLOCK; i++) codes[i] ^= 0x80;  /* back to the stored unsigned codes */
        int64_t output = tile * TILE + h * LANES + o;
        for (int q = 0; q < 4; q++) {
            int64_t input = b * BLOCK + q * LANES;
            int64_t factor_at = ((tile * (w->in_features >> super_shift)) + (input >> super_shift)) * TILE + h * LANES + o;
            int64_t integer_at = ((tile * (w->in_features >> sub_shift)) + (input >> sub_shift)) * TILE + h * LANES + o;
            float scale = w->half_factors ? _cvtsh_ss(((const uint16_t *)w->scale_factors)[factor_at])
                                          : ((const float *)w->scale_factors)[factor_at];
            if (w->scale_integers != NULL) scale *= (float)w->scale_integers[integer_at];
            float offset;
            if (w->offset_factors != NULL) {
                offset = w->half_factors ? _cvtsh_ss(((const uint16_t *)w->offset_factors)[factor_at])
                                         : ((const float *)w->offset_factors)[factor_at];
                if (w->offset_integers != NULL) offset *= (float)w->offset_integers[integer_at];
            } else {
                offset = scale * -(float)w->center;
            }
            __m128i part = _mm_loadl_epi64((const __m128i *)(codes + q * LANES));
            __m256 value = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part)), _mm256_set1_ps(scale),
                                           _mm256_set1_ps(offset));
            int64_t index = output * w->in_features + input;
            if (bf16)
                _mm_storeu_si128((__m128i *)((uint16_t *)out + index), to_bf16(value));
            else
                _mm256_storeu_ps((float *)out + index, value);
        }
    }
}

static void dequantize_block(const BlockWeights *w, int64_t blocks, int64_t tile, int64_t b, int bf16, void *out) {
    for (int h = 0; h < 2; h++) dequantize_half(w, blocks, tile, b, h, bf16, out);
}
