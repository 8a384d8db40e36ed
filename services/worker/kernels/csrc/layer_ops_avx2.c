/* `layer_ops.c`'s steps for float32 activations, with AVX2 and FMA (no AVX-512 needed):
 *   add_rms_norm: sum = x + residual; out = weight * (sum * rsqrt(mean(sum^2) + eps))
 *   silu_mul:     out = silu(gate) * up, gate and up the two halves of each row
 *   rotary:       out = x * cos + rotate_half(x) * sin
 * The same arguments and statuses as the bfloat16 functions, float32 in and out. No rounding to
 * match: float32 sums in another order than torch's, so the worker takes these only where its
 * weights are GGUF blocks, whose outputs are judged beside llama.cpp's, never where it promises
 * transformers' tokens.
 */
#include <math.h>

#include "f32_simd.h"

#define PARALLEL_ELEMENTS 65536  /* below this, one thread: the fork costs more than it saves */

static void add_rms_norm_row(const float *x, const float *residual, const float *weight, int dim, float eps,
                             float *sum_out, float *norm_out) {
    __m256 squares = _mm256_setzero_ps();
    for (int c = 0; c < dim; c += 8) {
        __m256 s = _mm256_loadu_ps(x + c);
        if (residual != NULL) {
            s = _mm256_add_ps(s, _mm256_loadu_ps(residual + c));
            _mm256_storeu_ps(sum_out + c, s);
        }
        squares = _mm256_fmadd_ps(s, s, squares);
    }
    __m256 inverse = _mm256_set1_ps(1.f / sqrtf(sum8f(squares) / dim + eps));
    const float *sums = residual != NULL ? sum_out : x;
    for (int c = 0; c < dim; c += 8) {
        __m256 normed = _mm256_mul_ps(_mm256_loadu_ps(sums + c), inverse);
        _mm256_storeu_ps(norm_out + c, _mm256_mul_ps(normed, _mm256_loadu_ps(weight + c)));
    }
}

int add_rms_norm_f32(const float *x, const float *residual, const float *weight, int64_t rows, int dim, float eps,
                     float *sum_out, float *norm_out, int num_threads) {
    if (dim % 8 != 0 || rows < 0) return 1;
#pragma omp parallel for num_threads(rows * dim >= PARALLEL_ELEMENTS ? num_threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        add_rms_norm_row(x + r * dim, residual != NULL ? residual + r * dim : NULL, weight, dim, eps,
                         sum_out != NULL ? sum_out + r * dim : NULL, norm_out + r * dim);
    return 0;
}

int silu_mul_f32(const float *gate_up, int64_t rows, int width, float *out, int num_threads) {
    if (width % 8 != 0 || rows < 0) return 1;
#pragma omp parallel for num_threads(rows * width >= PARALLEL_ELEMENTS ? num_threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * width, *up = gate + width;
        for (int c = 0; c < width; c += 8) {
            __m256 g = _mm256_loadu_ps(gate + c);
            __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
            _mm256_storeu_ps(out + r * width + c, _mm256_mul_ps(silu, _mm256_loadu_ps(up + c)));
        }
    }
    return 0;
}

int rotary_f32(const float *x, int64_t tokens, int heads, int dim, int64_t token_stride, const float *cos,
               const float *sin, float *out, int num_threads) {
    int half = dim / 2;
    if (half % 8 != 0 || tokens < 0) return 1;
#pragma omp parallel for num_threads(tokens * heads * dim >= PARALLEL_ELEMENTS ? num_threads : 1) schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * dim, *s = sin + t * dim;
        for (int h = 0; h < heads; h++) {
            const float *in = x + t * token_stride + (int64_t)h * dim;
            float *o = out + (t * heads + h) * (int64_t)dim;
            for (int d = 0; d < half; d += 8) {
                __m256 first = _mm256_loadu_ps(in + d), second = _mm256_loadu_ps(in + half + d);
                __m256 low = _mm256_fnmadd_ps(second, _mm256_loadu_ps(s + d), _mm256_mul_ps(first, _mm256_loadu_ps(c + d)));
                __m256 high = _mm256_fmadd_ps(first, _mm256_loadu_ps(s + half + d),
                                              _mm256_mul_ps(second, _mm256_loadu_ps(c + half + d)));
                _mm256_storeu_ps(o + d, low);
                _mm256_storeu_ps(o + half + d, high);
            }
        }
    }
    return 0;
}
