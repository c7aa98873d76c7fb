/* Prefill attention over the paged cache: the new tokens of each prefill segment of a step
 * attend causally to everything before them (a cached prefix and each other), read straight
 * from the pages, every segment of the step in one call.
 *
 * Shapes: query (T, H, D) float32 (token and head strides given, dims contiguous); cache
 * (2, KVH, NB, BS, D) float32 or float16, the segments' own keys and values already written;
 * segments (S, 3) int64 rows (first query row, new tokens n, context length); tables (S, W)
 * int32, row s covering positions 0 .. context + n - 1 of segment s; out (T, H, D) float32,
 * contiguous, written at the segments' rows. A segment's token i sits at position
 * p = context + i and sees keys [lo, p], lo = max(0, p - window + 1) with a window, else 0.
 *
 * The score and value products run 16 lanes wide (AVX-512F) where the CPU has it, else 8
 * (AVX2), with the same bits (pf_wide).
 *
 * GEMM-shaped blocking. A work item is one KV head and a tile of consecutive query positions
 * of a segment; its rows are (position, query head of the KV head's group) pairs, about
 * PF_ROWS_TARGET of them. Keys go by chunks of PF_KEYS positions aligned at multiples of
 * PF_KEYS. Each chunk's keys are widened to float32 once, transposed ((D, PF_KEYS): eight
 * keys per vector, so a score tile is broadcast-a-query-element, FMA-a-key-vector), and its
 * values once ((PF_KEYS, D)) -- for the whole segment before its items run where it has
 * several, else by the item -- then for all the item's rows: the scores (6 rows x 16 keys
 * in registers), an online softmax, and the values product (3 rows x 32 dims in registers).
 *
 * Batch invariance: every score is one FMA chain over d in order, every row's softmax and
 * values accumulate chunk by chunk at absolute chunk boundaries, and a chunk a row cannot see
 * leaves it bit for bit unchanged (probabilities 0, no rescale). A row's result therefore does
 * not depend on the tile, the threads, the other tokens of the step, or how a long prompt was
 * cut into chunked-prefill steps.
 *
 * softcap > 0 soft-caps each visible scaled score before the softmax (s -> softcap *
 * tanh(s / softcap), Gemma 2's attn_logit_softcapping); 0 leaves the scores as they are.
 *
 * Returns 0, 1 out of memory, 2 bad arguments (a table too short for its segment...), 3 a
 * block id outside [0, NB).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx2_util.h"

#define PF_KEYS 64
#define PF_ROWS_TARGET 48
#define PF_SCORE_ROWS 6
#define PF_VALUE_ROWS 3
#define PF_MAX_DIM 256
#define PF_MAX_PACKED_FLOATS (16 << 20) /* 64 MB */

typedef struct {
    float *q;      /* (rows, D) scaled queries, zero rows as padding */
    float *kt;     /* (D, PF_KEYS) the chunk's keys, transposed */
    float *v;      /* (PF_KEYS, D) the chunk's values */
    float *s;      /* (rows, PF_KEYS) scores, then probabilities */
    float *o;      /* (rows, D) unnormalised outputs */
    float *m;      /* (rows,) running max */
    float *l;      /* (rows,) running sum */
} PfScratch;

/* What every work item of one call reads. */
typedef struct {
    const float *query;                   /* (T, H, D), token and head strides below */
    int64_t q_token_stride, q_head_stride;
    const void *cache;                    /* (2, KVH, NB, BS, D) */
    int f16;                              /* the cache holds float16 (else float32) */
    float *out;                           /* (T, H, D) contiguous */
    int64_t H, KVH, G, D, NB, BS, window, tile; /* tile: query positions per item */
    float scale, softcap;                 /* softcap 0: no logit soft-capping */
    int wide;                             /* the AVX-512F products (pf_wide) */
} PfCall;

/* One prefill segment of the call. */
typedef struct {
    int64_t start, tokens, context_len; /* first query row, new tokens, cached before them */
    int64_t tiles, first_chunk, chunks; /* query tiles; chunks of keys the segment reads */
    const int32_t *table;               /* its row of the block tables */
    int64_t table_width;
    int64_t packed;                     /* offset of its widened chunks, -1: items widen */
} PfSegment;

