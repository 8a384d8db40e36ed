/* Decode attention over a paged KV cache on CPU, float32, with AVX2 and FMA: `paged_decode_attention.c`
 * for float32 pools on CPUs with or without AVX-512.
 *
 * Each decode row has one query per head and attends to its `len` cached keys, found through its
 * block table, read where they lie (no gathered copy): query-key dots summed in float32, eight keys'
 * dots finished together, a float32 softmax, and the weighted values summed in float32, each value
 * row loaded once for the query heads that share it. A row with fewer rows than threads over a long
 * context has its keys split among the threads, the parts' sums joined by their softmax tops.
 *
 * The arguments and statuses are `paged_decode_attention_bf16`'s, float32 for q, the pools and out;
 * head_dim a multiple of 8, at most 256. The split among threads and the join of a row's parts are
 * shared with the bfloat16 kernel (`paged_decode.h`).
 */
#include "f32_simd.h"

#define TOKENS_PER_TILE 8
#define VALUES_AHEAD 8      /* how far ahead of the value row in use the next ones are fetched */
#define VALUE_LANES 8
#define ELEMENT float

#include "paged_decode.h"

static const float ZERO_ROW[MAX_DIM];  /* stands in for the missing keys of a partial tile */

/* Lane t of the result is the sum of v[t]'s eight lanes: eight dot products finished at once. */
static inline __m256 sum_lanes8(const __m256 v[8]) {
    __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
    __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);  /* per 128-bit half: 0-3 | 4-7 */
    __m256 low = _mm256_permute2f128_ps(ab, cd, 0x20), high = _mm256_permute2f128_ps(ab, cd, 0x31);
    return _mm256_add_ps(low, high);
}

/* scores[head][key - begin] = scale * q[head] . k[key] for keys [begin, end), a tile of 8 keys at a
 * time; a partial last tile is padded with -inf. */
ALWAYS_INLINE void span_scores(const float *q, const float *keys, const int64_t *table, int64_t begin,
                               int64_t end, int heads, int kv_heads, int head_dim, int block_size, float scale,
                               int64_t padded, float *scores) {
    int group = heads / kv_heads;
    int64_t token_stride = (int64_t)kv_heads * head_dim;
    for (int64_t j0 = begin; j0 < end; j0 += TOKENS_PER_TILE) {
        int n = end - j0 < TOKENS_PER_TILE ? (int)(end - j0) : TOKENS_PER_TILE;
        const float *rows[TOKENS_PER_TILE];
        for (int t = 0; t < TOKENS_PER_TILE; t++)
            rows[t] = t < n ? token_row(keys, table, j0 + t, block_size, token_stride) : NULL;
        for (int64_t j = j0 + TOKENS_PER_TILE; j < end && j < j0 + 2 * TOKENS_PER_TILE; j++)
            prefetch(token_row(keys, table, j, block_size, token_stride), token_stride);
        __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256 present = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes));
        for (int i = 0; i < heads; i++) {
            const float *qh = q + (int64_t)i * head_dim;
            int64_t kv_offset = (int64_t)(i / group) * head_dim;
            __m256 dots[TOKENS_PER_TILE];
            for (int t = 0; t < TOKENS_PER_TILE; t++) {
                const float *k = rows[t] ? rows[t] + kv_offset : ZERO_ROW;
                __m256 sum = _mm256_setzero_ps();
                for (int c = 0; c < head_dim; c += 8)
                    sum = _mm256_fmadd_ps(_mm256_loadu_ps(qh + c), _mm256_loadu_ps(k + c), sum);
                dots[t] = sum;
            }
            __m256 s = _mm256_mul_ps(sum_lanes8(dots), _mm256_set1_ps(scale));
            _mm256_storeu_ps(scores + i * padded + (j0 - begin), _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, present));
        }
    }
}

/* Each head's scores become e^(score - top) in place, `count` of them; each head's top and sum go to
 * `tops` and `totals`. The padding past `count` weighs 0. */
static inline void span_softmax(float *scores, int heads, int64_t count, int64_t padded, float *tops, float *totals) {
    __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int i = 0; i < heads; i++) {
        float *s = scores + i * padded;
        __m256 top = _mm256_set1_ps(-INFINITY);
        for (int64_t j = 0; j < padded; j += TOKENS_PER_TILE) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j));
        tops[i] = max8f(top);
        __m256 highest = _mm256_set1_ps(tops[i]), total = _mm256_setzero_ps();
        for (int64_t j = 0; j < padded; j += TOKENS_PER_TILE) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), highest));
            __m256i present = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(count - j)), lanes);
            e = _mm256_and_ps(e, _mm256_castsi256_ps(present));
            _mm256_storeu_ps(s + j, e);
            total = _mm256_add_ps(total, e);
        }
        totals[i] = sum8f(total);
    }
}

/* acc[head] = sum over keys [begin, end) of weight * v for `count` heads from `first`, which share
 * one key head: each value row loaded once for all of them, the sums kept in registers. */
ALWAYS_INLINE void heads_values(const float *values, const int64_t *table, int64_t begin, int64_t end,
                                int kv_offset, int64_t token_stride, int block_size, int head_dim, int first,
                                const int count, int64_t padded, const float *weights, float *acc) {
    __m256 sums[HEADS_PER_PASS][MAX_DIM / 8];
    for (int h = 0; h < count; h++)
        for (int c = 0; c < head_dim / 8; c++) sums[h][c] = _mm256_setzero_ps();
    const float *w = weights + (int64_t)first * padded - begin;
    for (int64_t j = begin; j < end; j++) {
        if (j + VALUES_AHEAD < end)
            prefetch(token_row(values, table, j + VALUES_AHEAD, block_size, token_stride) + kv_offset, head_dim);
        const float *v = token_row(values, table, j, block_size, token_stride) + kv_offset;
        for (int c = 0; c < head_dim / 8; c++) {
            __m256 row = _mm256_loadu_ps(v + 8 * c);
            for (int h = 0; h < count; h++)
                sums[h][c] = _mm256_fmadd_ps(_mm256_set1_ps(w[h * padded + j]), row, sums[h][c]);
        }
    }
    for (int h = 0; h < count; h++)
        for (int c = 0; c < head_dim / 8; c++)
            _mm256_storeu_ps(acc + (int64_t)(first + h) * head_dim + 8 * c, sums[h][c]);
}

static inline ELEMENT to_output(float value) { return value; }

int paged_decode_attention_f32(const float *q, const float *keys, const float *values, int64_t pool_blocks,
                               const int64_t *tables, const int64_t *lens, int rows, int width, int heads,
                               int kv_heads, int head_dim, int block_size, float scale, float *out,
                               int num_threads) {
    if (head_dim % 8 != 0 || head_dim > MAX_DIM) return 1;
    Decode d = {q, keys, values, tables, width, heads, kv_heads, head_dim, block_size, scale, out};
    return decode_rows(&d, lens, rows, pool_blocks, num_threads);
}
