/* What the decode attention kernels share beyond their instructions (`paged_decode_attention.c`,
 * bfloat16 with AVX512-BF16, and `paged_decode_attention_avx2.c`, float32 with AVX2): the step's
 * arguments (`Decode`), the checks of the tables, the split of rows (or of one long row's keys)
 * among the OpenMP threads, and the join of a row's parts into its output.
 *
 * The including kernel defines, before including it, `ELEMENT` (its q, pool and output type),
 * `TOKENS_PER_TILE` (the keys its scores take at a time) and `VALUE_LANES` (a vector's floats), and
 * after it the three passes over a row's keys (`span_scores`, `span_softmax`, `heads_values`) and
 * `to_output` (a float32 result as an ELEMENT); its exported function checks its own shapes and
 * calls `decode_rows`.
 */
#ifndef ZTGI_PAGED_DECODE_H
#define ZTGI_PAGED_DECODE_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_PARTS 64        /* threads one row's keys may be split among */
#define SPLIT_MIN_KEYS 128  /* shorter rows are not worth splitting */
#define MAX_DIM 256
#define HEADS_PER_PASS 4    /* query heads whose value sums share a pass over a key head's values */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef struct {
    const ELEMENT *q, *keys, *values;
    const int64_t *tables;
    int width, heads, kv_heads, head_dim, block_size;
    float scale;
    ELEMENT *out;
} Decode;

/* The kernel's: scores[head][key - begin] = scale * q[head] . k[key] for keys [begin, end), padded
 * to whole tiles with -inf; each head's scores as e^(score - top) in place, with its top and sum;
 * acc[head] = sum of weight * v over the keys for `count` heads from `first` that share a key head. */
ALWAYS_INLINE void span_scores(const ELEMENT *q, const ELEMENT *keys, const int64_t *table, int64_t begin,
                               int64_t end, int heads, int kv_heads, int head_dim, int block_size, float scale,
                               int64_t padded, float *scores);
static inline void span_softmax(float *scores, int heads, int64_t count, int64_t padded, float *tops, float *totals);
ALWAYS_INLINE void heads_values(const ELEMENT *values, const int64_t *table, int64_t begin, int64_t end,
                                int kv_offset, int64_t token_stride, int block_size, int head_dim, int first,
                                const int count, int64_t padded, const float *weights, float *acc);
static inline ELEMENT to_output(float value);

/* Key or value `j` of a row, every key head of it: where its block table puts it in the pool. */
ALWAYS_INLINE const ELEMENT *token_row(const ELEMENT *pool, const int64_t *table, int64_t j, int block_size,
                                       int64_t token_stride) {
    return pool + (table[j / block_size] * block_size + j % block_size) * token_stride;
}

/* Blocks lie anywhere in the pool, so the hardware cannot guess the next one: ask for it early. */
ALWAYS_INLINE void prefetch(const ELEMENT *row, int64_t elements) {
    for (int64_t b = 0; b < elements * (int64_t)sizeof(ELEMENT); b += 64)
        _mm_prefetch((const char *)row + b, _MM_HINT_T0);
}

/* acc[head] = sum over keys [begin, end) of weight * v, a few heads of a key head per pass over its values. */
ALWAYS_INLINE void span_values(const ELEMENT *values, const int64_t *table, int64_t begin, int64_t end, int heads,
                               int kv_heads, int head_dim, int block_size, int64_t padded, const float *weights,
                               float *acc) {
    int group = heads / kv_heads, per_pass = 16 / (head_dim / VALUE_LANES);  /* sums kept in 16 registers */
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
ALWAYS_INLINE void attend_span(const ELEMENT *q, const ELEMENT *keys, const ELEMENT *values, const int64_t *table,
                               int64_t begin, int64_t end, int heads, int kv_heads, int head_dim, int block_size,
                               float scale, float *scores, float *tops, float *totals, float *acc) {
    int64_t padded = (end - begin + TOKENS_PER_TILE - 1) / TOKENS_PER_TILE * TOKENS_PER_TILE;
    span_scores(q, keys, table, begin, end, heads, kv_heads, head_dim, block_size, scale, padded, scores);
    span_softmax(scores, heads, end - begin, padded, tops, totals);
    span_values(values, table, begin, end, heads, kv_heads, head_dim, block_size, padded, scores, acc);
}

static void attend_part(const Decode *d, int row, int64_t begin, int64_t end, float *scores, float *tops,
                        float *totals, float *acc) {
    const ELEMENT *q = d->q + (int64_t)row * d->heads * d->head_dim;
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
    ELEMENT *out = d->out + (int64_t)row * heads * dim;
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
            out[(int64_t)i * dim + c] = to_output(sum / total);
        }
    }
}

/* Whether every row's length is covered by its table and every block it reads is in the pool; the
 * longest length into `longest`. */
static int tables_valid(const int64_t *tables, const int64_t *lens, int rows, int width, int block_size,
                        int64_t pool_blocks, int64_t *longest) {
    for (int r = 0; r < rows; r++) {
        if (lens[r] < 1 || lens[r] > (int64_t)width * block_size) return 0;
        for (int64_t b = 0; b < (lens[r] + block_size - 1) / block_size; b++)
            if (tables[(int64_t)r * width + b] < 0 || tables[(int64_t)r * width + b] >= pool_blocks) return 0;
        *longest = lens[r] > *longest ? lens[r] : *longest;
    }
    return 1;
}

/* Every row of `d`, shared among the threads; a status (0: done, 1: refused, 2: out of memory). */
static int decode_rows(const Decode *d, const int64_t *lens, int rows, int64_t pool_blocks, int num_threads) {
    int heads = d->heads, head_dim = d->head_dim;
    int64_t longest = 0;
    if (heads % d->kv_heads != 0 || rows < 1 || d->block_size < 1
        || !tables_valid(d->tables, lens, rows, d->width, d->block_size, pool_blocks, &longest))
        return 1;
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
                    attend_part(d, r, 0, lens[r], scores, own, own + heads, own + 2 * heads);
                    finish_row(d, r, 1, own, own + heads, own + 2 * heads);
                }
        } else {
            for (int r = 0; r < rows; r++) {
                int64_t chunk = (lens[r] + parts - 1) / parts;
                chunk = (chunk + TOKENS_PER_TILE - 1) / TOKENS_PER_TILE * TOKENS_PER_TILE;
#pragma omp for schedule(static, 1)
                for (int p = 0; p < parts; p++) {
                    int64_t begin = p * chunk, end = begin + chunk < lens[r] ? begin + chunk : lens[r];
                    if (begin < end && scores != NULL) {
                        attend_part(d, r, begin, end, scores, tops + p * heads, totals + p * heads,
                                    sums + (size_t)p * heads * head_dim);
                    } else {  /* an empty part weighs nothing */
                        for (int i = 0; i < heads; i++) tops[p * heads + i] = -INFINITY, totals[p * heads + i] = 0.f;
                    }
                }
#pragma omp single
                finish_row(d, r, parts, tops, totals, sums);
            }
        }
        free(scores);
    }
    free(shared);
    return failed;
}

#endif
