/* RMSNorm of a few rows, float32, AVX2 + FMA, single-threaded.
 *
 * out[i] = weight * (x[i] / sqrt(mean(x[i]^2) + eps)) for N rows of H floats -- the norm
 * LlamaRMSNorm-style modules compute (in float32). A decode step calls it twice per layer on
 * one row; as torch ops (square, mean, add, rsqrt, two products) each call cost 70-100 us
 * inside a decode step on the 2-core test host, most of it per-op overhead.
 *
 * rms_norm_bf16: the same for bfloat16 rows and weight, in transformers' LlamaRMSNorm rounding
 * order: h = x / sqrt(mean(x^2) + eps) in float32, rounded to bf16, then weight * h in float32
 * rounded to bf16 again (nearest even; NaN -> 0x7FC0, as torch rounds). The squares are exact
 * in float32 and summed in the order of torch's AVX2 inner sum (its cascade over 8-lane
 * vectors, see sum_sq_torch_order), so the result equals transformers' module bit for bit
 * where torch runs its AVX2 kernels (tested); elsewhere it may differ on rare rows by the
 * last float32 bit of the mean square.
 *
 * Return codes: 0 success, 2 H not a multiple of 8.
 */
#include <math.h>
#include <stdint.h>
#include "bf16_util.h"

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

/* ceil(log2(n)) for n >= 1. */
static int ceil_log2(int64_t n) {
    int bits = 0;
    while (((int64_t)1 << bits) < n) bits++;
    return bits;
}

static inline __m256 square_bf16x8(const uint16_t *p) {
    __m256 v = load_bf16x8(p);
    return _mm256_mul_ps(v, v);
}

/* sum(x^2) over H bf16 values (H % 8 == 0) in the order torch 2.x sums a contiguous float32
   row with 8-lane vectors: the vectors as 4 interleaved streams, each stream a cascade of 4
   accumulator levels (flushed upward every 2^level_power vectors), the streams' sums added
   in order, then the 8 lanes added one by one. Every square is exact (bf16 inputs). */
static float sum_sq_torch_order(const uint16_t *row, int64_t H) {
    enum { LEVELS = 4, STREAMS = 4 };
    int64_t vectors = H / 8, size = vectors / STREAMS;
    int level_power = ceil_log2(size > 0 ? size : 1) / LEVELS;
    if (level_power < 4) level_power = 4;
    int64_t step = (int64_t)1 << level_power, mask = step - 1;
    __m256 acc[LEVELS][STREAMS];
    for (int j = 0; j < LEVELS; j++)
        for (int k = 0; k < STREAMS; k++) acc[j][k] = _mm256_setzero_ps();
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t end = i + step; i < end; i++)
            for (int k = 0; k < STREAMS; k++)
                acc[0][k] = _mm256_add_ps(acc[0][k], square_bf16x8(row + (i * STREAMS + k) * 8));
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < STREAMS; k++) {
                acc[j][k] = _mm256_add_ps(acc[j][k], acc[j - 1][k]);
                acc[j - 1][k] = _mm256_setzero_ps();
            }
            if (i & (mask << (j * level_power))) break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < STREAMS; k++)
            acc[0][k] = _mm256_add_ps(acc[0][k], square_bf16x8(row + (i * STREAMS + k) * 8));
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < STREAMS; k++) acc[0][k] = _mm256_add_ps(acc[0][k], acc[j][k]);
    __m256 total = acc[0][0];
    for (int64_t v = size * STREAMS; v < vectors; v++)
        total = _mm256_add_ps(total, square_bf16x8(row + v * 8));
    for (int k = 1; k < STREAMS; k++) total = _mm256_add_ps(total, acc[0][k]);
    float lanes[8], sum = 0.f;
    _mm256_storeu_ps(lanes, total);
    for (int k = 0; k < 8; k++) sum += lanes[k];
    return sum;
}

int rms_norm_bf16(const uint16_t *x, const uint16_t *weight, uint16_t *out, int64_t N, int64_t H,
                  int64_t x_row_stride, float eps) {
    if (H % 8) return 2;
    for (int64_t i = 0; i < N; i++) {
        const uint16_t *row = x + i * x_row_stride;
        float inv = 1.f / sqrtf(sum_sq_torch_order(row, H) / (float)H + eps);
        __m256 vinv = _mm256_set1_ps(inv);
        uint16_t *o = out + i * H;
        for (int64_t h = 0; h < H; h += 8) {
            __m256 normed = to_bf16_and_back(_mm256_mul_ps(load_bf16x8(row + h), vinv));
            store_bf16x8(o + h, _mm256_mul_ps(load_bf16x8(weight + h), normed));
        }
    }
    return 0;
}
