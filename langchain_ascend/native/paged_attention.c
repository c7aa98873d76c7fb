/* Paged decode attention: one query token per request over its blocks of the paged cache,
 * every request of the step in one call. AVX2 + FMA, OpenMP; float32 or bfloat16 cache.
 *
 * It is the CPU's only attention kernel: a prefill's tokens are rows too, each the one-row
 * decode at its position (its own length, its segment's table), so a token's keys, values and
 * output have the same bits whether it was prefilled or decoded (attention/backends/cpu.py).
 * A call whose rows share one table row (block table stride 0: a prefill segment's tokens)
 * groups its rows by their first key alone: they read the same slots as far as each goes, so
 * one item walks the chunks up to its longest member and a member that ends inside a chunk
 * sees its own first keys only (its other scores get probability 0, which adds exact zeros:
 * the bits it gets alone). Items hold at most ROWS_PER_ITEM query rows, so a long prefill's
 * item attends its chunks with its accumulators in cache and its tiles spread over the team.
 *
 * Cache of one layer: (2, KVH, NB, BS, D) -- keys then values, per KV head NB blocks of BS
 * rows of D values (the torch_ref / cpu backends' layout). Request b attends the first
 * seq_lens[b] slots named by its row of the int32 block table (B, W); with a sliding window
 * only the last `window` of them (window 0: all).
 *
 * Each row's keys are cut into fixed ranges of split_keys keys from the row's first key, so a
 * row's rounding never depends on the other rows of the call: batched and solo decodes give
 * the same bits. In each range the rows that read the same slots -- the same positions and
 * block ids, e.g. decodes sharing a cached prefix such as an agent's system prompt, or the
 * rows of one speculative verify pass -- form one work item, which walks those keys once and
 * lets every member attend each chunk while it is in cache: shared blocks are read once per
 * step, not once per row, and each member still runs exactly the chunks it runs alone. Items
 * times KVH heads are spread over the calling team (team.h: the decode stack's, or the region
 * the _softcap entries open over torch's libgomp pool, see build.py), largest first.
 *
 * A member holds the G = H / KVH query rows of its KV head in float32; an item walks its
 * keys in chunks of KEY_BLOCK positions, each read block by block, and all its members' rows
 * attend each chunk together: scores in row pairs, one online-softmax update per row (running
 * max / sum / weighted value sum), values three rows at a time with the accumulators in
 * registers. No row's bits depend on the rows it is grouped with (each score is reduced by one
 * fixed tree, each output is a chain of FMAs in key order), so requests may share a group.
 * Chunks follow positions, never where the blocks lie in the cache: a prefix block the pool
 * moved, or a request whose blocks are not consecutive, gives the same bits as consecutive
 * blocks. A row's ranges are merged by their log-sum-exp at the end, in range order. The
 * step's K/V must already be in the cache (the caller writes them first).
 *
 * The _softcap entries soft-cap each scaled score before the online softmax (s -> softcap *
 * tanh(s / softcap), Gemma 2's attn_logit_softcapping; 0: none, exactly the uncapped code);
 * decode_stack.c calls the _team bodies with 0 inside its own region.
 *
 * Queries and outputs are (B, H, D) in the cache's dtype; bfloat16 outputs are rounded to
 * nearest even. paged_decode_f32_f16kv reads a float16 cache with float32 queries and outputs
 * (half the bytes per key of a float32 cache; F16C widens them exactly). Return codes: 0
 * success, 1 out of memory, 2 D not a multiple of 8 or H not a multiple of KVH, 3 a block id
 * outside [0, NB).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16_util.h"
#include "team.h"

#define KEY_BLOCK 64
#define ROWS_PER_ITEM 48 /* query rows (members x G) an item attends together, at most */
#define MAX_MEMBERS ROWS_PER_ITEM /* an item's members: ROWS_PER_ITEM / G, at least 1 */
#define MAX_ITEM_ROWS 1024 /* an item's query rows: G where one member holds more than 48 */

/* 8 stored values at p as floats. */
static inline __m256 load_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Online-softmax state of one query row: acc (D) unnormalised output, m its running max, l its
   running sum. */
typedef struct {
    float *acc, *m, *l;
} Row;

