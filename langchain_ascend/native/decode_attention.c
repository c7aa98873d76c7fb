/* Decode attention over a contiguous run of cached keys, float32, AVX2 + FMA, OpenMP.
 *
 * The shape the CPU engine needs at every decode step: R query rows per KV head (the grouped
 * query heads of one or more requests, laid out as rows) attend S cached keys that sit as one
 * strided view of the paged cache ((H, S, D): rows of D floats, heads head_stride apart), with
 * an optional additive mask (R, S) shared by all heads.
 *
 * Work is split into H * num_splits items (a head and a range of keys) spread over the calling
 * thread's OpenMP team (the same libgomp pool torch uses: the library is linked against the
 * runtime torch loaded). Each item streams its keys and values once in blocks of KEY_BLOCK,
 * keeping a running max / sum / weighted value sum per row (online softmax); the items of one
 * head are then merged by their log-sum-exp. The output also returns the log-sum-exp per row,
 * so partial results over separate runs of blocks can be merged by the caller.
 *
 * Rows that see no key (every mask entry -inf) get output 0 and log-sum-exp -inf.
 * Return codes: 0 success, 1 out of memory, 2 head size not a multiple of 8.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "avx2_util.h"

#define KEY_BLOCK 64

/* Scores of q (D) against 8 consecutive keys (rows of D floats) -> 8 floats. D % 8 == 0. */
static inline __m256 dot8keys(const float *q, const float *k, int64_t D) {
    __m256 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + j * D + d), a[j]);
    }
    return hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
}

/* Rows [0, R) of one head over keys [s0, s1): unnormalised output acc (R, D), running max m
   (R) and running sum l (R). sc is (R, KEY_BLOCK) scratch. */
static void attend_chunk(const float *q, const float *k, const float *v, const float *bias,
                         int64_t bias_stride, int64_t R, int64_t D, int64_t s0, int64_t s1,
                         float scale, float *acc, float *m, float *l, float *sc) {
    for (int64_t r = 0; r < R; r++) { m[r] = -INFINITY; l[r] = 0.f; }
    memset(acc, 0, sizeof(float) * R * D);
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t kb = s0; kb < s1; kb += KEY_BLOCK) {
        int64_t n = s1 - kb < KEY_BLOCK ? s1 - kb : KEY_BLOCK;
        int64_t n8 = n & ~(int64_t)7;
        for (int64_t r = 0; r < R; r++) {
            float *row = sc + r * KEY_BLOCK;
            const float *qr = q + r * D;
            for (int64_t j = 0; j < n8; j += 8)
                _mm256_storeu_ps(row + j, _mm256_mul_ps(dot8keys(qr, k + (kb + j) * D, D), vscale));
            for (int64_t j = n8; j < n; j++) {
                __m256 a = _mm256_setzero_ps();
                for (int64_t d = 0; d < D; d += 8)
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), _mm256_loadu_ps(k + (kb + j) * D + d), a);
                row[j] = hsum(a) * scale;
            }
            if (bias) {
                const float *b = bias + r * bias_stride + kb;
                for (int64_t j = 0; j < n; j++) row[j] += b[j];
            }
            float bm = -INFINITY;
            for (int64_t j = 0; j < n; j++) bm = row[j] > bm ? row[j] : bm;
            if (bm == -INFINITY) { memset(row, 0, sizeof(float) * KEY_BLOCK); continue; }
            float nm = m[r] > bm ? m[r] : bm;
            float alpha = expf(m[r] - nm);
            __m256 vnm = _mm256_set1_ps(nm), vsum = _mm256_setzero_ps();
            float sum = 0.f;
            for (int64_t j = 0; j < n8; j += 8) {
                __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(row + j), vnm));
                _mm256_storeu_ps(row + j, p);
                vsum = _mm256_add_ps(vsum, p);
            }
            for (int64_t j = n8; j < n; j++) { float p = expf(row[j] - nm); row[j] = p; sum += p; }
            l[r] = l[r] * alpha + hsum(vsum) + sum;
            if (alpha != 1.f) { float *a = acc + r * D; for (int64_t d = 0; d < D; d++) a[d] *= alpha; }
            m[r] = nm;
        }
        for (int64_t r = 0; r < R; r++) {
            float *a = acc + r * D;
            const float *p = sc + r * KEY_BLOCK;
            for (int64_t d = 0; d < D; d += 32) {  /* 4 accumulators of the output row in registers */
                int w = D - d >= 32 ? 4 : (int)((D - d) / 8);
                __m256 o[4];
                for (int i = 0; i < w; i++) o[i] = _mm256_loadu_ps(a + d + 8 * i);
                for (int64_t j = 0; j < n; j++) {
                    __m256 pj = _mm256_set1_ps(p[j]);
                    const float *vr = v + (kb + j) * D + d;
                    for (int i = 0; i < w; i++) o[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8 * i), o[i]);
                }
                for (int i = 0; i < w; i++) _mm256_storeu_ps(a + d + 8 * i, o[i]);
            }
        }
    }
}

