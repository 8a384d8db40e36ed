/* bfloat16 and AVX-512 helpers shared by the attention kernels. */
#ifndef ZTGI_BF16_SIMD_H
#define ZTGI_BF16_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if !defined(__AVX512BF16__) || !defined(__AVX512F__)
#error "these kernels need AVX512-BF16: the worker falls back to torch's attention"
#endif

static inline uint16_t to_bf16(float f) {  /* round to nearest even, as torch rounds */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline __m512 widen16(const uint16_t *p) {  /* 16 bfloat16 -> 16 float32 */
    __m256i half = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* e^x for 16 lanes (float32, within an ulp; lanes at -inf give 0): 2^n * e^r, r = x - n ln 2 in
 * [-ln2/2, ln2/2], e^r by its degree-7 Taylor polynomial, 2^n by scalef. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.f / 5040.f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

#endif