/* Scores of a pair of rows (4 keys at a time, each key load serving both rows) or of one row
   (8 keys at a time) against n keys, scaled, into row0 / row1. Every score is its 8-lane dot
   product reduced by hsum8x8's tree (a tail's missing keys are zero sums), so a row's scores
   have the same bits whichever rows it is paired with: rows may be paired across requests. */
#define DEFINE_SCORES(NAME, TYPE, LOAD)                                                          \
    static inline void NAME##_pair(const float *q0, const float *q1, const TYPE *k, int64_t n,  \
                                   int64_t D, float scale, float *row0, float *row1) {          \
        const __m256 vscale = _mm256_set1_ps(scale);                                             \
        for (int64_t j = 0; j < n; j += 4) {                                                     \
            int cnt = n - j < 4 ? (int)(n - j) : 4;                                              \
            __m256 a[8];                                                                         \
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();                              \
            if (cnt == 4) {                                                                      \
                for (int64_t d = 0; d < D; d += 8) {                                             \
                    __m256 x0 = _mm256_loadu_ps(q0 + d), x1 = _mm256_loadu_ps(q1 + d);           \
                    for (int i = 0; i < 4; i++) {                                                \
                        __m256 kv = LOAD(k + (j + i) * D + d);                                   \
                        a[i] = _mm256_fmadd_ps(x0, kv, a[i]);                                    \
                        a[4 + i] = _mm256_fmadd_ps(x1, kv, a[4 + i]);                            \
                    }                                                                            \
                }                                                                                \
            } else {                                                                             \
                for (int i = 0; i < cnt; i++)                                                    \
                    for (int64_t d = 0; d < D; d += 8) {                                         \
                        __m256 kv = LOAD(k + (j + i) * D + d);                                   \
                        a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), kv, a[i]);               \
                        a[4 + i] = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), kv, a[4 + i]);       \
                    }                                                                            \
            }                                                                                    \
            __m256 s8 = _mm256_mul_ps(                                                           \
                hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), vscale);                \
            if (cnt == 4) {                                                                      \
                _mm_storeu_ps(row0 + j, _mm256_castps256_ps128(s8));                             \
                _mm_storeu_ps(row1 + j, _mm256_extractf128_ps(s8, 1));                           \
            } else {                                                                             \
                float sums[8];                                                                   \
                _mm256_storeu_ps(sums, s8);                                                      \
                for (int i = 0; i < cnt; i++) { row0[j + i] = sums[i]; row1[j + i] = sums[4 + i]; } \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    static inline void NAME##_one(const float *q0, const TYPE *k, int64_t n, int64_t D,         \
                                  float scale, float *row0) {                                    \
        const __m256 vscale = _mm256_set1_ps(scale);                                             \
        for (int64_t j = 0; j < n; j += 8) {                                                     \
            int cnt = n - j < 8 ? (int)(n - j) : 8;                                              \
            __m256 a[8];                                                                         \
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();                              \
            if (cnt == 8) {                                                                      \
                for (int64_t d = 0; d < D; d += 8) {                                             \
                    __m256 x0 = _mm256_loadu_ps(q0 + d);                                         \
                    for (int i = 0; i < 8; i++)                                                  \
                        a[i] = _mm256_fmadd_ps(x0, LOAD(k + (j + i) * D + d), a[i]);             \
                }                                                                                \
            } else {                                                                             \
                for (int i = 0; i < cnt; i++)                                                    \
                    for (int64_t d = 0; d < D; d += 8)                                           \
                        a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), LOAD(k + (j + i) * D + d), \
                                               a[i]);                                            \
            }                                                                                    \
            __m256 s8 = _mm256_mul_ps(                                                           \
                hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), vscale);                \
            if (cnt == 8) {                                                                      \
                _mm256_storeu_ps(row0 + j, s8);                                                  \
            } else {                                                                             \
                float sums[8];                                                                   \
                _mm256_storeu_ps(sums, s8);                                                      \
                for (int i = 0; i < cnt; i++) row0[j + i] = sums[i];                             \
            }                                                                                    \
        }                                                                                        \
    }

/* acc (1, 2 or 3 rows of D) += p (n weights per row) @ v (n rows of D), W vectors of 8 columns
   at a time (32 columns, then 8 for the rest of D; each value load serving every row of the
   group, the group's accumulators in registers). Each output is a chain of FMAs in key order,
   so a row's bits do not depend on its group. */