static inline __m256 pf_load8(const void *base, int f16, int64_t index) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + index)));
    return _mm256_loadu_ps((const float *)base + index);
}

/* Transpose 8 vectors (rows r0..r7 of 8 floats) in place: afterwards r[i] holds column i. */
static inline void pf_transpose8(__m256 *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20); r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20); r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31); r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31); r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The chunk's keys (transposed) and values as float32; positions at or past `end` are zero. */
static int pf_pack_chunk(const PfCall *c, const PfSegment *g, int64_t kvh, int64_t start,
                         int64_t end, float *kt, float *v) {
    const void *cache = c->cache;
    const int f16 = c->f16;
    const int64_t D = c->D, NB = c->NB, BS = c->BS, page = BS * D, half = c->KVH * NB * page;
    for (int64_t j0 = 0; j0 < PF_KEYS; j0 += 8) {
        int64_t key_offset[8];
        for (int j = 0; j < 8; j++) {
            int64_t pos = start + j0 + j;
            key_offset[j] = -1;
            if (pos >= end) continue;
            int64_t b = pos / BS;
            if (b >= g->table_width) return 2;
            int64_t id = g->table[b];
            if (id < 0 || id >= NB) return 3;
            key_offset[j] = (kvh * NB + id) * page + (pos % BS) * D;
        }
        for (int64_t d = 0; d < D; d += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) {
                if (key_offset[j] < 0) {
                    r[j] = _mm256_setzero_ps();
                    _mm256_storeu_ps(v + (j0 + j) * D + d, r[j]);
                } else {
                    r[j] = pf_load8(cache, f16, key_offset[j] + d);
                    _mm256_storeu_ps(v + (j0 + j) * D + d, pf_load8(cache, f16, half + key_offset[j] + d));
                }
            }
            pf_transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(kt + (d + i) * PF_KEYS + j0, r[i]);
        }
    }
    return 0;
}

/* s[r][0:16] = q[r] . kt[:, 0:16] for 6 rows: one FMA chain over d per score. */
static inline void pf_scores_6x16(const float *q, int64_t D, const float *kt, float *s) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t d = 0; d < D; d++) {
        __m256 k0 = _mm256_loadu_ps(kt + d * PF_KEYS), k1 = _mm256_loadu_ps(kt + d * PF_KEYS + 8);
        __m256 b;
        b = _mm256_broadcast_ss(q + d);         c00 = _mm256_fmadd_ps(b, k0, c00); c01 = _mm256_fmadd_ps(b, k1, c01);
        b = _mm256_broadcast_ss(q + D + d);     c10 = _mm256_fmadd_ps(b, k0, c10); c11 = _mm256_fmadd_ps(b, k1, c11);
        b = _mm256_broadcast_ss(q + 2 * D + d); c20 = _mm256_fmadd_ps(b, k0, c20); c21 = _mm256_fmadd_ps(b, k1, c21);
        b = _mm256_broadcast_ss(q + 3 * D + d); c30 = _mm256_fmadd_ps(b, k0, c30); c31 = _mm256_fmadd_ps(b, k1, c31);
        b = _mm256_broadcast_ss(q + 4 * D + d); c40 = _mm256_fmadd_ps(b, k0, c40); c41 = _mm256_fmadd_ps(b, k1, c41);
        b = _mm256_broadcast_ss(q + 5 * D + d); c50 = _mm256_fmadd_ps(b, k0, c50); c51 = _mm256_fmadd_ps(b, k1, c51);
    }
    _mm256_storeu_ps(s, c00); _mm256_storeu_ps(s + 8, c01);
    _mm256_storeu_ps(s + PF_KEYS, c10); _mm256_storeu_ps(s + PF_KEYS + 8, c11);
    _mm256_storeu_ps(s + 2 * PF_KEYS, c20); _mm256_storeu_ps(s + 2 * PF_KEYS + 8, c21);
    _mm256_storeu_ps(s + 3 * PF_KEYS, c30); _mm256_storeu_ps(s + 3 * PF_KEYS + 8, c31);
    _mm256_storeu_ps(s + 4 * PF_KEYS, c40); _mm256_storeu_ps(s + 4 * PF_KEYS + 8, c41);
    _mm256_storeu_ps(s + 5 * PF_KEYS, c50); _mm256_storeu_ps(s + 5 * PF_KEYS + 8, c51);
}

