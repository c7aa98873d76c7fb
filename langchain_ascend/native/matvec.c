/* Matrix-vector products for single-row linear layers, float32, AVX2 + FMA, OpenMP.
 *
 * y (N) = W (N, K) @ x (K) [+ bias (N)], W row-major. Eight rows at a time share each load of
 * x; the eight dot products are reduced together (hsum8x8). Blocks of rows are spread over
 * the calling thread's OpenMP team (torch's libgomp pool, see build.py). A decode step is
 * bound by streaming the weights: measured on the 2-core test host, MKL's product on the
 * bench model's row-major layers (q/k/v, o, down) streams 9-11 GB/s, this one 13-18 GB/s.
 *
 * Return codes: 0 success, 2 K not a multiple of 8.
 */
#include <stdint.h>
#include "avx2_util.h"

int matvec_f32(const float *W, const float *x, const float *bias, float *y, int64_t N, int64_t K,
               int num_threads) {
    if (K % 8) return 2;
    #pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t r0 = 0; r0 < N; r0 += 8) {
        if (N - r0 >= 8) {
            __m256 a[8];
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
            const float *w = W + r0 * K;
            for (int64_t k = 0; k < K; k += 8) {
                __m256 xv = _mm256_loadu_ps(x + k);
                for (int i = 0; i < 8; i++)
                    a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i * K + k), xv, a[i]);
            }
            __m256 s = hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
            if (bias) s = _mm256_add_ps(s, _mm256_loadu_ps(bias + r0));
            _mm256_storeu_ps(y + r0, s);
        } else {
            for (int64_t r = r0; r < N; r++) {
                __m256 a = _mm256_setzero_ps();
                for (int64_t k = 0; k < K; k += 8)
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(W + r * K + k), _mm256_loadu_ps(x + k), a);
                y[r] = hsum(a) + (bias ? bias[r] : 0.f);
            }
        }
    }
    return 0;
}