#define VALUES_COLUMNS(W, ROWS, LOAD)                                                            \
    {                                                                                            \
        __m256 o[ROWS][W];                                                                       \
        for (int r = 0; r < ROWS; r++)                                                           \
            for (int i = 0; i < W; i++) o[r][i] = _mm256_loadu_ps(acc[r] + d + 8 * i);           \
        for (int64_t j = 0; j < n; j++) {                                                        \
            __m256 wt[ROWS];                                                                     \
            for (int r = 0; r < ROWS; r++) wt[r] = _mm256_broadcast_ss(p[r] + j);                \
            for (int i = 0; i < W; i++) {                                                        \
                __m256 vv = LOAD(v + j * D + d + 8 * i);                                         \
                for (int r = 0; r < ROWS; r++) o[r][i] = _mm256_fmadd_ps(wt[r], vv, o[r][i]);    \
            }                                                                                    \
        }                                                                                        \
        for (int r = 0; r < ROWS; r++)                                                           \
            for (int i = 0; i < W; i++) _mm256_storeu_ps(acc[r] + d + 8 * i, o[r][i]);           \
    }
#define DEFINE_VALUES_ROWS(NAME, TYPE, LOAD, ROWS)                                               \
    static inline void NAME(const float *const *p, const TYPE *v, int64_t n, int64_t D,         \
                            float *const *acc) {                                                 \
        int64_t d = 0;                                                                           \
        for (; d + 32 <= D; d += 32) VALUES_COLUMNS(4, ROWS, LOAD)                               \
        for (; d < D; d += 8) VALUES_COLUMNS(1, ROWS, LOAD)                                      \
    }
#define DEFINE_VALUES(NAME, TYPE, LOAD)                                                          \
    DEFINE_VALUES_ROWS(NAME##_one, TYPE, LOAD, 1)                                                \
    DEFINE_VALUES_ROWS(NAME##_pair, TYPE, LOAD, 2)                                               \
    DEFINE_VALUES_ROWS(NAME##_three, TYPE, LOAD, 3)

/* Online-softmax update of one row after its n scores were written to sc: the scores become
   weights exp(s - new max), the row's sum and output are rescaled. */
static inline void softmax_update(float *sc, int64_t n, int64_t D, const Row *rw) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sc + j));
    float lanes[8], bm = -INFINITY;
    _mm256_storeu_ps(lanes, vmax);
    for (int i = 0; i < 8; i++) bm = lanes[i] > bm ? lanes[i] : bm;
    for (; j < n; j++) bm = sc[j] > bm ? sc[j] : bm;
    float nm = *rw->m > bm ? *rw->m : bm;
    float alpha = *rw->m == -INFINITY ? 0.f : expf(*rw->m - nm);
    __m256 vnm = _mm256_set1_ps(nm), vsum = _mm256_setzero_ps();
    float sum = 0.f;
    j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vnm));
        _mm256_storeu_ps(sc + j, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    for (; j < n; j++) { float p = expf(sc[j] - nm); sc[j] = p; sum += p; }
    *rw->l = *rw->l * alpha + hsum(vsum) + sum;
    *rw->m = nm;
    if (alpha != 1.f) {
        __m256 va = _mm256_set1_ps(alpha);
        for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(rw->acc + d, _mm256_mul_ps(_mm256_loadu_ps(rw->acc + d), va));
    }
}

/* Logit soft-capping of one row's n scaled scores: s -> cap * tanh(s / cap) (Gemma 2's
   attn_logit_softcapping), before the online softmax. Only called with cap > 0, so the
   uncapped path runs exactly the code it runs without it. */
static inline void softcap_scores(float *sc, int64_t n, float cap) {
    for (int64_t j = 0; j < n; j++) sc[j] = cap * tanhf(sc[j] / cap);
}

/* The keys and values of one chunk, one piece per cache block it touches: np pieces of
   n[p] consecutive rows at k[p] / v[p] (rows of D values of the cache's type). */
typedef struct {
    const void *k[KEY_BLOCK], *v[KEY_BLOCK];
    int64_t n[KEY_BLOCK];
    int np;
} Pieces;

/* Attend the R query rows qf (R, D) of one item (every member's G rows) over the chunk's
   n <= KEY_BLOCK keys: the scores of all rows (in pairs, a last odd row alone) piece by piece
   into sc (R, KEY_BLOCK), each row's online-softmax update, then the values piece by piece in
   groups of three rows. A piece's keys group exactly as they would in one contiguous run
   (pieces start on block boundaries, whole multiples of 8 keys into the chunk for the block
   sizes used), the values accumulate in key order, and no row's bits depend on the rows it is
   grouped with: the result depends neither on where the blocks lie in the cache nor on the
   other requests of the call. */
