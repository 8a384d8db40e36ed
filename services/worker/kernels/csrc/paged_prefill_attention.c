/* Causal attention of one request's prefill chunk over its paged KV cache on CPU, bfloat16.
 *
 * The chunk's n queries sit at positions cache_len .. cache_len + n - 1 and attend to every key up
 * to their own position, found through the request's block table (the chunk's own keys are
 * already written to the pool). First each key head's keys and values are packed into the pair
 * layouts AVX512-BF16's dot product wants (keys: a tile of 16 keys as 16 lanes per pair of
 * dimensions; values: 16 keys' rows together), then a few queries of one head at a time run an
 * online softmax over the key tiles up to their diagonal, sharing each loaded tile: scores summed
 * in float32, the softmax and the weighted values in float32 (torch's CPU flash kernel rounds the
 * weights to bfloat16 first; keeping them exact is what keeps greedy texts with transformers').
 * Work is shared among the OpenMP threads of the runtime torch loaded.
 *
 * Layout: q [n, heads, head_dim]; pools [pool_blocks, block_size, kv_heads, head_dim]; table [blocks
 * of the request] int64, each below pool_blocks; out [n, heads, head_dim]. head_dim a multiple of 32, at most 256.
 * Returns 0, or non-zero when it cannot run (the caller falls back to torch).
 */
#include <math.h>
#include <stdlib.h>

#include "bf16_simd.h"

#define TILE 16
#define MAX_DIM 256
#define ROWS 6  /* queries sharing each loaded tile */

typedef struct {
    const uint16_t *q, *keys, *values;
    const int64_t *table;
    int64_t n, cache_len, context;
    int heads, kv_heads, head_dim, block_size;
    float scale;
    uint32_t *packed_keys;    /* [kv_heads][key tiles][head_dim / 2][TILE] pairs of dimensions */
    uint16_t *packed_values;  /* [kv_heads][key tiles][TILE][head_dim] */
    uint16_t *out;
} Prefill;

static inline const uint16_t *row_of(const Prefill *p, const uint16_t *pool, int64_t key, int head) {
    int64_t token_stride = (int64_t)p->kv_heads * p->head_dim;
    return pool + p->table[key / p->block_size] * p->block_size * token_stride
           + (key % p->block_size) * token_stride + (int64_t)head * p->head_dim;
}

static void pack_tile(const Prefill *p, int head, int64_t tile) {
    int half = p->head_dim / 2, dim = p->head_dim;
    int64_t tiles = (p->context + TILE - 1) / TILE;
    uint32_t *kt = p->packed_keys + ((int64_t)head * tiles + tile) * half * TILE;
    uint16_t *vt = p->packed_values + ((int64_t)head * tiles + tile) * TILE * dim;
    for (int j = 0; j < TILE; j++) {
        int64_t key = tile * TILE + j;
        const uint32_t *k = key < p->context ? (const uint32_t *)row_of(p, p->keys, key, head) : NULL;
        for (int c = 0; c < half; c++) kt[c * TILE + j] = k ? k[c] : 0;
        const uint16_t *v = key < p->context ? row_of(p, p->values, key, head) : NULL;
        for (int d = 0; d < dim; d++) vt[j * dim + d] = v ? v[d] : 0;
    }
}

/* Up to ROWS consecutive queries i0.. of query head qh over the key tiles up to their diagonals,
 * sharing each loaded tile of keys and values among them. */
