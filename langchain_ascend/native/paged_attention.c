/* Paged decode attention: one query token per request over its blocks of the paged cache,
 * every request of the step in one call. AVX2 + FMA, OpenMP; float32 or bfloat16 cache.
 *
 * Cache of one layer: (2, KVH, NB, BS, D) -- keys then values, per KV head NB blocks of BS
 * rows of D values (the torch_ref / cpu backends' layout). Request b attends the first
 * seq_lens[b] slots named by its row of the int32 block table (B, W); with a sliding window
 * only the last `window` of them (window 0: all).
 *
 * Work is split into B * KVH * num_splits items (a request, a KV head and a range of
 * split_keys keys from the row's first key, so a row's rounding never depends on the other
 * rows of the call: batched and solo decodes give the same bits) spread over the calling thread's OpenMP team (torch's libgomp pool, see build.py).
 * An item holds the G = H / KVH query rows of its KV head in float32 and walks its blocks,
 * merging runs of consecutive block ids into chunks of up to KEY_BLOCK keys, with a running
 * max / sum / weighted value sum per row (online softmax). The items of one (request, head)
 * are merged by their log-sum-exp at the end. The request's K/V for this step must already be
 * in the cache (the caller writes them first).
 *
 * Queries and outputs are (B, H, D) in the cache's dtype; bfloat16 outputs are rounded to
 * nearest even. Return codes: 0 success, 1 out of memory, 2 D not a multiple of 8 or H not a
 * multiple of KVH, 3 a block id outside [0, NB).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16_util.h"

#define KEY_BLOCK 64

/* 8 stored values at p as floats. */
static inline __m256 load_f32(const float *p) { return _mm256_loadu_ps(p); }

/* Online-softmax state of one item: acc (G, D) unnormalised output, m (G) running max,
   l (G) running sum; sc (G, KEY_BLOCK) score scratch. */
typedef struct {
    float *acc, *m, *l, *sc;
} State;

/* Scores of one row (8 keys at a time, 8 accumulators) or a pair of rows (4 keys at a time,
   each key load serving both rows) against n keys, scaled, into row0 / row1. */
#define DEFINE_SCORES(NAME, TYPE, LOAD)                                                          \
    static inline void NAME##_pair(const float *q0, const float *q1, const TYPE *k, int64_t n,  \
                                   int64_t D, float scale, float *row0, float *row1) {          \
        const __m256 vscale = _mm256_set1_ps(scale);                                             \
        int64_t j = 0;                                                                           \
        for (; j + 4 <= n; j += 4) {                                                             \
            __m256 a[8];                                                                         \
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();                              \
            for (int64_t d = 0; d < D; d += 8) {                                                 \
                __m256 x0 = _mm256_loadu_ps(q0 + d), x1 = _mm256_loadu_ps(q1 + d);               \
                for (int i = 0; i < 4; i++) {                                                    \
                    __m256 kv = LOAD(k + (j + i) * D + d);                                       \
                    a[i] = _mm256_fmadd_ps(x0, kv, a[i]);                                        \
                    a[4 + i] = _mm256_fmadd_ps(x1, kv, a[4 + i]);                                \
                }                                                                                \
            }                                                                                    \
            float sums[8];                                                                       \
            _mm256_storeu_ps(sums, _mm256_mul_ps(                                                \
                hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), vscale));               \
            for (int i = 0; i < 4; i++) { row0[j + i] = sums[i]; row1[j + i] = sums[4 + i]; }   \
        }                                                                                        \
        for (; j < n; j++) {                                                                     \
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                           \
            for (int64_t d = 0; d < D; d += 8) {                                                 \
                __m256 kv = LOAD(k + j * D + d);                                                 \
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), kv, a0);                           \
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), kv, a1);                           \
            }                                                                                    \
            row0[j] = hsum(a0) * scale;                                                          \
            row1[j] = hsum(a1) * scale;                                                          \
        }                                                                                        \
    }                                                                                            \
    static inline void NAME##_one(const float *q0, const TYPE *k, int64_t n, int64_t D,         \
                                  float scale, float *row0) {                                    \
        const __m256 vscale = _mm256_set1_ps(scale);                                             \
        int64_t j = 0;                                                                           \
        for (; j + 8 <= n; j += 8) {                                                             \
            __m256 a[8];                                                                         \
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();                              \
            for (int64_t d = 0; d < D; d += 8) {                                                 \
                __m256 x0 = _mm256_loadu_ps(q0 + d);                                             \
                for (int i = 0; i < 8; i++)                                                      \
                    a[i] = _mm256_fmadd_ps(x0, LOAD(k + (j + i) * D + d), a[i]);                 \
            }                                                                                    \
            _mm256_storeu_ps(row0 + j, _mm256_mul_ps(                                            \
                hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), vscale));               \
        }                                                                                        \
        for (; j < n; j++) {                                                                     \
            __m256 a0 = _mm256_setzero_ps();                                                     \
            for (int64_t d = 0; d < D; d += 8)                                                   \
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), LOAD(k + j * D + d), a0);          \
            row0[j] = hsum(a0) * scale;                                                          \
        }                                                                                        \
    }

