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

static inline float dot_bf16(const uint16_t *q, const uint16_t *k, int head_dim) {
    __m512 sum = _mm512_setzero_ps();
    for (int c = 0; c < head_dim; c += 32)
        sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_loadu_si512(q + c), (__m512bh)_mm512_loadu_si512(k + c));
    return _mm512_reduce_add_ps(sum);
}

/* scores[head][key] = scale * q[head] . k[key], every head of one row, block by block. */
static inline void row_scores(const uint16_t *q, const uint16_t *keys, const int64_t *table, int64_t len,
                              int heads, int kv_heads, int head_dim, int block_size, float scale,
                              int64_t padded, float *scores) {
    int group = heads / kv_heads;
    int64_t token_stride = (int64_t)kv_heads * head_dim, block_stride = block_size * token_stride;
    for (int64_t j0 = 0; j0 < len; j0 += TOKENS_PER_TILE) {
        int n = len - j0 < TOKENS_PER_TILE ? (int)(len - j0) : TOKENS_PER_TILE;
        for (int i = 0; i < heads; i++) {
            const uint16_t *qh = q + (int64_t)i * head_dim;
            int64_t kv_offset = (int64_t)(i / group) * head_dim;
            float *s = scores + i * padded + j0;
            for (int t = n; t < TOKENS_PER_TILE; t++) s[t] = -INFINITY;
            for (int t = 0; t < n; t++) {
                int64_t j = j0 + t;
                const uint16_t *k = keys + table[j / block_size] * block_stride + (j % block_size) * token_stride;
                s[t] = scale * dot_bf16(qh, k + kv_offset, head_dim);
            }
        }
    }
}

/* Each head's scores become softmax weights in place (unnormalized); their sums go to `totals`.
 * The padding past `len` up to `padded` is -inf, so it weighs 0. */
static inline void row_softmax(float *scores, int heads, int64_t len, int64_t padded, float *totals) {
    for (int i = 0; i < heads; i++) {
        float *s = scores + i * padded;
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < padded; j += TOKENS_PER_TILE) top = _mm512_max_ps(top, _mm512_loadu_ps(s + j));
        __m512 highest = _mm512_set1_ps(_mm512_reduce_max_ps(top)), total = _mm512_setzero_ps();
        for (int64_t j = 0; j < padded; j += TOKENS_PER_TILE) {
            __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), highest));
            e = _mm512_maskz_mov_ps(j + TOKENS_PER_TILE <= len ? (__mmask16)0xffff
                                    : (__mmask16)((1u << (len - j)) - 1), e);
            _mm512_storeu_ps(s + j, e);
            total = _mm512_add_ps(total, e);
        }
        totals[i] = _mm512_reduce_add_ps(total);
    }
}

/* acc[head] = sum over keys of weight * v, then out = acc / total, rounded to bfloat16. */
static inline void row_values(const uint16_t *values, const int64_t *table, int64_t len, int heads, int kv_heads,
                              int head_dim, int block_size, int64_t padded, const float *weights,
                              const float *totals, float *acc, uint16_t *out) {
    int group = heads / kv_heads;
    int64_t token_stride = (int64_t)kv_heads * head_dim, block_stride = block_size * token_stride;
    memset(acc, 0, sizeof(float) * heads * head_dim);
    for (int64_t j = 0; j < len; j++) {
        const uint16_t *v = values + table[j / block_size] * block_stride + (j % block_size) * token_stride;
        for (int i = 0; i < heads; i++) {
            __m512 w = _mm512_set1_ps(weights[i * padded + j]);
            const uint16_t *vh = v + (int64_t)(i / group) * head_dim;
            float *a = acc + (int64_t)i * head_dim;
            for (int c = 0; c < head_dim; c += 16)
                _mm512_storeu_ps(a + c, _mm512_fmadd_ps(w, widen16(vh + c), _mm512_loadu_ps(a + c)));
        }
    }
    for (int i = 0; i < heads; i++)
        for (int d = 0; d < head_dim; d++)
            out[(int64_t)i * head_dim + d] = to_bf16(acc[(int64_t)i * head_dim + d] / totals[i]);
}

static inline __attribute__((always_inline)) void attend_row(
        const uint16_t *q, const uint16_t *keys, const uint16_t *values, const int64_t *table, int64_t len,
        int heads, int kv_heads, int head_dim, int block_size, float scale, float *work, uint16_t *out) {
    int64_t padded = (len + TOKENS_PER_TILE - 1) / TOKENS_PER_TILE * TOKENS_PER_TILE;
    float *scores = work, *totals = work + heads * padded, *acc = totals + heads;
    row_scores(q, keys, table, len, heads, kv_heads, head_dim, block_size, scale, padded, scores);
    row_softmax(scores, heads, len, padded, totals);
    row_values(values, table, len, heads, kv_heads, head_dim, block_size, padded, scores, totals, acc, out);
}

static void attend_rows(const uint16_t *q, const uint16_t *keys, const uint16_t *values, const int64_t *tables,
                        const int64_t *lens, int rows, int width, int heads, int kv_heads, int head_dim,
                        int block_size, float scale, uint16_t *out, float *work, int first, int last) {
    /* head_dim as a constant where it is a common one, so the inner loops unroll */
    for (int r = first; r < last; r++) {
        const uint16_t *qr = q + (int64_t)r * heads * head_dim;
        uint16_t *o = out + (int64_t)r * heads * head_dim;
        const int64_t *table = tables + (int64_t)r * width;
        if (head_dim == 64)
            attend_row(qr, keys, values, table, lens[r], heads, kv_heads, 64, block_size, scale, work, o);
        else if (head_dim == 128)
            attend_row(qr, keys, values, table, lens[r], heads, kv_heads, 128, block_size, scale, work, o);
        else
            attend_row(qr, keys, values, table, lens[r], heads, kv_heads, head_dim, block_size, scale, work, o);
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
    size_t work_floats = (size_t)heads * (longest + TOKENS_PER_TILE) + heads + (size_t)heads * head_dim;
    int failed = 0;
#pragma omp parallel num_threads(rows > 1 ? num_threads : 1)
    {
        float *work = malloc(sizeof(float) * work_floats);
        if (work == NULL) {
#pragma omp atomic write
            failed = 2;
        }
#pragma omp for schedule(dynamic, 1)
        for (int r = 0; r < rows; r++)
            if (work != NULL)
                attend_rows(q, keys, values, tables, lens, rows, width, heads, kv_heads, head_dim, block_size,
                            scale, out, work, r, r + 1);
        free(work);
    }
    return failed;
}