static void attend_queries(const Prefill *p, int64_t i0, int count, int qh) {
    int dim = p->head_dim, half = dim / 2, head = qh / (p->heads / p->kv_heads);
    int64_t tiles = (p->context + TILE - 1) / TILE, last_key = p->cache_len + i0 + count - 1;
    const uint32_t *qpairs[ROWS];
    for (int r = 0; r < ROWS; r++)
        qpairs[r] = (const uint32_t *)(p->q + ((i0 + (r < count ? r : 0)) * p->heads + qh) * (int64_t)dim);
    const uint32_t *kt = p->packed_keys + (int64_t)head * tiles * half * TILE;
    const uint16_t *vt = p->packed_values + (int64_t)head * tiles * TILE * dim;
    float top[ROWS], total[ROWS];
    __m512 acc[ROWS][MAX_DIM / 16];
    for (int r = 0; r < ROWS; r++) {
        top[r] = -INFINITY;
        total[r] = 0.f;
        for (int c = 0; c < dim / 16; c++) acc[r][c] = _mm512_setzero_ps();
    }
    for (int64_t tile = 0; tile * TILE <= last_key; tile++) {
        const uint32_t *ktile = kt + tile * half * TILE;
        __m512 s[ROWS];
        for (int r = 0; r < ROWS; r++) s[r] = _mm512_setzero_ps();
        for (int c = 0; c < half; c++) {
            __m512bh k = (__m512bh)_mm512_loadu_si512(ktile + c * TILE);
            for (int r = 0; r < ROWS; r++)
                s[r] = _mm512_dpbf16_ps(s[r], k, (__m512bh)_mm512_set1_epi32((int)qpairs[r][c]));
        }
        float weights[ROWS][TILE];
        for (int r = 0; r < ROWS; r++) {
            int64_t visible = p->cache_len + i0 + r - tile * TILE + 1;
            __mmask16 keep = visible >= TILE ? (__mmask16)0xffff
                           : visible <= 0 ? (__mmask16)0 : (__mmask16)((1u << visible) - 1);
            __m512 scores = _mm512_mask_blend_ps(keep, _mm512_set1_ps(-INFINITY),
                                                 _mm512_mul_ps(s[r], _mm512_set1_ps(p->scale)));
            float tile_top = keep ? _mm512_reduce_max_ps(scores) : -INFINITY;
            float new_top = tile_top > top[r] ? tile_top : top[r];
            float rescale = top[r] == -INFINITY ? 0.f : expf(top[r] - new_top);
            __m512 w = _mm512_maskz_mov_ps(keep, exp16(_mm512_sub_ps(scores, _mm512_set1_ps(new_top))));
            _mm512_storeu_ps(weights[r], w);
            total[r] = total[r] * rescale + _mm512_reduce_add_ps(w);
            top[r] = new_top;
            for (int c = 0; c < dim / 16; c++) acc[r][c] = _mm512_mul_ps(acc[r][c], _mm512_set1_ps(rescale));
        }
        const uint16_t *vtile = vt + tile * TILE * dim;
        for (int j = 0; j < TILE; j++)
            for (int c = 0; c < dim / 16; c++) {
                __m512 v = widen16(vtile + j * dim + c * 16);
                for (int r = 0; r < ROWS; r++)
                    acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(weights[r][j]), v, acc[r][c]);
            }
    }
    for (int r = 0; r < count; r++) {
        uint16_t *o = p->out + ((i0 + r) * p->heads + qh) * (int64_t)dim;
        float row[MAX_DIM];
        for (int c = 0; c < dim / 16; c++) _mm512_storeu_ps(row + 16 * c, acc[r][c]);
        for (int d = 0; d < dim; d++) o[d] = to_bf16(row[d] / total[r]);
    }
}

static void attend_group(const Prefill *p, int64_t group, int qh) {
    int64_t i0 = group * ROWS;
    int count = p->n - i0 < ROWS ? (int)(p->n - i0) : ROWS;
    if (p->head_dim == 64) {  /* a constant head_dim lets the compiler keep the accumulators in registers */
        Prefill fixed = *p;
        fixed.head_dim = 64;
        attend_queries(&fixed, i0, count, qh);
    } else {
        attend_queries(p, i0, count, qh);
    }
}

int paged_prefill_attention_bf16(const uint16_t *q, const uint16_t *keys, const uint16_t *values,
                                 int64_t pool_blocks, const int64_t *table, int64_t num_blocks, int64_t n,
                                 int64_t cache_len, int heads, int kv_heads, int head_dim, int block_size,
                                 float scale, uint16_t *out, int num_threads) {
    if (head_dim % 32 != 0 || head_dim > MAX_DIM || heads % kv_heads != 0 || n < 1 || cache_len < 0
        || block_size < 1 || cache_len + n > num_blocks * block_size) return 1;
    for (int64_t b = 0; b < (cache_len + n + block_size - 1) / block_size; b++)
        if (table[b] < 0 || table[b] >= pool_blocks) return 1;
    int64_t context = cache_len + n, tiles = (context + TILE - 1) / TILE;
    Prefill p = {q, keys, values, table, n, cache_len, context, heads, kv_heads, head_dim, block_size, scale,
                 NULL, NULL, out};
    size_t elements = (size_t)kv_heads * tiles * TILE * head_dim;
    p.packed_keys = malloc(sizeof(uint16_t) * elements);
    p.packed_values = malloc(sizeof(uint16_t) * elements);
    int failed = p.packed_keys == NULL || p.packed_values == NULL;
    if (!failed) {
#pragma omp parallel num_threads(num_threads)
        {
#pragma omp for schedule(static)
            for (int64_t job = 0; job < (int64_t)kv_heads * tiles; job++) pack_tile(&p, (int)(job / tiles), job % tiles);
            /* latest queries first: they see the most keys, so the dynamic schedule ends evenly */
            int64_t groups = (n + ROWS - 1) / ROWS;
#pragma omp for schedule(dynamic, 1)
            for (int64_t job = 0; job < groups * heads; job++)
                attend_group(&p, groups - 1 - job / heads, (int)(job % heads));
        }
    }
    free(p.packed_keys);
    free(p.packed_values);
    return failed ? 2 : 0;
}