#define DEFINE_CHUNK(NAME, TYPE, LOAD)                                                           \
    DEFINE_SCORES(NAME##_scores, TYPE, LOAD)                                                     \
    DEFINE_VALUES(NAME##_values, TYPE, LOAD)                                                     \
    static void NAME(const float *qf, const Pieces *pc, int64_t n, int64_t R, int64_t D,        \
                     float scale, float softcap, float *sc, const Row *rows,                     \
                     const int64_t *keys) {                                                      \
        for (int p = 0, off = 0; p < pc->np; off += (int)pc->n[p], p++) {                        \
            const TYPE *k = (const TYPE *)pc->k[p];                                              \
            int64_t r = 0;                                                                       \
            for (; r + 2 <= R; r += 2)                                                           \
                NAME##_scores_pair(qf + r * D, qf + (r + 1) * D, k, pc->n[p], D, scale,         \
                                   sc + r * KEY_BLOCK + off, sc + (r + 1) * KEY_BLOCK + off);    \
            if (r < R)                                                                           \
                NAME##_scores_one(qf + r * D, k, pc->n[p], D, scale, sc + r * KEY_BLOCK + off);  \
        }                                                                                        \
        if (softcap > 0.f)                                                                       \
            for (int64_t r = 0; r < R; r++) softcap_scores(sc + r * KEY_BLOCK, n, softcap);      \
        for (int64_t r = 0; r < R; r++) { /* keys: row r sees only its first keys[r] */          \
            int64_t seen = keys ? keys[r] : n;                                                   \
            softmax_update(sc + r * KEY_BLOCK, seen, D, rows + r);                               \
            for (int64_t j = seen; j < n; j++) sc[r * KEY_BLOCK + j] = 0.f; /* adds exact 0s */  \
        }                                                                                        \
        for (int p = 0, off = 0; p < pc->np; off += (int)pc->n[p], p++) {                        \
            const TYPE *v = (const TYPE *)pc->v[p];                                              \
            int64_t r = 0, m = pc->n[p];                                                         \
            for (; r < R; r += 3) {                                                              \
                const float *w[3];                                                               \
                float *acc[3];                                                                   \
                for (int i = 0; i < 3 && r + i < R; i++) {                                       \
                    w[i] = sc + (r + i) * KEY_BLOCK + off;                                       \
                    acc[i] = rows[r + i].acc;                                                    \
                }                                                                                \
                if (r + 3 <= R) NAME##_values_three(w, v, m, D, acc);                            \
                else if (r + 2 == R) NAME##_values_pair(w, v, m, D, acc);                        \
                else NAME##_values_one(w, v, m, D, acc);                                         \
            }                                                                                    \
        }                                                                                        \
    }
DEFINE_CHUNK(chunk_f32, float, load_f32)
DEFINE_CHUNK(chunk_bf16, uint16_t, load_bf16x8)
DEFINE_CHUNK(chunk_f16, uint16_t, load_f16x8)


/* What every work item of one call reads. */
typedef struct {
    const int32_t *tables;
    const int64_t *seq_lens;
    int64_t table_stride, B, H, KVH, D, NB, BS, G, window, split_keys, num_splits;
    float scale, softcap; /* softcap 0: no soft-capping */
} Call;

/* A work item before its KV head is chosen: the rows rows[first .. first + count) that read
   the same slots in key range sp. */
typedef struct {
    int64_t sp, first, count;
} Item;

/* Key range [s0, s1) of row b in range sp, split_keys keys from its first key (s0 >= s1:
   the row has no key there). */
static inline void row_range(const Call *c, int64_t b, int64_t sp, int64_t *s0, int64_t *s1) {
    int64_t len = c->seq_lens[b];
    int64_t first = c->window > 0 && len > c->window ? len - c->window : 0;
    *s0 = first + sp * c->split_keys;
    *s1 = *s0 + c->split_keys < len ? *s0 + c->split_keys : len;
}

/* Whether rows a and b read the same slots in range sp: the same positions and the same
   block ids over them (so the same chunks, key for key). The last block first: the one a
   private tail differs in. */
static int same_range(const Call *c, int64_t a, int64_t b, int64_t sp) {
    int64_t a0, a1, b0, b1;
    row_range(c, a, sp, &a0, &a1);
    row_range(c, b, sp, &b0, &b1);
    if (a0 != b0 || a1 != b1) return 0;
    const int32_t *ta = c->tables + a * c->table_stride, *tb = c->tables + b * c->table_stride;
    int64_t lo = a0 / c->BS, hi = (a1 - 1) / c->BS;
    if (ta[hi] != tb[hi]) return 0;
    for (int64_t i = lo; i < hi; i++)
        if (ta[i] != tb[i]) return 0;
    return 1;
}

/* Whether rows a and b of a call over one table start range sp at the same key. */
static int same_first_key(const Call *c, int64_t a, int64_t b, int64_t sp) {
    int64_t a0, a1, b0, b1;
    row_range(c, a, sp, &a0, &a1);
    row_range(c, b, sp, &b0, &b1);
    return a0 == b0;
}

/* A hash of the slots row b reads in [s0, s1): the range and the block ids over it (rows that
   read the same slots hash alike; same_range decides). */
static uint64_t range_hash(const Call *c, int64_t b, int64_t s0, int64_t s1) {
    const int32_t *t = c->tables + b * c->table_stride;
    uint64_t h = ((uint64_t)s0 * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)s1 + 0x632BE59BD9B4E019ull);
    for (int64_t i = s0 / c->BS; i <= (s1 - 1) / c->BS; i++)
        h = (h ^ (uint32_t)t[i]) * 0x100000001B3ull;
    return h;
}