/* o[r][0:32] += p[r][0:keys] @ v[0:keys, 0:32] for 3 rows, the 12 accumulators named (an
   array of them is kept on the stack by the compiler). */
static inline void pf_values_3x32(const float *p, const float *v, int64_t D, int keys, float *o) {
    __m256 a00 = _mm256_loadu_ps(o), a01 = _mm256_loadu_ps(o + 8);
    __m256 a02 = _mm256_loadu_ps(o + 16), a03 = _mm256_loadu_ps(o + 24);
    __m256 a10 = _mm256_loadu_ps(o + D), a11 = _mm256_loadu_ps(o + D + 8);
    __m256 a12 = _mm256_loadu_ps(o + D + 16), a13 = _mm256_loadu_ps(o + D + 24);
    __m256 a20 = _mm256_loadu_ps(o + 2 * D), a21 = _mm256_loadu_ps(o + 2 * D + 8);
    __m256 a22 = _mm256_loadu_ps(o + 2 * D + 16), a23 = _mm256_loadu_ps(o + 2 * D + 24);
    for (int j = 0; j < keys; j++) {
        const float *x = v + j * D;
        __m256 b0 = _mm256_broadcast_ss(p + j), b1 = _mm256_broadcast_ss(p + PF_KEYS + j);
        __m256 b2 = _mm256_broadcast_ss(p + 2 * PF_KEYS + j);
        __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
        a00 = _mm256_fmadd_ps(b0, x0, a00); a10 = _mm256_fmadd_ps(b1, x0, a10); a20 = _mm256_fmadd_ps(b2, x0, a20);
        a01 = _mm256_fmadd_ps(b0, x1, a01); a11 = _mm256_fmadd_ps(b1, x1, a11); a21 = _mm256_fmadd_ps(b2, x1, a21);
        __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
        a02 = _mm256_fmadd_ps(b0, x2, a02); a12 = _mm256_fmadd_ps(b1, x2, a12); a22 = _mm256_fmadd_ps(b2, x2, a22);
        a03 = _mm256_fmadd_ps(b0, x3, a03); a13 = _mm256_fmadd_ps(b1, x3, a13); a23 = _mm256_fmadd_ps(b2, x3, a23);
    }
    _mm256_storeu_ps(o, a00); _mm256_storeu_ps(o + 8, a01);
    _mm256_storeu_ps(o + 16, a02); _mm256_storeu_ps(o + 24, a03);
    _mm256_storeu_ps(o + D, a10); _mm256_storeu_ps(o + D + 8, a11);
    _mm256_storeu_ps(o + D + 16, a12); _mm256_storeu_ps(o + D + 24, a13);
    _mm256_storeu_ps(o + 2 * D, a20); _mm256_storeu_ps(o + 2 * D + 8, a21);
    _mm256_storeu_ps(o + 2 * D + 16, a22); _mm256_storeu_ps(o + 2 * D + 24, a23);
}

/* The same for 8 columns (head sizes that are not a multiple of 32). */
static inline void pf_values_3x8(const float *p, const float *v, int64_t D, int keys, float *o) {
    __m256 a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + D), a2 = _mm256_loadu_ps(o + 2 * D);
    for (int j = 0; j < keys; j++) {
        __m256 x = _mm256_loadu_ps(v + j * D);
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), x, a0);
        a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + PF_KEYS + j), x, a1);
        a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + 2 * PF_KEYS + j), x, a2);
    }
    _mm256_storeu_ps(o, a0); _mm256_storeu_ps(o + D, a1); _mm256_storeu_ps(o + 2 * D, a2);
}

/* The chunk's scores of 6 rows: s[r][0:64] = q[r] . kt[:, 0:64] (AVX2, 16 keys a pass). */
static void pf_scores_avx2(const float *q, int64_t D, const float *kt, float *s) {
    for (int c = 0; c < PF_KEYS; c += 16) pf_scores_6x16(q, D, kt + c, s + c);
}

