/* A decoder layer's elementwise steps on CPU in bfloat16, each one pass instead of several torch ops.
 *
 * Every result is rounded to bfloat16 where torch's chain of operations rounds it, so outputs are
 * those of the torch code they replace (up to the last float32 bit of an exponential or a square
 * root, which moves a bfloat16 rounding very rarely):
 *   add_rms_norm: sum = x + residual; out = weight * bf16(sum * rsqrt(mean(sum^2) + eps))
 *   silu_mul:     out = bf16(silu(gate)) * up, gate and up the two halves of each row
 *   rotary:       out = x * cos + rotate_half(x) * sin, each product rounded, then the sum
 * Rows are shared among torch's OpenMP threads when there are enough of them to pay.
 */
#include <math.h>

#include "bf16_simd.h"

#define PARALLEL_ELEMENTS 65536  /* below this, one thread: the fork costs more than it saves */

static inline __m512 round16(__m512 v) {  /* to bfloat16 and back, nearest even */
    return _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(v));
}

static inline void store16(uint16_t *p, __m512 v) {
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(v));
}

static void add_rms_norm_row(const uint16_t *x, const uint16_t *residual, const uint16_t *weight, int dim,
                             float eps, uint16_t *sum_out, uint16_t *norm_out) {
    __m512 squares = _mm512_setzero_ps();
    for (int c = 0; c < dim; c += 16) {
        __m512 s = widen16(x + c);
        if (residual != NULL) {
            s = round16(_mm512_add_ps(s, widen16(residual + c)));
            store16(sum_out + c, s);
        }
        squares = _mm512_fmadd_ps(s, s, squares);
    }
    __m512 inverse = _mm512_set1_ps(1.f / sqrtf(_mm512_reduce_add_ps(squares) / dim + eps));
    const uint16_t *sums = residual != NULL ? sum_out : x;
    for (int c = 0; c < dim; c += 16) {
        __m512 normed = round16(_mm512_mul_ps(widen16(sums + c), inverse));
        store16(norm_out + c, _mm512_mul_ps(normed, widen16(weight + c)));
    }
}

int add_rms_norm_bf16(const uint16_t *x, const uint16_t *residual, const uint16_t *weight, int64_t rows, int dim,
                      float eps, uint16_t *sum_out, uint16_t *norm_out, int num_threads) {
    if (dim % 16 != 0 || rows < 0) return 1;
#pragma omp parallel for num_threads(rows * dim >= PARALLEL_ELEMENTS ? num_threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        add_rms_norm_row(x + r * dim, residual != NULL ? residual + r * dim : NULL, weight, dim, eps,
                         sum_out != NULL ? sum_out + r * dim : NULL, norm_out + r * dim);
    return 0;
}

int silu_mul_bf16(const uint16_t *gate_up, int64_t rows, int width, uint16_t *out, int num_threads) {
    if (width % 16 != 0 || rows < 0) return 1;
#pragma omp parallel for num_threads(rows * width >= PARALLEL_ELEMENTS ? num_threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *gate = gate_up + r * 2 * width, *up = gate + width;
        for (int c = 0; c < width; c += 16) {
            __m512 g = widen16(gate + c);
            __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
            store16(out + r * width + c, _mm512_mul_ps(round16(silu), widen16(up + c)));
        }
    }
    return 0;
}

int rotary_bf16(const uint16_t *x, int64_t tokens, int heads, int dim, int64_t token_stride, const uint16_t *cos,
                const uint16_t *sin, uint16_t *out, int num_threads) {
    int half = dim / 2;
    if (half % 16 != 0 || tokens < 0) return 1;
#pragma omp parallel for num_threads(tokens * heads * dim >= PARALLEL_ELEMENTS ? num_threads : 1) schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const uint16_t *c = cos + t * dim, *s = sin + t * dim;
        for (int h = 0; h < heads; h++) {
            const uint16_t *in = x + t * token_stride + (int64_t)h * dim;
            uint16_t *o = out + (t * heads + h) * (int64_t)dim;
            for (int d = 0; d < half; d += 16) {
                __m512 first = widen16(in + d), second = widen16(in + half + d);
                __m512 low = _mm512_add_ps(round16(_mm512_mul_ps(first, widen16(c + d))),
                                           round16(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), second), widen16(s + d))));
                __m512 high = _mm512_add_ps(round16(_mm512_mul_ps(second, widen16(c + half + d))),
                                            round16(_mm512_mul_ps(first, widen16(s + half + d))));
                store16(o + d, low);
                store16(o + half + d, high);
            }
        }
    }
    return 0;
}