/* acc (1 or 2 rows of D) += p (n weights per row) @ v (n rows of D), 32 columns at a time
   (each value load serving both rows of a pair). */
#define DEFINE_VALUES(NAME, TYPE, LOAD)                                                          \
    static inline void NAME##_pair(const float *p0, const float *p1, const TYPE *v, int64_t n,  \
                                   int64_t D, float *acc0, float *acc1) {                        \
        for (int64_t d = 0; d < D; d += 32) {                                                    \
            int w = D - d >= 32 ? 4 : (int)((D - d) / 8);                                        \
            __m256 o0[4], o1[4];                                                                 \
            for (int i = 0; i < w; i++) {                                                        \
                o0[i] = _mm256_loadu_ps(acc0 + d + 8 * i);                                       \
                o1[i] = _mm256_loadu_ps(acc1 + d + 8 * i);                                       \
            }                                                                                    \
            for (int64_t j = 0; j < n; j++) {                                                    \
                __m256 w0 = _mm256_set1_ps(p0[j]), w1 = _mm256_set1_ps(p1[j]);                   \
                const TYPE *vr = v + j * D + d;                                                  \
                for (int i = 0; i < w; i++) {                                                    \
                    __m256 vv = LOAD(vr + 8 * i);                                                \
                    o0[i] = _mm256_fmadd_ps(w0, vv, o0[i]);                                      \
                    o1[i] = _mm256_fmadd_ps(w1, vv, o1[i]);                                      \
                }                                                                                \
            }                                                                                    \
            for (int i = 0; i < w; i++) {                                                        \
                _mm256_storeu_ps(acc0 + d + 8 * i, o0[i]);                                       \
                _mm256_storeu_ps(acc1 + d + 8 * i, o1[i]);                                       \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    static inline void NAME##_one(const float *p0, const TYPE *v, int64_t n, int64_t D,         \
                                  float *acc0) {                                                 \
        for (int64_t d = 0; d < D; d += 32) {                                                    \
            int w = D - d >= 32 ? 4 : (int)((D - d) / 8);                                        \
            __m256 o0[4];                                                                        \
            for (int i = 0; i < w; i++) o0[i] = _mm256_loadu_ps(acc0 + d + 8 * i);               \
            for (int64_t j = 0; j < n; j++) {                                                    \
                __m256 w0 = _mm256_set1_ps(p0[j]);                                               \
                const TYPE *vr = v + j * D + d;                                                  \
                for (int i = 0; i < w; i++) o0[i] = _mm256_fmadd_ps(w0, LOAD(vr + 8 * i), o0[i]); \
            }                                                                                    \
            for (int i = 0; i < w; i++) _mm256_storeu_ps(acc0 + d + 8 * i, o0[i]);               \
        }                                                                                        \
    }

/* Online-softmax update of row r after its n scores were written to row: the scores become
   weights exp(s - new max), the row's sum and output are rescaled. */
static inline void softmax_update(float *row, int64_t n, int64_t D, int64_t r, State *st) {
    float bm = -INFINITY;
    for (int64_t j = 0; j < n; j++) bm = row[j] > bm ? row[j] : bm;
    float nm = st->m[r] > bm ? st->m[r] : bm;
    float alpha = st->m[r] == -INFINITY ? 0.f : expf(st->m[r] - nm);
    __m256 vnm = _mm256_set1_ps(nm), vsum = _mm256_setzero_ps();
    float sum = 0.f;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(row + j), vnm));
        _mm256_storeu_ps(row + j, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    for (; j < n; j++) { float p = expf(row[j] - nm); row[j] = p; sum += p; }
    st->l[r] = st->l[r] * alpha + hsum(vsum) + sum;
    st->m[r] = nm;
    if (alpha != 1.f) {
        float *a = st->acc + r * D;
        __m256 va = _mm256_set1_ps(alpha);
        for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(a + d, _mm256_mul_ps(_mm256_loadu_ps(a + d), va));
    }
}

/* Attend the G query rows qf (G, D) over n <= KEY_BLOCK consecutive keys k / values v (rows
   of D values of type TYPE): rows in pairs, a last odd row alone. */
#define DEFINE_CHUNK(NAME, TYPE, LOAD)                                                           \
    DEFINE_SCORES(NAME##_scores, TYPE, LOAD)                                                     \
    DEFINE_VALUES(NAME##_values, TYPE, LOAD)                                                     \
    static void NAME(const float *qf, const TYPE *k, const TYPE *v, int64_t n, int64_t G,       \
                     int64_t D, float scale, State *st) {                                        \
        int64_t r = 0;                                                                           \
        for (; r + 2 <= G; r += 2) {                                                             \
            float *row0 = st->sc + r * KEY_BLOCK, *row1 = row0 + KEY_BLOCK;                      \
            NAME##_scores_pair(qf + r * D, qf + (r + 1) * D, k, n, D, scale, row0, row1);        \
            softmax_update(row0, n, D, r, st);                                                   \
            softmax_update(row1, n, D, r + 1, st);                                               \
            NAME##_values_pair(row0, row1, v, n, D, st->acc + r * D, st->acc + (r + 1) * D);     \
        }                                                                                        \
        if (r < G) {                                                                             \
            float *row0 = st->sc + r * KEY_BLOCK;                                                \
            NAME##_scores_one(qf + r * D, k, n, D, scale, row0);                                 \
            softmax_update(row0, n, D, r, st);                                                   \
            NAME##_values_one(row0, v, n, D, st->acc + r * D);                                   \
        }                                                                                        \
    }
DEFINE_CHUNK(chunk_f32, float, load_f32)
DEFINE_CHUNK(chunk_bf16, uint16_t, load_bf16x8)

/* The whole call for one cache type. Q_LOAD(ptr, i) reads query value i as float; OUT_STORE
   writes one float into the output. */
#define DEFINE_PAGED(NAME, TYPE, CHUNK, TO_F32, FROM_F32)                                        \
    int NAME(const TYPE *q, const TYPE *cache, const int32_t *tables, int64_t table_stride,     \
             const int64_t *seq_lens, TYPE *out, int64_t B, int64_t H, int64_t KVH, int64_t D,   \
             int64_t NB, int64_t BS, int64_t window, float scale, int64_t split_keys,            \
             int num_threads) {                                                                  \
        if (D % 8 || KVH < 1 || H % KVH) return 2;                                               \
        /* Fixed key ranges of split_keys (whole blocks) from each row's first key: a row's */   \
        /* sums never depend on the other rows of the call (batch-invariant rounding). */        \
        if (split_keys < BS) split_keys = BS;                                                    \
        split_keys = (split_keys + BS - 1) / BS * BS;                                            \
        int64_t longest = 1;                                                                     \
        for (int64_t b = 0; b < B; b++) {                                                        \
            int64_t span = window > 0 && seq_lens[b] > window ? window : seq_lens[b];            \
            longest = span > longest ? span : longest;                                           \
        }                                                                                        \
        const int64_t num_splits = (longest + split_keys - 1) / split_keys;                      \
        const int64_t G = H / KVH, head_stride = NB * BS * D, kv_stride = KVH * head_stride;    \
        const int64_t items = B * KVH * num_splits;                                              \
        float *part = (float *)malloc(sizeof(float) * items * G * (D + 2));                      \
        if (!part) return 1;                                                                     \
        int failed = 0, bad_block = 0;                                                           \
        _Pragma("omp parallel num_threads(num_threads)")                                        \
        {                                                                                        \
            float *scratch = (float *)malloc(sizeof(float) * G * (KEY_BLOCK + D));               \
            if (!scratch) {                                                                      \
                _Pragma("omp atomic write")                                                      \
                failed = 1;                                                                      \
            }                                                                                    \
            _Pragma("omp for schedule(dynamic, 1)")                                             \
            for (int64_t it = 0; it < items; it++) {                                             \
                if (!scratch) continue;                                                          \
                int64_t b = it / (KVH * num_splits), h = (it / num_splits) % KVH;               \
                int64_t sp = it % num_splits;                                                    \
                int64_t len = seq_lens[b];                                                       \
                int64_t first = window > 0 && len > window ? len - window : 0;                   \
                const int64_t per = split_keys;                                                  \
                int64_t s0 = first + sp * per, s1 = s0 + per < len ? s0 + per : len;             \
                float *base = part + it * G * (D + 2);                                           \
                State st = {base, base + G * D, base + G * D + G, scratch};                     \
                float *qf = scratch + G * KEY_BLOCK;                                             \
                const TYPE *qb = q + (b * H + h * G) * D;                                        \
                for (int64_t i = 0; i < G * D; i++) qf[i] = TO_F32(qb[i]);                       \
                for (int64_t r = 0; r < G; r++) { st.m[r] = -INFINITY; st.l[r] = 0.f; }          \
                memset(st.acc, 0, sizeof(float) * G * D);                                        \
                const int32_t *table = tables + b * table_stride;                                \
                const TYPE *kh = cache + h * head_stride, *vh = cache + kv_stride + h * head_stride; \
                int64_t pos = s0;                                                                \
                while (pos < s1) {                                                               \
                    int64_t blk = table[pos / BS];                                               \
                    if (blk < 0 || blk >= NB) {                                                  \
                        _Pragma("omp atomic write")                                              \
                        bad_block = 1;                                                           \
                        break;                                                                   \
                    }                                                                            \
                    int64_t slot = blk * BS + pos % BS;                                          \
                    int64_t n = BS - pos % BS;                                                   \
                    /* extend over following blocks stored right after this one */              \
                    while (n < KEY_BLOCK && pos + n < s1 && table[(pos + n) / BS] == blk + (n + pos % BS) / BS   \
                           && blk + (n + pos % BS) / BS < NB)                              \
                        n += BS;                                                                 \
                    if (n > KEY_BLOCK) n = KEY_BLOCK;                                            \
                    if (pos + n > s1) n = s1 - pos;                                              \
                    CHUNK(qf, kh + slot * D, vh + slot * D, n, G, D, scale, &st);                \
                    pos += n;                                                                    \
                }                                                                                \
            }                                                                                    \
            free(scratch);                                                                       \
        }                                                                                        \
        float *merged = (float *)malloc(sizeof(float) * D);                                      \
        if (failed || bad_block || !merged) {                                                    \
            free(part); free(merged); return failed || !merged ? 1 : 3;                          \
        }                                                                                        \
        for (int64_t bh = 0; bh < B * KVH; bh++) {                                               \
            int64_t b = bh / KVH, h = bh % KVH;                                                  \
            for (int64_t r = 0; r < G; r++) {                                                    \
                float mx = -INFINITY;                                                            \
                for (int64_t sp = 0; sp < num_splits; sp++) {                                    \
                    float *base = part + (bh * num_splits + sp) * G * (D + 2);                   \
                    float m = base[G * D + r];                                                   \
                    mx = m > mx ? m : mx;                                                        \
                }                                                                                \
                TYPE *o = out + (b * H + h * G + r) * D;                                         \
                if (mx == -INFINITY) { for (int64_t d = 0; d < D; d++) o[d] = FROM_F32(0.f); continue; } \
                float total = 0.f;                                                               \
                memset(merged, 0, sizeof(float) * D);                                            \
                for (int64_t sp = 0; sp < num_splits; sp++) {                                    \
                    float *base = part + (bh * num_splits + sp) * G * (D + 2);                   \
                    float m = base[G * D + r], l = base[G * D + G + r];                          \
                    if (m == -INFINITY) continue;                                                \
                    float w = expf(m - mx);                                                      \
                    total += w * l;                                                              \
                    for (int64_t d = 0; d < D; d++) merged[d] += w * base[r * D + d];            \
                }                                                                                \
                float inv = 1.f / total;                                                         \
                for (int64_t d = 0; d < D; d++) o[d] = FROM_F32(merged[d] * inv);                \
            }                                                                                    \
        }                                                                                        \
        free(part);                                                                              \
        free(merged);                                                                            \
        return 0;                                                                                \
    }
#define IDENTITY(x) (x)
DEFINE_PAGED(paged_decode_f32, float, chunk_f32, IDENTITY, IDENTITY)
DEFINE_PAGED(paged_decode_bf16, uint16_t, chunk_bf16, bf16_to_f32, f32_to_bf16)