/* AVX-512F forms of the two products, chosen at run time (pf_wide): 16 lanes where AVX2 has
   8. Each lane computes exactly what an AVX2 lane computes -- a score is one FMA chain over d
   from zero, an output one FMA chain over the keys in order -- so the bits are the same
   whichever form runs (tests/native/test_prefill_attention.py compares them). The softmax
   keeps its AVX2 code: its sums reduce across lanes. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
/* s[r][0:64] = q[r] . kt[:, 0:64] for 6 rows, 32 keys a pass (12 accumulators named). */
static void pf_scores_avx512(const float *q, int64_t D, const float *kt, float *s) {
    for (int c = 0; c < PF_KEYS; c += 32) {
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
        __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
        const float *k = kt + c;
        for (int64_t d = 0; d < D; d++) {
            __m512 k0 = _mm512_loadu_ps(k + d * PF_KEYS), k1 = _mm512_loadu_ps(k + d * PF_KEYS + 16);
            __m512 b;
            b = _mm512_set1_ps(q[d]);         c00 = _mm512_fmadd_ps(b, k0, c00); c01 = _mm512_fmadd_ps(b, k1, c01);
            b = _mm512_set1_ps(q[D + d]);     c10 = _mm512_fmadd_ps(b, k0, c10); c11 = _mm512_fmadd_ps(b, k1, c11);
            b = _mm512_set1_ps(q[2 * D + d]); c20 = _mm512_fmadd_ps(b, k0, c20); c21 = _mm512_fmadd_ps(b, k1, c21);
            b = _mm512_set1_ps(q[3 * D + d]); c30 = _mm512_fmadd_ps(b, k0, c30); c31 = _mm512_fmadd_ps(b, k1, c31);
            b = _mm512_set1_ps(q[4 * D + d]); c40 = _mm512_fmadd_ps(b, k0, c40); c41 = _mm512_fmadd_ps(b, k1, c41);
            b = _mm512_set1_ps(q[5 * D + d]); c50 = _mm512_fmadd_ps(b, k0, c50); c51 = _mm512_fmadd_ps(b, k1, c51);
        }
        float *o = s + c;
        _mm512_storeu_ps(o, c00); _mm512_storeu_ps(o + 16, c01);
        _mm512_storeu_ps(o + PF_KEYS, c10); _mm512_storeu_ps(o + PF_KEYS + 16, c11);
        _mm512_storeu_ps(o + 2 * PF_KEYS, c20); _mm512_storeu_ps(o + 2 * PF_KEYS + 16, c21);
        _mm512_storeu_ps(o + 3 * PF_KEYS, c30); _mm512_storeu_ps(o + 3 * PF_KEYS + 16, c31);
        _mm512_storeu_ps(o + 4 * PF_KEYS, c40); _mm512_storeu_ps(o + 4 * PF_KEYS + 16, c41);
        _mm512_storeu_ps(o + 5 * PF_KEYS, c50); _mm512_storeu_ps(o + 5 * PF_KEYS + 16, c51);
    }
}

