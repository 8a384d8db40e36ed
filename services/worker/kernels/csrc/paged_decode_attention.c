/* Decode attention over a paged KV cache on CPU, bfloat16, reading the blocks where they lie.
 *
 * Each decode row has one query per head and attends to its `len` cached keys, found through its
 * block table. torch's path copies every row's blocks into a contiguous buffer, layer by layer,
 * then runs SDPA over the copy; this kernel reads each block once, in place: query-key dots with
 * AVX512-BF16 (bfloat16 products summed in float32, as a bfloat16 GEMM sums them; sixteen keys'
 * dots finished together), a float32 softmax, and the weighted values summed in float32, each
 * value row widened once for the query heads that share it. Blocks lie anywhere in the pool, so
 * the next tile's rows are prefetched. Rows are shared among the OpenMP threads of
 * the runtime torch itself loaded (same soname), so they are torch's intra-op threads.
 *
 * Layout: q [rows, heads, head_dim]; pools [blocks, block_size, kv_heads, head_dim]; tables
 * [rows, width] int64 (padding past a row's blocks is never read; the rest must be below pool_blocks);
 * lens [rows] int64 (>= 1);
 * out [rows, heads, head_dim]. head_dim must be a multiple of 32. Returns 0, or non-zero when it
 * cannot run (the caller then falls back to torch). The split among threads and the join of a row's
 * parts are shared with the float32 kernel (`paged_decode.h`).
 */
#include "bf16_simd.h"

#define TOKENS_PER_TILE 16
#define VALUES_AHEAD 16     /* how far ahead of the value row in use the next ones are fetched */
#define VALUE_LANES 16
#define ELEMENT uint16_t

#include "paged_decode.h"

static const uint16_t ZERO_ROW[MAX_DIM];  /* stands in for the missing keys of a partial tile */

/* Lane t of the result is the sum of v[t]'s sixteen lanes: sixteen dot products finished at once. */
static inline __m512 sum_lanes16(const __m512 v[16]) {
    __m512 pairs[8], quads[4];
    for (int k = 0; k < 8; k++)  /* per 128-bit lane: v[2k] and v[2k+1], two lanes each */
        pairs[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                                 _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 4; k++)  /* per 128-bit lane: v[4k] .. v[4k+3], one lane each */
        quads[k] = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(pairs[2 * k]), _mm512_castps_pd(pairs[2 * k + 1]))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(pairs[2 * k]), _mm512_castps_pd(pairs[2 * k + 1]))));
    __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                               _mm512_shuffle_f32x4(quads[0], quads[1], 0xdd));
    __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                                _mm512_shuffle_f32x4(quads[2], quads[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xdd));
}

/* scores[head][key - begin] = scale * q[head] . k[key] for keys [begin, end) of one row, every head,
 * a tile of 16 keys at a time: each key's dot products summed in a vector of its own, the sixteen
 * finished together. A partial last tile is padded with -inf. */
static inline __attribute__((always_inline)) void span_scores(
        const uint16_t *q, const uint16_t *keys, const int64_t *table, int64_t begin, int64_t end, int heads,
        int kv_heads, int head_dim, int block_size, float scale, int64_t padded, float *scores) {
    int group = heads / kv_heads;
    int64_t token_stride = (int64_t)kv_heads * head_dim;
    for (int64_t j0 = begin; j0 < end; j0 += TOKENS_PER_TILE) {
        int n = end - j0 < TOKENS_PER_TILE ? (int)(end - j0) : TOKENS_PER_TILE;
        const uint16_t *rows[TOKENS_PER_TILE];
        for (int t = 0; t < TOKENS_PER_TILE; t++)
            rows[t] = t < n ? token_row(keys, table, j0 + t, block_size, token_stride) : NULL;
        for (int64_t j = j0 + TOKENS_PER_TILE; j < end && j < j0 + 2 * TOKENS_PER_TILE; j++)
            prefetch(token_row(keys, table, j, block_size, token_stride), token_stride);
        __mmask16 present = n == TOKENS_PER_TILE ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
        for (int i = 0; i < heads; i++) {
            const uint16_t *qh = q + (int64_t)i * head_dim;
            int64_t kv_offset = (int64_t)(i / group) * head_dim;
            __m512 dots[TOKENS_PER_TILE];
            for (int t = 0; t < TOKENS_PER_TILE; t++) {
                const uint16_t *k = rows[t] ? rows[t] + kv_offset : ZERO_ROW;
                __m512 sum = _mm512_setzero_ps();
                for (int c = 0; c < head_dim; c += 32)
                    sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_loadu_si512(qh + c),
                                           (__m512bh)_mm512_loadu_si512(k + c));
                dots[t] = sum;
            }
            __m512 s = _mm512_mul_ps(sum_lanes16(dots), _mm512_set1_ps(scale));
            _mm512_storeu_ps(scores + i * padded + (j0 - begin),
                             _mm512_mask_blend_ps(present, _mm512_set1_ps(-INFINITY), s));
        }
    }
}

