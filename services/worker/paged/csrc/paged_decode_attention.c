/* Decode attention over a paged KV cache on CPU, bfloat16, reading the blocks where they lie.
 *
 * Each decode row has one query per head and attends to its `len` cached keys, found through its
 * block table. torch's path copies every row's blocks into a contiguous buffer, layer by layer,
 * then runs SDPA over the copy; this kernel reads each block once, in place: query-key dots with
 * AVX512-BF16 (bfloat16 products summed in float32, as a bfloat16 GEMM sums them), a float32
 * softmax, and the weighted values summed in float32. Rows are shared among the OpenMP threads of
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

typedef struct {
    const uint16_t *q, *keys, *values;
    const int64_t *tables;
    int width, heads, kv_heads, head_dim, block_size;
    float scale;
    uint16_t *out;
} Decode;

static inline float dot_bf16(const uint16_t *q, const uint16_t *k, int head_dim) {
    __m512 sum = _mm512_setzero_ps();
    for (int c = 0; c < head_dim; c += 32)
        sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_loadu_si512(q + c), (__m512bh)_mm512_loadu_si512(k + c));
    return _mm512_reduce_add_ps(sum);
}

/* scores[head][key - begin] = scale * q[head] . k[key] for keys [begin, end) of one row, every head,
 * a tile of 16 keys at a time; a partial last tile is padded with -inf. */
static inline void span_scores(const uint16_t *q, const uint16_t *keys, const int64_t *table, int64_t begin,
                               int64_t end, int heads, int kv_heads, int head_dim, int block_size, float scale,
                               int64_t padded, float *scores) {
    int group = heads / kv_heads;
    int64_t token_stride = (int64_t)kv_heads * head_dim, block_stride = block_size * token_stride;
    for (int64_t j0 = begin; j0 < end; j0 += TOKENS_PER_TILE) {
        int n = end - j0 < TOKENS_PER_TILE ? (int)(end - j0) : TOKENS_PER_TILE;
        for (int i = 0; i < heads; i++) {
            const uint16_t *qh = q + (int64_t)i * head_dim;
            int64_t kv_offset = (int64_t)(i / group) * head_dim;
            float *s = scores + i * padded + (j0 - begin);
            for (int t = n; t < TOKENS_PER_TILE; t++) s[t] = -INFINITY;
            for (int t = 0; t < n; t++) {
                int64_t j = j0 + t;
                const uint16_t *k = keys + table[j / block_size] * block_stride + (j % block_size) * token_stride;
                s[t] = scale * dot_bf16(qh, k + kv_offset, head_dim);
            }
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

/* acc[head] = sum over keys [begin, end) of weight * v. */
static inline void span_values(const uint16_t *values, const int64_t *table, int64_t begin, int64_t end, int heads,
                               int kv_heads, int head_dim, int block_size, int64_t padded, const float *weights,
                               float *acc) {
    int group = heads / kv_heads;
    int64_t token_stride = (int64_t)kv_heads * head_dim, block_stride = block_size * token_stride;
    memset(acc, 0, sizeof(float) * heads * head_dim);
    for (int64_t j = begin; j < end; j++) {
        const uint16_t *v = values + table[j / block_size] * block_stride + (j % block_size) * token_stride;
        for (int i = 0; i < heads; i++) {
            __m512 w = _mm512_set1_ps(weights[i * padded + (j - begin)]);
            const uint16_t *vh = v + (int64_t)(i / group) * head_dim;
            float *a = acc + (int64_t)i * head_dim;
            for (int c = 0; c < head_dim; c += 16)
                _mm512_storeu_ps(a + c, _mm512_fmadd_ps(w, widen16(vh + c), _mm512_loadu_ps(a + c)));
        }
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
    if (head_dim % 32 != 0 || heads % kv_heads != 0 || rows < 1 || block_size < 1) return 1;
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