/* o[r][0:64] += p[r][0:keys] @ v[0:keys, 0:64] for 3 rows (12 accumulators named). */
static void pf_values_3x64_avx512(const float *p, const float *v, int64_t D, int keys, float *o) {
    __m512 a00 = _mm512_loadu_ps(o), a01 = _mm512_loadu_ps(o + 16);
    __m512 a02 = _mm512_loadu_ps(o + 32), a03 = _mm512_loadu_ps(o + 48);
    __m512 a10 = _mm512_loadu_ps(o + D), a11 = _mm512_loadu_ps(o + D + 16);
    __m512 a12 = _mm512_loadu_ps(o + D + 32), a13 = _mm512_loadu_ps(o + D + 48);
    __m512 a20 = _mm512_loadu_ps(o + 2 * D), a21 = _mm512_loadu_ps(o + 2 * D + 16);
    __m512 a22 = _mm512_loadu_ps(o + 2 * D + 32), a23 = _mm512_loadu_ps(o + 2 * D + 48);
    for (int j = 0; j < keys; j++) {
        const float *x = v + j * D;
        __m512 b0 = _mm512_set1_ps(p[j]), b1 = _mm512_set1_ps(p[PF_KEYS + j]);
        __m512 b2 = _mm512_set1_ps(p[2 * PF_KEYS + j]);
        __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        a00 = _mm512_fmadd_ps(b0, x0, a00); a10 = _mm512_fmadd_ps(b1, x0, a10); a20 = _mm512_fmadd_ps(b2, x0, a20);
        a01 = _mm512_fmadd_ps(b0, x1, a01); a11 = _mm512_fmadd_ps(b1, x1, a11); a21 = _mm512_fmadd_ps(b2, x1, a21);
        __m512 x2 = _mm512_loadu_ps(x + 32), x3 = _mm512_loadu_ps(x + 48);
        a02 = _mm512_fmadd_ps(b0, x2, a02); a12 = _mm512_fmadd_ps(b1, x2, a12); a22 = _mm512_fmadd_ps(b2, x2, a22);
        a03 = _mm512_fmadd_ps(b0, x3, a03); a13 = _mm512_fmadd_ps(b1, x3, a13); a23 = _mm512_fmadd_ps(b2, x3, a23);
    }
    _mm512_storeu_ps(o, a00); _mm512_storeu_ps(o + 16, a01);
    _mm512_storeu_ps(o + 32, a02); _mm512_storeu_ps(o + 48, a03);
    _mm512_storeu_ps(o + D, a10); _mm512_storeu_ps(o + D + 16, a11);
    _mm512_storeu_ps(o + D + 32, a12); _mm512_storeu_ps(o + D + 48, a13);
    _mm512_storeu_ps(o + 2 * D, a20); _mm512_storeu_ps(o + 2 * D + 16, a21);
    _mm512_storeu_ps(o + 2 * D + 32, a22); _mm512_storeu_ps(o + 2 * D + 48, a23);
}

static void pf_values_avx512(const float *p, const float *v, int64_t D, int keys, float *o) {
    int64_t d = 0;
    for (; d + 64 <= D; d += 64) pf_values_3x64_avx512(p, v + d, D, keys, o + d);
    for (; d + 32 <= D; d += 32) pf_values_3x32(p, v + d, D, keys, o + d);
    for (; d < D; d += 8) pf_values_3x8(p, v + d, D, keys, o + d);
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* 0: choose by the CPU (AVX-512F where it has it); 1: AVX2 always (tests compare the two). */
static int pf_forced_avx2 = 0;

int prefill_attention_force_avx2(int on) {
    int was = pf_forced_avx2;
    pf_forced_avx2 = on != 0;
    return was;
}

/* Whether this call runs the AVX-512F products. */
static int pf_wide(void) {
    static int wide = -1;
    if (wide < 0) {
        __builtin_cpu_init();
        wide = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return wide && !pf_forced_avx2;
}

/* One row's online softmax over the chunk: keys [first, last) of it are visible (first < last).
   With softcap > 0 the visible scores are first soft-capped (s -> softcap * tanh(s / softcap),
   Gemma 2's attn_logit_softcapping); 0 runs exactly the uncapped code. Turns s into
   probabilities (0 where hidden), rescales the row's output, updates m and l. */
static inline void pf_softmax_row(float *s, int first, int last, float *m, float *l, float *o,
                                  int64_t D, float softcap) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    if (softcap > 0.0f)
        for (int j = first; j < last; j++) s[j] = softcap * tanhf(s[j] / softcap);
    for (int j = 0; j < first; j++) s[j] = -INFINITY;
    for (int j = last; j < PF_KEYS; j++) s[j] = -INFINITY;
    __m256 mx = neg_inf, unordered = _mm256_setzero_ps();
    for (int j = 0; j < PF_KEYS; j += 8) {
        __m256 x = _mm256_loadu_ps(s + j);
        mx = _mm256_max_ps(mx, x);
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float chunk_max = _mm_cvtss_f32(h), old = *m;
    if (_mm256_movemask_ps(unordered) || chunk_max == INFINITY) {
        /* a NaN or infinite score (a NaN query, an overflowed key): the row's result is NaN,
           as the softmax's is; it adds nothing to the values product */
        memset(s, 0, PF_KEYS * sizeof(float));
        *l = NAN;
        return;
    }
    float top = chunk_max > old ? chunk_max : old;
    __m256 t = _mm256_set1_ps(top), sum = _mm256_setzero_ps();
    for (int j = 0; j < PF_KEYS; j += 8) {
        __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), t));
        _mm256_storeu_ps(s + j, p);
        sum = _mm256_add_ps(sum, p);
    }
    if (top != old) {
        float alpha = expf(old - top); /* old = -inf on a row's first chunk: 0 */
        __m256 a = _mm256_set1_ps(alpha);
        for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), a));
        *l *= alpha;
        *m = top;
    }
    *l += hsum(sum);
}

