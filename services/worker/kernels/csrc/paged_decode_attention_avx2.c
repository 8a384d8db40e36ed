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
 * head_dim a multiple of 8, at most 256.
 */
#include <math.h>
#include <stdlib.h>

#include "f32_simd.h"

#define TOKENS_PER_TILE 8
#define MAX_PARTS 64        /* threads one row's keys may be split among */
#define SPLIT_MIN_KEYS 128  /* shorter rows are not worth splitting */
#define MAX_DIM 256
#define HEADS_PER_PASS 4    /* query heads whose value sums share a pass over a key head's values */
#define VALUES_AHEAD 8      /* how far ahead of the value row in use the next ones are fetched */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef struct {
    const float *q, *keys, *values;
    const int64_t *tables;
    int width, heads, kv_heads, head_dim, block_size;
    float scale;
    float *out;
} Decode;

static const float ZERO_ROW[MAX_DIM];  /* stands in for the missing keys of a partial tile */

/* Key or value `j` of a row, every key head of it: where its block table puts it in the pool. */
ALWAYS_INLINE const float *token_row(const float *pool, const int64_t *table, int64_t j, int block_size,
                                     int64_t token_stride) {
    return pool + (table[j / block_size] * block_size + j % block_size) * token_stride;
}

ALWAYS_INLINE void prefetch(const float *row, int64_t elements) {
    for (int64_t b = 0; b < elements * 4; b += 64) _mm_prefetch((const char *)row + b, _MM_HINT_T0);
}

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

/* Each head's scores become e^(score - top) in place; each head's top and sum go to `tops` and
 * `totals`. The padding is -inf, so it weighs 0. */
