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
 * cannot run (the caller then falls back to torch).
 */
#include <math.h>
#include <stdlib.h>

#include "bf16_simd.h"

#define TOKENS_PER_TILE 16
#define MAX_PARTS 64        /* threads one row's keys may be split among */
#define SPLIT_MIN_KEYS 128  /* shorter rows are not worth splitting */
#define MAX_DIM 256
#define HEADS_PER_PASS 4    /* query heads whose value sums share a pass over a key head's values */
#define VALUES_AHEAD 16     /* how far ahead of the value row in use the next ones are fetched */

typedef struct {
    const uint16_t *q, *keys, *values;
    const int64_t *tables;
    int width, heads, kv_heads, head_dim, block_size;
    float scale;
    uint16_t *out;
} Decode;

static const uint16_t ZERO_ROW[MAX_DIM];  /* stands in for the missing keys of a partial tile */

/* Key or value `j` of a row, every key head of it: where its block table puts it in the pool. */
static inline __attribute__((always_inline)) const uint16_t *token_row(
        const uint16_t *pool, const int64_t *table, int64_t j, int block_size, int64_t token_stride) {
    return pool + (table[j / block_size] * block_size + j % block_size) * token_stride;
}

/* Blocks lie anywhere in the pool, so the hardware cannot guess the next one: ask for it early. */
static inline __attribute__((always_inline)) void prefetch(const uint16_t *row, int64_t elements) {
    for (int64_t b = 0; b < elements * 2; b += 64) _mm_prefetch((const char *)row + b, _MM_HINT_T0);
}

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

/* acc[head] = sum over keys [begin, end) of weight * v, a few heads of a key head per pass over its values. */
static inline __attribute__((always_inline)) void span_values(
        const uint16_t *values, const int64_t *table, int64_t begin, int64_t end, int heads, int kv_heads,
        int head_dim, int block_size, int64_t padded, const float *weights, float *acc) {
    int group = heads / kv_heads, per_pass = 16 / (head_dim / 16);
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
static inline __attribute__((always_inline)) void attend_span(
        const uint16_t *q, const uint16_t *keys, const uint16_t *values, const int64_t *table, int64_t begin,
        int64_t end, int heads, int kv_heads, int head_dim, int block_size, float scale, float *scores,
        float *tops, float *totals, float *acc) {
    int64_t padded = (end - begin + TOKENS_PER_TILE - 1) / TOKENS_PER_TILE * TOKENS_PER_TILE;
    span_scores(q, keys, table, begin, end, heads, kv_heads, head_dim, block_size, scale, padded, scores);
    span_softmax(scores, heads, end - begin, padded, tops, totals);
    span_values(values, table, begin, end, heads, kv_heads, head_dim, block_size, padded, scores, acc);
}

static void attend_part(const Decode *d, int row, int64_t begin, int64_t end, float *scores, float *tops,
                        float *totals, float *acc) {
    const uint16_t *q = d->q + (int64_t)row * d->heads * d->head_dim;
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
    uint16_t *out = d->out + (int64_t)row * heads * dim;
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
            out[(int64_t)i * dim + c] = to_bf16(sum / total);
        }
    }
}

int paged_decode_attention_bf16(const uint16_t *q, const uint16_t *keys, const uint16_t *values,
                                int64_t pool_blocks, const int64_t *tables, const int64_t *lens, int rows,
                                int width, int heads, int kv_heads, int head_dim, int block_size, float scale,
                                uint16_t *out, int num_threads) {
    if (head_dim % 32 != 0 || head_dim > MAX_DIM || heads % kv_heads != 0 || rows < 1 || block_size < 1) return 1;
    int64_t longest = 0;
    for (int r = 0; r < rows; r++) {
        if (lens[r] < 1 || lens[r] > (int64_t)width * block_size) return 1;
        for (int64_t b = 0; b < (lens[r] + block_size - 1) / block_size; b++)
            if (tables[(int64_t)r * width + b] < 0 || tables[(int64_t)r * width + b] >= pool_blocks) return 1;
        longest = lens[r] > longest ? lens[r] : longest;
    }
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