static void pf_values_avx2(const float *p, const float *v, int64_t D, int keys, float *o) {
    int64_t d = 0;
    for (; d + 32 <= D; d += 32) pf_values_3x32(p, v + d, D, keys, o + d);
    for (; d < D; d += 8) pf_values_3x8(p, v + d, D, keys, o + d);
}

/* One work item: KV head kvh, tokens [first_token, first_token + tokens) of segment g. */
static int pf_item(const PfCall *c, const PfSegment *g, int64_t kvh, int64_t first_token,
                   int64_t tokens, const float *packed, PfScratch *w) {
    const int64_t G = c->G, D = c->D, window = c->window, context_len = g->context_len;
    const int64_t rows = tokens * G;
    const int64_t padded = (rows + PF_SCORE_ROWS - 1) / PF_SCORE_ROWS * PF_SCORE_ROWS;
    const float *query = c->query + g->start * c->q_token_stride;
    const __m256 sc = _mm256_set1_ps(c->scale);
    /* rows r = i * G + g: token first_token + i, head kvh * G + g */
    for (int64_t r = 0; r < padded; r++) {
        float *dst = w->q + r * D;
        if (r < rows) {
            const float *src = query + (first_token + r / G) * c->q_token_stride
                               + (kvh * G + r % G) * c->q_head_stride;
            for (int64_t d = 0; d < D; d += 8)
                _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), sc));
        } else {
            memset(dst, 0, (size_t)D * sizeof(float));
        }
        memset(w->o + r * D, 0, (size_t)D * sizeof(float));
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    const int64_t first_pos = context_len + first_token, last_pos = first_pos + tokens - 1;
    int64_t lo = window > 0 ? first_pos - window + 1 : 0;
    if (lo < 0) lo = 0;
    for (int64_t start = lo / PF_KEYS * PF_KEYS; start <= last_pos; start += PF_KEYS) {
        const float *kt = w->kt, *v = w->v;
        if (packed) { /* the segment's chunks, widened once for every item (pf_run) */
            kt = packed + (kvh * g->chunks + start / PF_KEYS - g->first_chunk) * 2 * PF_KEYS * D;
            v = kt + PF_KEYS * D;
        } else {
            int status = pf_pack_chunk(c, g, kvh, start, last_pos + 1, w->kt, w->v);
            if (status) return status;
        }
        for (int64_t r = 0; r < padded; r += PF_SCORE_ROWS)
            (c->wide ? pf_scores_avx512 : pf_scores_avx2)(w->q + r * D, D, kt, w->s + r * PF_KEYS);
        int keys = 0; /* keys of the chunk any row sees: the values product stops there */
        for (int64_t r = 0; r < padded; r++) {
            float *s = w->s + r * PF_KEYS;
            int64_t pos = first_pos + r / G;
            int64_t row_lo = window > 0 ? pos - window + 1 : 0;
            int64_t first = row_lo > start ? row_lo - start : 0;
            int64_t last = pos - start + 1;
            if (last > PF_KEYS) last = PF_KEYS;
            if (r >= rows || first >= last) { /* nothing visible: probabilities 0 */
                memset(s, 0, PF_KEYS * sizeof(float));
                continue;
            }
            pf_softmax_row(s, (int)first, (int)last, w->m + r, w->l + r, w->o + r * D, D,
                           c->softcap);
            if (last > keys) keys = (int)last;
        }
        for (int64_t r = 0; r < padded; r += PF_VALUE_ROWS)
            (c->wide ? pf_values_avx512 : pf_values_avx2)(w->s + r * PF_KEYS, v, D, keys,
                                                           w->o + r * D);
    }
    for (int64_t r = 0; r < rows; r++) {
        float *dst = c->out + (g->start + first_token + r / G) * c->H * D + (kvh * G + r % G) * D;
        const float *o = w->o + r * D;
        __m256 inv = _mm256_set1_ps(1.0f / w->l[r]); /* > 0: a row sees its own key */
        for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), inv));
    }
    return 0;
}

