/* RMSNorm of a few rows, float32, AVX2 + FMA, single-threaded.
 *
 * out[i] = weight * (x[i] / sqrt(mean(x[i]^2) + eps)) for N rows of H floats -- the norm
 * LlamaRMSNorm-style modules compute (in float32). A decode step calls it twice per layer on
 * one row; as torch ops (square, mean, add, rsqrt, two products) each call cost 70-100 us
 * inside a decode step on the 2-core test host, most of it per-op overhead.
 *
 * Return codes: 0 success, 2 H not a multiple of 8.
 */
#include <math.h>
#include <stdint.h>
#include "avx2_util.h"

int rms_norm_f32(const float *x, const float *weight, float *out, int64_t N, int64_t H,
                 int64_t x_row_stride, float eps) {
    if (H % 8) return 2;
    for (int64_t i = 0; i < N; i++) {
        const float *row = x + i * x_row_stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t h = 0;
        for (; h + 16 <= H; h += 16) {
            __m256 v0 = _mm256_loadu_ps(row + h), v1 = _mm256_loadu_ps(row + h + 8);
            a0 = _mm256_fmadd_ps(v0, v0, a0);
            a1 = _mm256_fmadd_ps(v1, v1, a1);
        }
        for (; h < H; h += 8) {
            __m256 v = _mm256_loadu_ps(row + h);
            a0 = _mm256_fmadd_ps(v, v, a0);
        }
        float inv = 1.f / sqrtf(hsum(_mm256_add_ps(a0, a1)) / (float)H + eps);
        __m256 vinv = _mm256_set1_ps(inv);
        float *o = out + i * H;
        for (h = 0; h < H; h += 8)
            _mm256_storeu_ps(o + h, _mm256_mul_ps(_mm256_loadu_ps(weight + h),
                                                  _mm256_mul_ps(_mm256_loadu_ps(row + h), vinv)));
    }
    return 0;
}
