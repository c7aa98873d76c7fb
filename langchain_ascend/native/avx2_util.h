/* AVX2 helpers shared by the kernels in this folder. */
#ifndef LANGCHAIN_ASCEND_AVX2_UTIL_H
#define LANGCHAIN_ASCEND_AVX2_UTIL_H
#if !defined(__AVX2__) || !defined(__FMA__)
#error "the native kernels need AVX2 and FMA (compile with -mavx2 -mfma)"
#endif
#include <immintrin.h>

/* The eight horizontal sums of a0..a7, in order, as one vector. */
static inline __m256 hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                             __m256 a6, __m256 a7) {
    __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
    __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* The horizontal sum of one vector. */
static inline float hsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
