/* bfloat16 <-> float32 conversions shared by the kernels in this folder (AVX2).
 *
 * A bfloat16 value is the upper half of a float32, so widening is a shift. Rounding is to
 * nearest, ties to even, and every NaN becomes 0x7FC0 -- what torch's bfloat16 rounding does,
 * so a kernel's bf16 outputs equal torch's for the same float32 values.
 */
#ifndef LANGCHAIN_ASCEND_BF16_UTIL_H
#define LANGCHAIN_ASCEND_BF16_UTIL_H
#include <stdint.h>
#include <string.h>
#include "avx2_util.h"

/* The 8 bf16 values at p as floats (zero-extend, shift into the upper half). */
static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* The 8 floats of v rounded to bf16, as the 32-bit lanes of the result holding the bf16 bits
   in their lower half. */
static inline __m256i round_bf16x8(__m256 v) {
    __m256i bits = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    rounded = _mm256_srli_epi32(rounded, 16);
    __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), is_nan);
}

/* v rounded to bf16 and widened back to float32 (exactly the bf16 value). */
static inline __m256 to_bf16_and_back(__m256 v) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(round_bf16x8(v), 16));
}

/* The 8 floats of v rounded to bf16, stored at out. */
static inline void store_bf16x8(uint16_t *out, __m256 v) {
    __m256i rounded = round_bf16x8(v);
    _mm_storeu_si128((__m128i *)out, _mm_packus_epi32(_mm256_castsi256_si128(rounded),
                                                      _mm256_extracti128_si256(rounded, 1)));
}

static inline float bf16_to_f32(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* One float rounded to bf16, as store_bf16x8 rounds. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7FC0;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

#endif
