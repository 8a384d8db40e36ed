/* y = x @ w.T for a few float32 rows against a float32 weight in its plain [out, in] layout, AVX2 and FMA.
 *
 * Decoding multiplies a handful of rows by every weight of the model, so the product is as fast as the
 * weight can be read. Each thread takes tiles of TILE consecutive output rows of `w`: TILE independent
 * streams keep enough loads in flight to read at the memory's rate, and a tile (TILE rows of the
 * weight) stays in L1/L2 while every row of `x` is multiplied by it, so the weight is read from memory
 * once per call whatever the number of rows. Sums run in eight lanes and are added across lanes at
 * the end: another order than a BLAS's, as oneDNN's is.
 *
 * Returns 1 (and writes nothing) when `in_features` is not a multiple of 8 or a count is negative.
 */
#include "f32_simd.h"

#define TILE 8
#define PARALLEL_ELEMENTS 32768  /* a weight smaller than this: one thread, the fork costs more than it saves */

static inline __m128 sum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {  /* the lane sums of four vectors */
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* One row of x by TILE rows of the weight (`weight_rows`; a short tile repeats its first row). */
static void row_by_tile(const float *x, const float *const *weight_rows, int64_t in_features, int outputs,
                        float *y) {
    __m256 acc[TILE];
    for (int j = 0; j < TILE; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < in_features; k += 8) {
        __m256 xv = _mm256_loadu_ps(x + k);
        for (int j = 0; j < TILE; j++) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(weight_rows[j] + k), xv, acc[j]);
    }
    float sums[TILE];
    _mm_storeu_ps(sums, sum4x8(acc[0], acc[1], acc[2], acc[3]));
    _mm_storeu_ps(sums + 4, sum4x8(acc[4], acc[5], acc[6], acc[7]));
    for (int j = 0; j < outputs; j++) y[j] = sums[j];
}

int dense_linear_f32(const float *x, const float *weight, int64_t rows, int64_t out_features, int64_t in_features,
                     float *y, int num_threads) {
    if (in_features % 8 != 0 || rows < 0 || out_features < 0 || in_features < 0) return 1;
    int64_t tiles = (out_features + TILE - 1) / TILE;
#pragma omp parallel for num_threads(out_features * in_features >= PARALLEL_ELEMENTS ? num_threads : 1) \
    schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t first = t * TILE;
        int outputs = out_features - first < TILE ? (int)(out_features - first) : TILE;
        const float *weight_rows[TILE];
        for (int j = 0; j < TILE; j++) weight_rows[j] = weight + (first + (j < outputs ? j : 0)) * in_features;
        for (int64_t r = 0; r < rows; r++)
            row_by_tile(x + r * in_features, weight_rows, in_features, outputs, y + r * out_features + first);
    }
    return 0;
}