typedef struct {
    int64_t segment, tile, kvh, keys; /* keys: the most any row of the item sees (its cost) */
} PfItem;

static int pf_heavier_first(const void *a, const void *b) {
    const PfItem *x = a, *y = b;
    if (x->keys != y->keys) return x->keys > y->keys ? -1 : 1;
    return x->segment != y->segment ? (x->segment < y->segment ? -1 : 1)
                                    : (x->kvh < y->kvh ? -1 : x->kvh > y->kvh);
}

/* Every prefill segment of a step in one call: their items share the threads, heaviest
   first, so a step of many short segments (sessions sharing a prompt, each adding a turn)
   keeps both cores busy. segments: (S, 3) int64 rows (first query row, new tokens, context
   length); tables: (S, W) int32, row s covering its segment's context + new tokens. */
static int pf_run(const float *query, int64_t q_token_stride, int64_t q_head_stride,
                  const void *cache, int f16, const int64_t *segments, int64_t S,
                  const int32_t *tables, int64_t W, float *out, int64_t H, int64_t KVH,
                  int64_t D, int64_t NB, int64_t BS, int64_t window, float scale,
                  float softcap, int num_threads) {
    if (S <= 0 || KVH <= 0 || H < KVH || H % KVH || D <= 0 || D % 8 || D > PF_MAX_DIM || BS <= 0
        || W <= 0 || window < 0)
        return 2;
    const int64_t G = H / KVH;
    int64_t tile = PF_ROWS_TARGET / G;
    if (tile < 1) tile = 1;
    const PfCall call = {query, q_token_stride, q_head_stride, cache, f16, out,
                         H, KVH, G, D, NB, BS, window, tile, scale,
                         softcap > 0.0f ? softcap : 0.0f, pf_wide()};
    const int64_t padded = (tile * G + PF_SCORE_ROWS - 1) / PF_SCORE_ROWS * PF_SCORE_ROWS;
    const int64_t pack_floats = 2 * PF_KEYS * D;
    PfSegment *segs = malloc((size_t)S * sizeof(PfSegment));
    if (!segs) return 1;
    int64_t items = 0, packs = 0;
    for (int64_t i = 0; i < S; i++) {
        PfSegment *g = segs + i;
        g->start = segments[3 * i];
        g->tokens = segments[3 * i + 1];
        g->context_len = segments[3 * i + 2];
        g->table = tables + i * W;
        g->table_width = W;
        if (g->start < 0 || g->tokens <= 0 || g->context_len < 0
            || W * BS < g->context_len + g->tokens) {
            free(segs);
            return 2;
        }
        int64_t lo = window > 0 ? g->context_len - window + 1 : 0;
        g->tiles = (g->tokens + tile - 1) / tile;
        g->first_chunk = (lo > 0 ? lo : 0) / PF_KEYS;
        g->chunks = (g->context_len + g->tokens - 1) / PF_KEYS + 1 - g->first_chunk;
        g->packed = -1;
        /* Each chunk's keys and values widened once for all the segment's items, where it
           has more than one tile and the buffer stays bounded (else items widen their own). */
        if (g->tiles > 1 && (packs + KVH * g->chunks) * pack_floats <= PF_MAX_PACKED_FLOATS) {
            g->packed = packs;
            packs += KVH * g->chunks;
        }
        items += g->tiles * KVH;
    }
    PfItem *list = malloc((size_t)items * sizeof(PfItem));
    float *packed = packs ? aligned_alloc(64, (size_t)(packs * pack_floats) * sizeof(float)) : NULL;
    int64_t *pack_owner = packs ? malloc((size_t)packs * sizeof(int64_t)) : NULL;
    if (!list || (packs && (!packed || !pack_owner))) {
        free(segs); free(list); free(packed); free(pack_owner);
        return 1;
    }
    for (int64_t i = 0, k = 0; i < S; i++) {
        const PfSegment *g = segs + i;
        for (int64_t t = 0; t < g->tiles; t++)
            for (int64_t kvh = 0; kvh < KVH; kvh++, k++) {
                int64_t last = g->context_len + (t + 1) * tile;
                list[k] = (PfItem){i, t, kvh, last < g->context_len + g->tokens ? last
                                                 : g->context_len + g->tokens};
            }
        for (int64_t j = 0; g->packed >= 0 && j < KVH * g->chunks; j++) pack_owner[g->packed + j] = i;
    }
    qsort(list, (size_t)items, sizeof(PfItem), pf_heavier_first);
    if (num_threads < 1) num_threads = 1;
    int status = 0;
    if (packs) {
        int threads = num_threads > packs ? (int)packs : num_threads;
        _Pragma("omp parallel for num_threads(threads) schedule(static)")
        for (int64_t i = 0; i < packs; i++) {
            const PfSegment *g = segs + pack_owner[i];
            int64_t local = i - g->packed;
            float *kt = packed + i * pack_floats;
            int s = pf_pack_chunk(&call, g, local / g->chunks,
                                  (g->first_chunk + local % g->chunks) * PF_KEYS,
                                  g->context_len + g->tokens, kt, kt + PF_KEYS * D);
            if (s) {
                _Pragma("omp atomic write")
                status = s;
            }
        }
    }
    if (num_threads > items) num_threads = (int)items;
    if (!status) {
        _Pragma("omp parallel num_threads(num_threads)")
        {
            PfScratch w = {0};
            size_t floats = (size_t)(padded * D * 2 + D * PF_KEYS * 2 + padded * PF_KEYS + padded * 2);
            float *buffer = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
            if (!buffer) {
                _Pragma("omp atomic write")
                status = 1;
            } else {
                w.q = buffer;
                w.o = w.q + padded * D;
                w.kt = w.o + padded * D;
                w.v = w.kt + D * PF_KEYS;
                w.s = w.v + PF_KEYS * D;
                w.m = w.s + padded * PF_KEYS;
                w.l = w.m + padded;
            }
            /* every thread enters the loop (a team must), one without scratch takes nothing */
            _Pragma("omp for schedule(dynamic, 1)")
            for (int64_t k = 0; k < items; k++) {
                if (!buffer) continue;
                const PfSegment *g = segs + list[k].segment;
                int64_t first = list[k].tile * tile;
                int64_t count = g->tokens - first < tile ? g->tokens - first : tile;
                int s = pf_item(&call, g, list[k].kvh, first, count,
                                g->packed >= 0 ? packed + g->packed * pack_floats : NULL, &w);
                if (s) {
                    _Pragma("omp atomic write")
                    status = s;
                }
            }
            free(buffer);
        }
    }
    free(segs); free(list); free(packed); free(pack_owner);
    return status;
}

int prefill_attention_f32(const float *query, int64_t q_token_stride, int64_t q_head_stride,
                          const float *cache, const int64_t *segments, int64_t num_segments,
                          const int32_t *tables, int64_t table_width, float *out, int64_t H,
                          int64_t KVH, int64_t D, int64_t NB, int64_t BS, int64_t window,
                          float scale, float softcap, int num_threads) {
    return pf_run(query, q_token_stride, q_head_stride, cache, 0, segments, num_segments, tables,
                  table_width, out, H, KVH, D, NB, BS, window, scale, softcap, num_threads);
}

int prefill_attention_f32_f16kv(const float *query, int64_t q_token_stride,
                                int64_t q_head_stride, const uint16_t *cache,
                                const int64_t *segments, int64_t num_segments,
                                const int32_t *tables, int64_t table_width, float *out,
                                int64_t H, int64_t KVH, int64_t D, int64_t NB, int64_t BS,
                                int64_t window, float scale, float softcap,
                                int num_threads) {
    return pf_run(query, q_token_stride, q_head_stride, cache, 1, segments, num_segments, tables,
                  table_width, out, H, KVH, D, NB, BS, window, scale, softcap, num_threads);
}