/* Each head's scores become e^(score - top) in place, `count` of them; the top and the sum of each
 * head go to `tops` and `totals`. The padding past `count` is -inf, so it weighs 0. */
static inline void span_softmax(float *scores, int heads, int64_t count, int64_t padded, float *tops,
                                float *totals) {
    for (int i = 0; i < heads; i++) {
        float *s = scores + i * padded;
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < padded; j += TOKENS_PER_TILE) top = _mm512_max_ps(top, _mm512_loadu_ps(s + j));
        tops[i] = _mm512_reduce_max_ps(top);
        __m512 highest = _mm512_set1_ps(tops[i]), total = _mm512_setzero_ps();
        for (int64_t j = 0; j < padded; j += TOKENS_PER_TILE) {
            __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), highest));
            e = _mm512_maskz_mov_ps(j + TOKENS_PER_TILE <= count ? (__mmask16)0xffff
                                    : (__mmask16)((1u << (count - j)) - 1), e);
            _mm512_storeu_ps(s + j, e);
            total = _mm512_add_ps(total, e);
        }
        totals[i] = _mm512_reduce_add_ps(total);
    }
}

/* acc[head] = sum over keys [begin, end) of weight * v for `count` heads from `first`, which share
 * one key head: each value row is widened once for all of them, the sums kept in registers. */
static inline __attribute__((always_inline)) void heads_values(
        const uint16_t *values, const int64_t *table, int64_t begin, int64_t end, int kv_offset,
        int64_t token_stride, int block_size, int head_dim, int first, const int count, int64_t padded,
        const float *weights, float *acc) {
    __m512 sums[HEADS_PER_PASS][MAX_DIM / 16];
    for (int h = 0; h < count; h++)
        for (int c = 0; c < head_dim / 16; c++) sums[h][c] = _mm512_setzero_ps();
    const float *w = weights + (int64_t)first * padded - begin;
    for (int64_t j = begin; j < end; j++) {
        if (j + VALUES_AHEAD < end)
            prefetch(token_row(values, table, j + VALUES_AHEAD, block_size, token_stride) + kv_offset, head_dim);
        const uint16_t *v = token_row(values, table, j, block_size, token_stride) + kv_offset;
        for (int c = 0; c < head_dim / 16; c++) {
            __m512 wide = widen16(v + 16 * c);
            for (int h = 0; h < count; h++)
                sums[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(w[h * padded + j]), wide, sums[h][c]);
        }
    }
    for (int h = 0; h < count; h++)
        for (int c = 0; c < head_dim / 16; c++)
            _mm512_storeu_ps(acc + (int64_t)(first + h) * head_dim + 16 * c, sums[h][c]);
}

static inline ELEMENT to_output(float value) { return to_bf16(value); }

int paged_decode_attention_bf16(const uint16_t *q, const uint16_t *keys, const uint16_t *values,
                                int64_t pool_blocks, const int64_t *tables, const int64_t *lens, int rows,
                                int width, int heads, int kv_heads, int head_dim, int block_size, float scale,
                                uint16_t *out, int num_threads) {
    if (head_dim % 32 != 0 || head_dim > MAX_DIM) return 1;
    Decode d = {q, keys, values, tables, width, heads, kv_heads, head_dim, block_size, scale, out};
    return decode_rows(&d, lens, rows, pool_blocks, num_threads);
}
