/* Rotary position embedding of a step's queries and keys, and the keys / values written into
 * the paged cache, in one pass. AVX2, single-threaded (a decode step has a few rows).
 *
 * For each of T tokens: q (T, H, D) and k (T, KVH, D) are rotated the way transformers'
 * apply_rotary_pos_emb does, x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1),
 * using that token's cos / sin rows (T, D); the rotated queries go to q_out, the rotated keys
 * to k_out (T, KVH, D) and with the values v (T, KVH, D) to slot slots[t] of the layer cache
 * (2, KVH, NB * BS, D) -- the torch_ref / cpu layout, a block's slots contiguous.
 *
 * Rounding follows transformers': float32 computes the two products and their sum as separate
 * operations (no fused multiply-add); bfloat16 rounds each product and the sum to bfloat16.
 * rope_kv_f32_f16kv computes in float32 and stores the cache's keys and values as float16
 * (rounded to nearest even, as torch's .to(torch.float16)).
 * Inputs need contiguous rows of D values (rows of one token may be strided: q_stride and
 * kv_stride are the distances between tokens). Return codes: 0 success, 2 D not a multiple
 * of 16, 3 a slot outside the cache.
 */
#include <stdint.h>
#include <string.h>
#include "bf16_util.h"

/* Separate products and sums, as transformers computes them: no contraction into FMAs. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* One row of D values: out = x * cos + rotate_half(x) * sin. */
static void rotate_f32(const float *x, const float *cos, const float *sin, float *out, int64_t D) {
    int64_t half = D / 2;
    for (int64_t i = 0; i < half; i += 8) {
        __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + half + i);
        __m256 a = _mm256_mul_ps(x1, _mm256_loadu_ps(cos + i));
        __m256 b = _mm256_mul_ps(x2, _mm256_loadu_ps(sin + i));
        _mm256_storeu_ps(out + i, _mm256_sub_ps(a, b));
        __m256 c = _mm256_mul_ps(x2, _mm256_loadu_ps(cos + half + i));
        __m256 d = _mm256_mul_ps(x1, _mm256_loadu_ps(sin + half + i));
        _mm256_storeu_ps(out + half + i, _mm256_add_ps(c, d));
    }
}

static void rotate_bf16(const uint16_t *x, const uint16_t *cos, const uint16_t *sin,
                        uint16_t *out, int64_t D) {
    int64_t half = D / 2;
    for (int64_t i = 0; i < half; i += 8) {
        __m256 x1 = load_bf16x8(x + i), x2 = load_bf16x8(x + half + i);
        __m256 a = to_bf16_and_back(_mm256_mul_ps(x1, load_bf16x8(cos + i)));
        /* rotate_half negates x2 before the product: (-x2) * sin, rounded, then added */
        __m256 b = to_bf16_and_back(_mm256_mul_ps(x2, load_bf16x8(sin + i)));
        store_bf16x8(out + i, _mm256_sub_ps(a, b));
        __m256 c = to_bf16_and_back(_mm256_mul_ps(x2, load_bf16x8(cos + half + i)));
        __m256 d = to_bf16_and_back(_mm256_mul_ps(x1, load_bf16x8(sin + half + i)));
        store_bf16x8(out + half + i, _mm256_add_ps(c, d));
    }
}

/* D values from src into a cache row of the same type, or of float16 (rounded). */
static inline void copy_row_f32(float *dst, const float *src, int64_t D) {
    memcpy(dst, src, sizeof(float) * D);
}
static inline void copy_row_bf16(uint16_t *dst, const uint16_t *src, int64_t D) {
    memcpy(dst, src, sizeof(uint16_t) * D);
}
static inline void copy_row_to_f16(uint16_t *dst, const float *src, int64_t D) {
    for (int64_t i = 0; i < D; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
}

#define DEFINE_ROPE_KV(NAME, TYPE, CTYPE, ROTATE, COPY_ROW)                                      \
    int NAME(const TYPE *q, int64_t q_stride, const TYPE *k, const TYPE *v, int64_t kv_stride,  \
             const TYPE *cos, const TYPE *sin, const int64_t *slots, TYPE *q_out, TYPE *k_out,  \
             CTYPE *cache, int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t num_slots) {   \
        if (D % 16) return 2;                                                                    \
        for (int64_t t = 0; t < T; t++)                                                          \
            if (slots[t] < 0 || slots[t] >= num_slots) return 3;                                 \
        const int64_t head_stride = num_slots * D, values = KVH * head_stride;                   \
        for (int64_t t = 0; t < T; t++) {                                                        \
            const TYPE *c = cos + t * D, *s = sin + t * D;                                       \
            for (int64_t h = 0; h < H; h++)                                                      \
                ROTATE(q + t * q_stride + h * D, c, s, q_out + (t * H + h) * D, D);              \
            for (int64_t h = 0; h < KVH; h++) {                                                  \
                TYPE *kr = k_out + (t * KVH + h) * D;                                            \
                ROTATE(k + t * kv_stride + h * D, c, s, kr, D);                                  \
                CTYPE *slot = cache + h * head_stride + slots[t] * D;                            \
                COPY_ROW(slot, kr, D);                                                           \
                COPY_ROW(slot + values, v + t * kv_stride + h * D, D);                           \
            }                                                                                    \
        }                                                                                        \
        return 0;                                                                                \
    }
DEFINE_ROPE_KV(rope_kv_f32, float, float, rotate_f32, copy_row_f32)
DEFINE_ROPE_KV(rope_kv_bf16, uint16_t, uint16_t, rotate_bf16, copy_row_bf16)
DEFINE_ROPE_KV(rope_kv_f32_f16kv, float, uint16_t, rotate_f32, copy_row_to_f16)