static inline void span_softmax(float *scores, int heads, int64_t padded, float *tops, float *totals) {
    for (int i = 0; i < heads; i++) {
        float *s = scores + i * padded;
        __m256 top = _mm256_set1_ps(-INFINITY);
        for (int64_t j = 0; j < padded; j += TOKENS_PER_TILE) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j));
        tops[i] = max8f(top);
        __m256 highest = _mm256_set1_ps(tops[i]), total = _mm256_setzero_ps();
        for (int64_t j = 0; j < padded; j += TOKENS_PER_TILE) {
            __m256 scores8 = _mm256_loadu_ps(s + j);
            __m256 e = exp8(_mm256_sub_ps(scores8, highest));
            e = _mm256_and_ps(e, _mm256_cmp_ps(scores8, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
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

/* acc[head] = sum over keys [begin, end) of weight * v, a few heads of a key head per pass over its values. */
ALWAYS_INLINE void span_values(const float *values, const int64_t *table, int64_t begin, int64_t end, int heads,
                               int kv_heads, int head_dim, int block_size, int64_t padded, const float *weights,
                               float *acc) {
    int group = heads / kv_heads, per_pass = 16 / (head_dim / 8);  /* AVX2 has 16 registers */
    per_pass = per_pass > HEADS_PER_PASS ? HEADS_PER_PASS : per_pass < 1 ? 1 : per_pass;
    int64_t token_stride = (int64_t)kv_heads * head_dim;
    for (int i = 0; i < heads;) {
        int count = group - i % group < per_pass ? group - i % group : per_pass;
        int kv_offset = (i / group) * head_dim;
#define VALUES_OF(n) heads_values(values, table, begin, end, kv_offset, token_stride, block_size, head_dim, i, n, \
                                  padded, weights, acc)
        switch (count) {  /* a constant count keeps the sums in registers */
        case 1: VALUES_OF(1); break;
        case 2: VALUES_OF(2); break;
        case 3: VALUES_OF(3); break;
        default: VALUES_OF(4); break;
        }
#undef VALUES_OF
        i += count;
    }
}

/* One row's keys [begin, end): its part's tops, totals and unnormalized sums of values. */
ALWAYS_INLINE void attend_span(const float *q, const float *keys, const float *values, const int64_t *table,
                               int64_t begin, int64_t end, int heads, int kv_heads, int head_dim, int block_size,
                               float scale, float *scores, float *tops, float *totals, float *acc) {
    int64_t padded = (end - begin + TOKENS_PER_TILE - 1) / TOKENS_PER_TILE * TOKENS_PER_TILE;
    span_scores(q, keys, table, begin, end, heads, kv_heads, head_dim, block_size, scale, padded, scores);
    span_softmax(scores, heads, padded, tops, totals);
    span_values(values, table, begin, end, heads, kv_heads, head_dim, block_size, padded, scores, acc);
}

static void attend_part(const Decode *d, int row, int64_t begin, int64_t end, float *scores, float *tops,
                        float *totals, float *acc) {
    const float *q = d->q + (int64_t)row * d->heads * d->head_dim;
    const int64_t *table = d->tables + (int64_t)row * d->width;
    /* head_dim as a constant where it is a common one, so the inner loops unroll */
    if (d->head_dim == 64)
        attend_span(q, d->keys, d->values, table, begin, end, d->heads, d->kv_heads, 64, d->block_size, d->scale,
                    scores, tops, totals, acc);
    else if (d->head_dim == 128)
        attend_span(q, d->keys, d->values, table, begin, end, d->heads, d->kv_heads, 128, d->block_size,
                    d->scale, scores, tops, totals, acc);
    else
        attend_span(q, d->keys, d->values, table, begin, end, d->heads, d->kv_heads, d->head_dim, d->block_size,
                    d->scale, scores, tops, totals, acc);
}

/* out = the parts' sums of values, each rescaled to the highest top, over their rescaled totals. */
static void finish_row(const Decode *d, int row, int parts, const float *tops, const float *totals,
                       const float *acc) {
    int heads = d->heads, dim = d->head_dim;
    float *out = d->out + (int64_t)row * heads * dim;
    for (int i = 0; i < heads; i++) {
        float highest = -INFINITY, total = 0.f;
        for (int p = 0; p < parts; p++) highest = tops[p * heads + i] > highest ? tops[p * heads + i] : highest;
        float factors[MAX_PARTS];
        for (int p = 0; p < parts; p++) {
            factors[p] = totals[p * heads + i] > 0.f ? expf(tops[p * heads + i] - highest) : 0.f;
            total += factors[p] * totals[p * heads + i];
        }
        for (int c = 0; c < dim; c++) {
            float sum = 0.f;
            for (int p = 0; p < parts; p++) sum += factors[p] * acc[((int64_t)p * heads + i) * dim + c];
            out[(int64_t)i * dim + c] = sum / total;
        }
    }
}

static int valid(const int64_t *tables, const int64_t *lens, int rows, int width, int block_size,
                 int64_t pool_blocks, int64_t *longest) {
    for (int r = 0; r < rows; r++) {
        if (lens[r] < 1 || lens[r] > (int64_t)width * block_size) return 0;
        for (int64_t b = 0; b < (lens[r] + block_size - 1) / block_size; b++)
            if (tables[(int64_t)r * width + b] < 0 || tables[(int64_t)r * width + b] >= pool_blocks) return 0;
        *longest = lens[r] > *longest ? lens[r] : *longest;
    }
    return 1;
}

int paged_decode_attention_f32(const float *q, const float *keys, const float *values, int64_t pool_blocks,
                               const int64_t *tables, const int64_t *lens, int rows, int width, int heads,
                               int kv_heads, int head_dim, int block_size, float scale, float *out,
                               int num_threads) {
    int64_t longest = 0;
    if (head_dim % 8 != 0 || head_dim > MAX_DIM || heads % kv_heads != 0 || rows < 1 || block_size < 1
        || !valid(tables, lens, rows, width, block_size, pool_blocks, &longest))
        return 1;
    Decode d = {q, keys, values, tables, width, heads, kv_heads, head_dim, block_size, scale, out};
    num_threads = num_threads < 1 ? 1 : num_threads > MAX_PARTS ? MAX_PARTS : num_threads;
    /* fewer rows than threads over long contexts: each row's keys split among the threads */
    int parts = rows < num_threads && longest >= SPLIT_MIN_KEYS ? num_threads : 1;
    int64_t part_keys = (longest + parts - 1) / parts;
    size_t scores_floats = (size_t)heads * (part_keys + 2 * TOKENS_PER_TILE);
    /* each part's tops [MAX_PARTS][heads], totals [MAX_PARTS][heads] and sums [MAX_PARTS][heads * head_dim] */
    float *shared = malloc(sizeof(float) * (size_t)heads * (head_dim + 2) * MAX_PARTS);
    float *tops = shared, *totals = shared + heads * MAX_PARTS, *sums = shared + 2 * heads * MAX_PARTS;
    int failed = shared == NULL ? 2 : 0;
#pragma omp parallel num_threads(rows > 1 || parts > 1 ? num_threads : 1) if (!failed)
    {
        float *scores = malloc(sizeof(float) * (scores_floats + (size_t)heads * (head_dim + 2)));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 2;
        }
        float *own = scores + scores_floats;  /* tops, totals and sums of a row that is not split */
        if (parts == 1) {
#pragma omp for schedule(dynamic, 1)
            for (int r = 0; r < rows; r++)
                if (scores != NULL) {
                    attend_part(&d, r, 0, lens[r], scores, own, own + heads, own + 2 * heads);
                    finish_row(&d, r, 1, own, own + heads, own + 2 * heads);
                }
        } else {
            for (int r = 0; r < rows; r++) {
                int64_t chunk = (lens[r] + parts - 1) / parts;
                chunk = (chunk + TOKENS_PER_TILE - 1) / TOKENS_PER_TILE * TOKENS_PER_TILE;
#pragma omp for schedule(static, 1)
                for (int p = 0; p < parts; p++) {
                    int64_t begin = p * chunk, end = begin + chunk < lens[r] ? begin + chunk : lens[r];
                    if (begin < end && scores != NULL) {
                        attend_part(&d, r, begin, end, scores, tops + p * heads, totals + p * heads,
                                    sums + (size_t)p * heads * head_dim);
                    } else {  /* an empty part weighs nothing */
                        for (int i = 0; i < heads; i++) tops[p * heads + i] = -INFINITY, totals[p * heads + i] = 0.f;
                    }
                }
#pragma omp single
                finish_row(&d, r, parts, tops, totals, sums);
            }
        }
        free(scores);
    }
    free(shared);
    return failed;
}