/* Larger items first (they are scheduled dynamically: the long ones start early). */
static int by_count_desc(const void *x, const void *y) {
    const Item *a = x, *b = y;
    if (a->count != b->count) return a->count > b->count ? -1 : 1;
    if (a->sp != b->sp) return a->sp < b->sp ? -1 : 1;
    return a->first < b->first ? -1 : a->first > b->first;
}

/* The call's items: in each key range, rows that read the same slots (decodes sharing a
   cached prefix, a verify pass's rows) form one item, so those keys are read once for all of
   them; each row still runs exactly the chunks it runs alone. rows (B * num_splits) receives
   the members, items (B * num_splits) the items. Returns the number of items, -1 when out of
   memory. */
static int64_t group_rows(const Call *c, int64_t *rows, Item *items) {
    int64_t cap = 16;  /* open addressing, at most half full: a prefill's rows mostly differ */
    while (cap < 2 * c->B) cap <<= 1;
    int64_t *leader = (int64_t *)malloc(sizeof(int64_t) * c->B);
    int64_t *gid = (int64_t *)malloc(sizeof(int64_t) * c->B);
    uint64_t *ghash = (uint64_t *)malloc(sizeof(uint64_t) * c->B);
    int64_t *slot = (int64_t *)malloc(sizeof(int64_t) * cap);
    if (!leader || !gid || !ghash || !slot) {
        free(leader); free(gid); free(ghash); free(slot);
        return -1;
    }
    /* One table for every row (a prefill's tokens): rows from the same first key read the
       same slots as far as each goes, and share an item (see DEFINE_ITEM). */
    const int shared = c->table_stride == 0;
    int64_t n_items = 0, placed = 0;
    for (int64_t sp = 0; sp < c->num_splits; sp++) {
        int64_t groups = 0;
        for (int64_t i = 0; i < cap; i++) slot[i] = -1;
        for (int64_t b = 0; b < c->B; b++) {
            int64_t s0, s1, g;
            row_range(c, b, sp, &s0, &s1);
            gid[b] = -1;
            if (s0 >= s1) continue;
            uint64_t hv = shared ? (uint64_t)s0 * 0x9E3779B97F4A7C15ull : range_hash(c, b, s0, s1);
            int64_t at = (int64_t)(hv & (uint64_t)(cap - 1));
            while ((g = slot[at]) >= 0
                   && !(ghash[g] == hv && (shared ? same_first_key(c, leader[g], b, sp)
                                                  : same_range(c, leader[g], b, sp))))
                at = (at + 1) & (cap - 1);
            if (g < 0) {
                g = groups++;
                leader[g] = b;
                ghash[g] = hv;
                slot[at] = g;
            }
            gid[b] = g;
        }
        Item *mine = items + n_items;
        for (int64_t g = 0; g < groups; g++) mine[g] = (Item){sp, 0, 0};
        for (int64_t b = 0; b < c->B; b++)
            if (gid[b] >= 0) mine[gid[b]].count++;
        for (int64_t g = 0; g < groups; g++) {
            mine[g].first = placed;
            leader[g] = placed;  /* now the next free place of group g */
            placed += mine[g].count;
        }
        for (int64_t b = 0; b < c->B; b++)
            if (gid[b] >= 0) rows[leader[gid[b]]++] = b;
        n_items += groups;
    }
    free(leader);
    free(gid);
    free(ghash);
    free(slot);
    /* Tiles of members: an item's accumulators stay in cache while it walks its chunks, and
       the tiles of a long prefill spread over the team (a row's bits never depend on them). */
    const int64_t tile = ROWS_PER_ITEM / c->G > 0 ? ROWS_PER_ITEM / c->G : 1;
    for (int64_t i = 0; i < n_items; i++)
        if (items[i].count > tile) {
            items[n_items++] = (Item){items[i].sp, items[i].first + tile, items[i].count - tile};
            items[i].count = tile;
        }
    qsort(items, (size_t)n_items, sizeof(Item), by_count_desc);
    return n_items;
}