/* q (H, R, D) contiguous; k, v: head h starts at k + h * kv_head_stride, S rows of D floats;
   bias (R, S) with row stride bias_stride, or NULL; out (H, R, D); lse (H, R). */
int decode_attention_f32(const float *q, const float *k, const float *v, int64_t kv_head_stride,
                         const float *bias, int64_t bias_stride, float *out, float *lse,
                         int64_t H, int64_t R, int64_t S, int64_t D, float scale,
                         int64_t num_splits, int num_threads) {
    if (D % 8) return 2;
    if (num_splits < 1) num_splits = 1;
    int64_t chunk = (S + num_splits - 1) / num_splits;
    chunk = (chunk + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
    if (chunk < KEY_BLOCK) chunk = KEY_BLOCK;
    num_splits = (S + chunk - 1) / chunk;
    if (num_splits < 1) num_splits = 1;
    int64_t items = H * num_splits;
    float *part = (float *)malloc(sizeof(float) * items * R * (D + 2));
    if (!part) return 1;
    int failed = 0;
    #pragma omp parallel num_threads(num_threads)
    {
        float *sc = (float *)malloc(sizeof(float) * R * KEY_BLOCK);
        if (!sc) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            if (!sc) continue;
            int64_t h = it / num_splits, sp = it % num_splits;
            int64_t s0 = sp * chunk, s1 = s0 + chunk < S ? s0 + chunk : S;
            float *base = part + it * R * (D + 2);
            attend_chunk(q + h * R * D, k + h * kv_head_stride, v + h * kv_head_stride, bias,
                         bias_stride, R, D, s0, s1, scale, base, base + R * D, base + R * D + R, sc);
        }
        free(sc);
    }
    if (failed) { free(part); return 1; }
    for (int64_t h = 0; h < H; h++) {
        for (int64_t r = 0; r < R; r++) {
            float M = -INFINITY;
            for (int64_t sp = 0; sp < num_splits; sp++) {
                float mm = part[(h * num_splits + sp) * R * (D + 2) + R * D + r];
                M = mm > M ? mm : M;
            }
            float *o = out + (h * R + r) * D;
            memset(o, 0, sizeof(float) * D);
            if (M == -INFINITY) { lse[h * R + r] = -INFINITY; continue; }
            float L = 0.f;
            for (int64_t sp = 0; sp < num_splits; sp++) {
                float *base = part + (h * num_splits + sp) * R * (D + 2);
                float w = expf(base[R * D + r] - M);
                if (w == 0.f) continue;
                L += base[R * D + R + r] * w;
                const float *a = base + r * D;
                for (int64_t d = 0; d < D; d++) o[d] += a[d] * w;
            }
            float inv = 1.f / L;
            for (int64_t d = 0; d < D; d++) o[d] *= inv;
            lse[h * R + r] = M + logf(L);
        }
    }
    free(part);
    return 0;
}