/* One item on KV head h: each member's G row states (in part, at its row's place) and float
   query rows (qf, count * G * D), then the item's chunks, each attended by all count * G rows
   at once while its keys are in cache. sc holds count * G * KEY_BLOCK scores. Returns 0, or 3
   on a block id outside the cache. */
#define DEFINE_ITEM(NAME, QTYPE, TYPE, CHUNK, TO_F32)                                            \
    static int NAME(const Call *c, const QTYPE *q, const TYPE *cache, const Item *item,         \
                    const int64_t *rows, int64_t h, float *part, float *sc, float *qf,           \
                    Row *rs) {                                                                   \
        const int64_t G = c->G, D = c->D, BS = c->BS, NB = c->NB, count = item->count;           \
        int64_t member[MAX_MEMBERS], ends[MAX_MEMBERS], keys[MAX_ITEM_ROWS], s0, s1;             \
        if (count > MAX_MEMBERS || count * G > MAX_ITEM_ROWS) return 2;                          \
        for (int64_t i = 0; i < count; i++) { /* members by the end of their keys */            \
            int64_t b = rows[item->first + i], j = i;                                            \
            row_range(c, b, item->sp, &s0, &s1);                                                 \
            for (; j > 0 && ends[j - 1] > s1; j--) {                                             \
                member[j] = member[j - 1];                                                       \
                ends[j] = ends[j - 1];                                                           \
            }                                                                                    \
            member[j] = b;                                                                       \
            ends[j] = s1;                                                                        \
        }                                                                                        \
        for (int64_t i = 0; i < count; i++) {                                                    \
            int64_t b = member[i];                                                               \
            float *base = part + ((b * c->KVH + h) * c->num_splits + item->sp) * G * (D + 2);    \
            for (int64_t r = 0; r < G; r++) {                                                    \
                rs[i * G + r] = (Row){base + r * D, base + G * D + r, base + G * D + G + r};     \
                *rs[i * G + r].m = -INFINITY;                                                    \
                *rs[i * G + r].l = 0.f;                                                          \
            }                                                                                    \
            const QTYPE *qb = q + (b * c->H + h * G) * D;                                        \
            float *qi = qf + i * G * D;                                                          \
            for (int64_t j = 0; j < G * D; j++) qi[j] = TO_F32(qb[j]);                           \
            memset(base, 0, sizeof(float) * G * D);                                              \
        }                                                                                        \
        const int32_t *table = c->tables + member[count - 1] * c->table_stride;                  \
        const int64_t head_stride = NB * BS * D, last = ends[count - 1];                         \
        const TYPE *kh = cache + h * head_stride, *vh = cache + (c->KVH + h) * head_stride;      \
        int64_t pos = s0, first = 0; /* s0: every member's first key (group_rows) */             \
        while (pos < last) {                                                                     \
            /* chunks of KEY_BLOCK keys by position alone, cut into pieces at block bounds */   \
            int64_t n = last - pos < KEY_BLOCK ? last - pos : KEY_BLOCK;                         \
            while (ends[first] <= pos) first++; /* members whose keys ended before */           \
            Pieces pc;                                                                           \
            pc.np = 0;                                                                           \
            for (int64_t at = pos; at < pos + n;) {                                              \
                int64_t blk = table[at / BS];                                                    \
                if (blk < 0 || blk >= NB) return 3;                                              \
                int64_t len = BS - at % BS;                                                      \
                if (at + len > pos + n) len = pos + n - at;                                      \
                int64_t slot = blk * BS + at % BS;                                               \
                pc.k[pc.np] = kh + slot * D;                                                     \
                pc.v[pc.np] = vh + slot * D;                                                     \
                pc.n[pc.np++] = len;                                                             \
                at += len;                                                                       \
            }                                                                                    \
            const int64_t *seen = NULL; /* all see the whole chunk, unless one ends inside */   \
            if (ends[first] < pos + n) { /* ... which then sees its first keys only, as alone */ \
                for (int64_t i = first; i < count; i++)                                          \
                    for (int64_t r = 0; r < G; r++)                                              \
                        keys[(i - first) * G + r] = (ends[i] < pos + n ? ends[i] : pos + n) - pos; \
                seen = keys;                                                                     \
            }                                                                                    \
            CHUNK(qf + first * G * D, &pc, n, (count - first) * G, D, c->scale, c->softcap, sc,  \
                  rs + first * G, seen);                                                         \
            pos += n;                                                                            \
        }                                                                                        \
        return 0;                                                                                \
    }
#define IDENTITY(x) (x)
DEFINE_ITEM(item_f32, float, float, chunk_f32, IDENTITY)
DEFINE_ITEM(item_bf16, uint16_t, uint16_t, chunk_bf16, bf16_to_f32)
DEFINE_ITEM(item_f16kv, float, uint16_t, chunk_f16, IDENTITY)

/* Row b's output: its ranges' states merged by their log-sum-exp, in range order (only the
   ranges holding its keys: the same merge alone and in any batch), into merged (D). Returns
   0 where the row sees no key (its output is then 0). */
static int merge_row(const Call *c, const float *part, int64_t b, int64_t h, int64_t r,
                     float *merged) {
    const int64_t G = c->G, D = c->D;
    int64_t len = c->seq_lens[b];
    int64_t span = c->window > 0 && len > c->window ? c->window : len;
    int64_t own = (span + c->split_keys - 1) / c->split_keys;
    const float *row = part + (b * c->KVH + h) * c->num_splits * G * (D + 2);
    float mx = -INFINITY;
    for (int64_t sp = 0; sp < own; sp++) {
        float m = row[sp * G * (D + 2) + G * D + r];
        mx = m > mx ? m : mx;
    }
    if (mx == -INFINITY) return 0;
    float total = 0.f;
    memset(merged, 0, sizeof(float) * D);
    for (int64_t sp = 0; sp < own; sp++) {
        const float *base = row + sp * G * (D + 2);
        float m = base[G * D + r], l = base[G * D + G + r];
        if (m == -INFINITY) continue;
        float w = expf(m - mx);
        total += w * l;
        for (int64_t d = 0; d < D; d++) merged[d] += w * base[r * D + d];
    }
    float inv = 1.f / total;
    for (int64_t d = 0; d < D; d++) merged[d] *= inv;
    return 1;
}

/* What thread 0 prepares for the team: the rows grouped into items and their states. */
typedef struct {
    float *part;      /* (B, KVH, num_splits, G, D + 2): each range's row states */
    int64_t *rows;    /* the items' members */
    Item *items;
    int64_t n_items, widest;
} Work;

static void work_free(Work *w) {
    if (!w) return;
    free(w->part);
    free(w->rows);
    free(w->items);
    free(w);
}

/* The call's work, or NULL when out of memory. */
static Work *work_new(const Call *c) {
    const int64_t slots = c->B * c->num_splits;
    Work *w = (Work *)calloc(1, sizeof(Work));
    if (!w) return NULL;
    w->part = (float *)malloc(sizeof(float) * slots * c->KVH * c->G * (c->D + 2));
    w->rows = (int64_t *)malloc(sizeof(int64_t) * slots);
    w->items = (Item *)malloc(sizeof(Item) * slots);
    w->n_items = w->part && w->rows && w->items ? group_rows(c, w->rows, w->items) : -1;
    if (w->n_items < 0) {
        work_free(w);
        return NULL;
    }
    w->widest = 1;
    for (int64_t i = 0; i < w->n_items; i++)
        w->widest = w->items[i].count > w->widest ? w->items[i].count : w->widest;
    return w;
}

/* The whole call for one cache type: rows grouped into items, the items attended by team t
   (team.h; largest first, dynamically), each row's ranges merged; FROM_F32 writes one float of
   the output. NAME##_team takes the logit soft-cap (scores -> softcap * tanh(scores /
   softcap) before the softmax; 0: none) and is what the decode stack calls inside its region;
   NAME##_softcap opens a region of num_threads around it. */
#define DEFINE_PAGED(NAME, TYPE, CTYPE, ITEM, FROM_F32)                                          \
    static int NAME##_team(const Team *t, const TYPE *q, const CTYPE *cache,                    \
                           const int32_t *tables, int64_t table_stride, const int64_t *seq_lens, \
                           TYPE *out, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t NB,  \
                           int64_t BS, int64_t window, float scale, float softcap,               \
                           int64_t split_keys) {                                                 \
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
        const Call c = {tables, seq_lens, table_stride, B, H, KVH, D, NB, BS, H / KVH, window,   \
                        split_keys, (longest + split_keys - 1) / split_keys, scale,              \
                        softcap > 0.f ? softcap : 0.f};                                          \
        const int64_t G = c.G;                                                                   \
        if (t->id == 0) team_restart(t);                                                         \
        Work *w = team_share(t, t->id ? NULL : work_new(&c));                                    \
        if (!w) return 1;                                                                        \
        int st = 0;                                                                              \
        float *sc = (float *)malloc(sizeof(float) * w->widest * G * (KEY_BLOCK + D));            \
        Row *rs = (Row *)malloc(sizeof(Row) * w->widest * G);                                    \
        if (!sc || !rs) st = 1;                                                                  \
        for (int64_t u; !st && (u = team_next(t, 1)) < w->n_items * KVH;)                        \
            st = ITEM(&c, q, cache, w->items + u / KVH, w->rows, u % KVH, w->part, sc,          \
                      sc + w->widest * G * KEY_BLOCK, rs);                                       \
        free(sc);                                                                                \
        free(rs);                                                                                \
        float *merged = (float *)malloc(sizeof(float) * D);                                      \
        st = team_sync(t, st ? st : merged ? 0 : 1);                                             \
        if (!st) {                                                                               \
            int64_t lo, hi;                                                                      \
            team_range(t, B * KVH, &lo, &hi);                                                    \
            for (int64_t bh = lo; bh < hi; bh++) {                                               \
                int64_t b = bh / KVH, h = bh % KVH;                                              \
                for (int64_t r = 0; r < G; r++) {                                                \
                    TYPE *o = out + (b * H + h * G + r) * D;                                     \
                    int seen = merge_row(&c, w->part, b, h, r, merged);                          \
                    for (int64_t d = 0; d < D; d++) o[d] = FROM_F32(seen ? merged[d] : 0.f);     \
                }                                                                                \
            }                                                                                    \
            team_sync(t, 0);                                                                     \
        }                                                                                        \
        free(merged);                                                                            \
        if (t->id == 0) work_free(w);                                                            \
        return st;                                                                               \
    }                                                                                            \
    int NAME##_softcap(const TYPE *q, const CTYPE *cache, const int32_t *tables,                \
                       int64_t table_stride, const int64_t *seq_lens, TYPE *out, int64_t B,      \
                       int64_t H, int64_t KVH, int64_t D, int64_t NB, int64_t BS,                \
                       int64_t window, float scale, float softcap, int64_t split_keys,           \
                       int num_threads) {                                                        \
        int64_t keys = 0;                                                                        \
        for (int64_t b = 0; b < B; b++) keys += seq_lens[b];                                     \
        return TEAM_RUN(num_threads, 2.0 * (double)keys * H * D,                                \
                        NAME##_team(t, q, cache, tables, table_stride, seq_lens, out, B, H, KVH, \
                                    D, NB, BS, window, scale, softcap, split_keys));             \
    }
DEFINE_PAGED(paged_decode_f32, float, float, item_f32, IDENTITY)
DEFINE_PAGED(paged_decode_bf16, uint16_t, uint16_t, item_bf16, f32_to_bf16)
DEFINE_PAGED(paged_decode_f32_f16kv, float, uint16_t, item_f16kv, IDENTITY)
