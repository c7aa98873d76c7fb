/* Matrix-vector products for single-row linear layers, float32, AVX2 + FMA, OpenMP.
 *
 * y (N) = W (N, K) @ x (K) [+ bias (N)], from one of two weight layouts:
 *
 * - matvec_f32: W row-major, as the model holds it (no copy). Eight rows at a time share each
 *   load of x; their eight dot products are reduced together (hsum8x8).
 * - matvec_tiles_f32: W packed as tiles (N/8, K, 8) -- tile t holds rows 8t..8t+7 with the
 *   eight values of one input column adjacent -- so each tile is ONE sequential stream and
 *   its eight outputs accumulate in one register, no horizontal sums. Four tiles at a time.
 *   Needs a copy of the weight; used for output-heavy layers (LM head, fused gate/up), which
 *   earlier kept a transposed copy for torch.
 *
 * - matvec_tiles_rows_f32: the tiles times any number of input rows (decode batches),
 *   blocked for registers and L1 (see its section below).
 * - matvec_tiles_f16: the same tiles stored as IEEE half floats (F16C converts them on load),
 *   half the bytes; products accumulate in float32. Approximate by design: the screened
 *   greedy LM head (engine/greedy_head.py) bounds the error and rescores the candidates.
 *
 * - greedy_screened_f16: the greedy token of one row through the float16 tiles: approximate
 *   logits, then float32 dot products for the tokens within `margin` of the best one (see
 *   engine/greedy_head.py for the bound), all in one call.
 *
 * Row blocks / tiles are spread over the calling thread's OpenMP team (torch's libgomp pool,
 * see build.py); the tiles products run as team bodies (team.h), which the decode stack calls
 * inside its own region. A decode step is bound by streaming the weights (measured on the 2-core test
 * host, bench model: MKL streams its row-major layers at 9-11 GB/s, matvec_f32 at 13-18 GB/s;
 * the tiles beat torch's product on the transposed copy by about 1 ms per decode step).
 *
 * Return codes: 0 success, 2 K (row-major) or N (tiles) not a multiple of 8.
 */
#include <math.h>
#include <stdint.h>
#include "avx2_util.h"
#include "team.h"

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

/* y (N) = tiles P (N/8, K, 8) @ x (K) [+ bias], four tiles at a time; LOAD(ptr) turns the 8
   stored values at ptr into floats. The last block's extra lanes reread its first tile. */
#define DEFINE_MATVEC_TILES(NAME, TYPE, LOAD)                                                    \
    int NAME(const TYPE *P, const float *x, const float *bias, float *y, int64_t N, int64_t K,  \
             int num_threads) {                                                                  \
        if (N % 8) return 2;                                                                     \
        int64_t tiles = N / 8;                                                                   \
        _Pragma("omp parallel for num_threads(num_threads) schedule(static)")                    \
        for (int64_t t0 = 0; t0 < tiles; t0 += 4) {                                              \
            int64_t count = tiles - t0 < 4 ? tiles - t0 : 4;                                     \
            __m256 a[4];                                                                         \
            const TYPE *p[4];                                                                    \
            for (int64_t i = 0; i < 4; i++) {                                                    \
                a[i] = _mm256_setzero_ps();                                                      \
                p[i] = P + (t0 + (i < count ? i : 0)) * K * 8;                                   \
            }                                                                                    \
            for (int64_t k = 0; k < K; k++) {                                                    \
                __m256 xk = _mm256_broadcast_ss(x + k);                                          \
                for (int64_t i = 0; i < 4; i++)                                                  \
                    a[i] = _mm256_fmadd_ps(LOAD(p[i] + k * 8), xk, a[i]);                        \
            }                                                                                    \
            for (int64_t i = 0; i < count; i++) {                                                \
                __m256 out = a[i];                                                               \
                if (bias) out = _mm256_add_ps(out, _mm256_loadu_ps(bias + (t0 + i) * 8));        \
                _mm256_storeu_ps(y + (t0 + i) * 8, out);                                         \
            }                                                                                    \
        }                                                                                        \
        return 0;                                                                                \
    }
#define LOAD_F32(ptr) _mm256_loadu_ps(ptr)
#define LOAD_F16(ptr) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ptr)))
DEFINE_MATVEC_TILES(matvec_tiles_f32, float, LOAD_F32)
DEFINE_MATVEC_TILES(matvec_tiles_f16, uint16_t, LOAD_F16)



/* The float32 argmax of W (V, K) @ x among the tokens whose float16-screened logit is within
   2 * bound_scale * ||x|| of the best screened logit. scratch: V floats. Returns the token
   (lowest id on ties) and writes how many candidates were rescored; -2 bad shapes, -3 no
   finite screened logit. */
int64_t greedy_screened_f16(const uint16_t *tiles, const float *W, const float *x, float *scratch,
                            int64_t V, int64_t K, float bound_scale, int num_threads,
                            int64_t *num_candidates) {
    if (V % 8 || K % 8) return -2;
    matvec_tiles_f16(tiles, x, NULL, scratch, V, K, num_threads);
    double norm2 = 0.0;
    for (int64_t k = 0; k < K; k++) norm2 += (double)x[k] * x[k];
    float best = -INFINITY;
    for (int64_t j = 0; j < V; j++) best = scratch[j] > best ? scratch[j] : best;
    if (!(best > -INFINITY) || isinf(best)) return -3;
    float threshold = (float)((double)best - 2.0 * bound_scale * sqrt(norm2));
    int64_t token = -1, count = 0;
    float token_logit = -INFINITY;
    for (int64_t j = 0; j < V; j++) {
        if (!(scratch[j] >= threshold)) continue;
        count++;
        const float *w = W + j * K;
        __m256 a = _mm256_setzero_ps();
        for (int64_t k = 0; k < K; k += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a);
        float logit = hsum(a);
        if (token < 0 || logit > token_logit) { token = j; token_logit = logit; }
    }
    *num_candidates = count;
    return token;
}

/* ---- float32, any number of rows ---------------------------------------------------------
 * matvec_tiles_rows_f32: Y (M, N) = X (M, K) @ W^T [+ bias] from the tiles P (N/8, K, 8) of W,
 * any M >= 1 (batched decode steps). At 16 rows this is compute-bound (8 FLOP per weight
 * byte), so the work is blocked for registers and L1:
 *
 * - register blocks of R <= ROWS_MAX rows times T tiles (R * T <= 12 ymm accumulators, T
 *   weight vectors and one broadcast of x: at most 16 ymm registers): 2 tiles for 3..6 rows,
 *   4 tiles for 1..2 rows (enough independent FMA chains to hide their latency);
 * - work items are groups of GROUP_TILES tiles (static OpenMP schedule); the rows go through a
 *   group in near-equal chunks of at most ROWS_MAX, so the group's tiles (K * 128 bytes) stay
 *   in L1/L2 while every chunk passes over them. Splitting K into L1-sized slabs of 128 or 256
 *   (partial sums kept in Y) measured no faster on the 2-core test host, so K is one pass.
 *
 * Every output is one sequential float32 FMA chain over k = 0..K-1 from zero, then + bias,
 * whatever M and the chunks are: a row's result does not depend on the other rows, one row
 * equals matvec_tiles_f32, and 2..8 rows equal the earlier one-chunk kernel bit for bit.
 *
 * SmolLM2-135M shapes, 16 rows, one thread of the 2-core test host: 68-83 GFLOP/s for the
 * decoder layers (oneDNN on its packed copy: 35-61), 50 for the LM head (oneDNN: 37).
 */
#define ROWS_MAX 6     /* rows per register block */
#define GROUP_TILES 4  /* tiles per parallel work item */

/* Rows X[0..R) times tiles t..t+T-1 (p: tile t) into Y [+ bias]. R (<= ROWS_MAX) and T (1, 2
   or 4, R * T <= 12) are constants at every call; the accumulators are named variables, not
   an array (gcc 12 keeps an array of vectors in memory here, storing it every k: 3x slower),
   and the unused ones vanish. */
#define ACC_ROW(m) __m256 c##m##0, c##m##1, c##m##2, c##m##3;
#define ACC_ALL(m, OP) OP(m, 0) OP(m, 1) OP(m, 2) OP(m, 3)
#define ACC_INIT(m, j)                                                                         \
    if (R > m && T > j) c##m##j = _mm256_setzero_ps();
#define ACC_FMA(m, j) if (T > j) c##m##j = _mm256_fmadd_ps(w##j, xk, c##m##j);
#define ACC_ROW_FMA(m)                                                                         \
    if (R > m) {                                                                               \
        __m256 xk = _mm256_broadcast_ss(X + m * K + k);                                        \
        ACC_ALL(m, ACC_FMA)                                                                    \
    }
#define ACC_STORE(m, j)                                                                        \
    if (R > m && T > j)                                                                        \
        _mm256_storeu_ps(Y + m * N + (t + j) * 8,                                              \
                         bias ? _mm256_add_ps(c##m##j, _mm256_loadu_ps(bias + (t + j) * 8))     \
                              : c##m##j);
#define FOR_ROWS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5)
#define ACC_ROW_INIT(m) ACC_ALL(m, ACC_INIT)
#define ACC_ROW_STORE(m) ACC_ALL(m, ACC_STORE)

static inline __attribute__((always_inline)) void tile_block_f32(
        const float *p, const float *X, const float *bias, float *Y, int64_t N, int64_t K,
        int64_t t, const int R, const int T) {
    FOR_ROWS(ACC_ROW)
    FOR_ROWS(ACC_ROW_INIT)
    const float *p1 = p + (T > 1 ? K * 8 : 0), *p2 = p + (T > 2 ? 2 * K * 8 : 0);
    const float *p3 = p + (T > 3 ? 3 * K * 8 : 0);
    for (int64_t k = 0; k < K; k++) {
        __m256 w0 = _mm256_loadu_ps(p + k * 8);
        __m256 w1 = T > 1 ? _mm256_loadu_ps(p1 + k * 8) : w0;
        __m256 w2 = T > 2 ? _mm256_loadu_ps(p2 + k * 8) : w0;
        __m256 w3 = T > 3 ? _mm256_loadu_ps(p3 + k * 8) : w0;
        FOR_ROWS(ACC_ROW_FMA)
    }
    FOR_ROWS(ACC_ROW_STORE)
}

/* One function per block shape (one inlined copy each keeps its accumulators in registers). */
typedef void (*tile_block_fn)(const float *, const float *, const float *, float *, int64_t,
                              int64_t, int64_t);
#define DEFINE_TILE_BLOCK(R, T)                                                                \
    static void tile_block_##R##x##T(const float *p, const float *X, const float *bias,       \
                                     float *Y, int64_t N, int64_t K, int64_t t) {             \
        tile_block_f32(p, X, bias, Y, N, K, t, R, T);                                         \
    }
DEFINE_TILE_BLOCK(1, 1) DEFINE_TILE_BLOCK(2, 1) DEFINE_TILE_BLOCK(3, 1)
DEFINE_TILE_BLOCK(4, 1) DEFINE_TILE_BLOCK(5, 1) DEFINE_TILE_BLOCK(6, 1)
DEFINE_TILE_BLOCK(1, 2) DEFINE_TILE_BLOCK(2, 2) DEFINE_TILE_BLOCK(3, 2)
DEFINE_TILE_BLOCK(4, 2) DEFINE_TILE_BLOCK(5, 2) DEFINE_TILE_BLOCK(6, 2)
DEFINE_TILE_BLOCK(1, 4) DEFINE_TILE_BLOCK(2, 4)

/* The block of `rows` (1..ROWS_MAX) rows times `width` (1, 2, or 4 for at most 2 rows) tiles. */
static tile_block_fn tile_block_for(int64_t rows, int width) {
    static const tile_block_fn by_rows[2][ROWS_MAX] = {
        {tile_block_1x1, tile_block_2x1, tile_block_3x1, tile_block_4x1, tile_block_5x1,
         tile_block_6x1},
        {tile_block_1x2, tile_block_2x2, tile_block_3x2, tile_block_4x2, tile_block_5x2,
         tile_block_6x2}};
    if (width == 4) return rows == 1 ? tile_block_1x4 : tile_block_2x4;
    return by_rows[width == 2][rows - 1];
}

/* The `count` (1..GROUP_TILES) tiles from t times all M rows: 4 tiles at a time when M <= 2,
   else 2 (then 1 for an odd last tile), each block of tiles through every chunk of rows. */
static void tile_group_f32(const float *P, const float *X, const float *bias, float *Y,
                           int64_t N, int64_t K, int64_t M, int64_t t, int64_t count) {
    int64_t chunks = (M + ROWS_MAX - 1) / ROWS_MAX;
    int wide = M <= 2 ? 4 : 2;
    for (int64_t j = 0; j < count;) {
        int width = count - j >= wide ? wide : (count - j >= 2 ? 2 : 1);
        for (int64_t c = 0, m0 = 0; c < chunks; c++) {
            int64_t rows = (M - m0) / (chunks - c);  /* near-equal chunks, larger last */
            tile_block_for(rows, width)(P + (t + j) * K * 8, X + m0 * K, bias, Y + m0 * N, N, K,
                                        t + j);
            m0 += rows;
        }
        j += width;
    }
}

/* Y (M, N) = X (M, K) @ W^T [+ bias] from the tiles of W, any M >= 1, by team t (team.h).
   Returns 2 on bad shapes. */
static int matvec_tiles_rows_f32_team(const Team *t, const float *P, const float *X,
                                      const float *bias, float *Y, int64_t N, int64_t K,
                                      int64_t M) {
    if (N % 8 || M < 1 || K < 1) return 2;
    int64_t tiles = N / 8, lo, hi;
    team_range(t, (tiles + GROUP_TILES - 1) / GROUP_TILES, &lo, &hi);
    for (int64_t g = lo; g < hi; g++) {
        int64_t t0 = g * GROUP_TILES, count = tiles - t0 < GROUP_TILES ? tiles - t0 : GROUP_TILES;
        tile_group_f32(P, X, bias, Y, N, K, M, t0, count);
    }
    team_sync(t, 0);
    return 0;
}

int matvec_tiles_rows_f32(const float *P, const float *X, const float *bias, float *Y, int64_t N,
                          int64_t K, int64_t M, int num_threads) {
    return TEAM_RUN(num_threads, (double)M * N * K,
                    matvec_tiles_rows_f32_team(t, P, X, bias, Y, N, K, M));
}

/* ---- bfloat16 ------------------------------------------------------------------------------
 * matvec_tiles_rows_bf16: Y (M, N) = X (M, K) @ W^T [+ bias] for any M >= 1, everything stored
 * as bfloat16 (the upper half of a float32), W as tiles (N/8, K, 8) like the float32 tiles.
 * Each product of two bf16 values is exact in float32; they accumulate in float32 (FMA), the
 * bias is added in float32 and each output is rounded to bf16 once (nearest, ties to even;
 * NaN -> 0x7FC0, as torch rounds) -- what torch's bf16 linear computes, up to the order of
 * the float32 sums. CPUs without native bf16 math run torch's bf16 products at ~14 GFLOP/s
 * at every size on the 2-core test host; this kernel widens bf16 to float32 on load instead.
 *
 * Work items are groups of 4 tiles (each K * 16 bytes: in L1/L2 for decoder widths); the rows
 * go through each group in near-equal chunks of at most 8, one register accumulator per row
 * and tile. Every output is one sequential float32 FMA chain over k, so a row's result does
 * not depend on how many rows share the call (batch-invariant). X is widened to float32
 * once, into a scratch buffer.
 */
#include <stdlib.h>
#include "bf16_util.h"

#define BF16_MAX_CHUNK 8 /* rows per chunk, and accumulators per call */
#define BF16_GROUP 4     /* tiles per parallel work item */

/* Tiles t..t+T-1 (p: their K * 8 bf16 values each, consecutive) times R rows of Xf (float32,
   row stride K) into Y (bf16, row stride N), one register accumulator per (row, tile). R and
   T are constants in every call (the function is inlined and its loops unrolled). Every
   output is the same sequential float32 FMA chain over k whatever R and T are, so a row's
   result does not depend on the other rows of the call. */
static inline __attribute__((always_inline)) void tile_chunk_bf16(
        const uint16_t *p, const float *Xf, const float *biasf, uint16_t *Y, int64_t N,
        int64_t K, int64_t t, const int R, const int T) {
    __m256 a[BF16_MAX_CHUNK];
    for (int i = 0; i < R * T; i++) a[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        for (int j = 0; j < T; j++) {
            __m256 w = load_bf16x8(p + (j * K + k) * 8);
            for (int m = 0; m < R; m++)
                a[m * T + j] = _mm256_fmadd_ps(w, _mm256_broadcast_ss(Xf + m * K + k),
                                               a[m * T + j]);
        }
    }
    for (int m = 0; m < R; m++) {
        for (int j = 0; j < T; j++) {
            __m256 out = a[m * T + j];
            if (biasf) out = _mm256_add_ps(out, _mm256_loadu_ps(biasf + (t + j) * 8));
            store_bf16x8(Y + m * N + (t + j) * 8, out);
        }
    }
}

/* A chunk of 1..8 rows times the `count` (1..BF16_GROUP) tiles from t: 1 row four tiles at
   a time, 2-4 rows two at a time, more rows one at a time (enough independent FMA chains
   to hide their latency, at most 8 accumulators). */
static void tile_group_bf16(const uint16_t *P, const float *Xf, const float *biasf, uint16_t *Y,
                            int64_t N, int64_t K, int64_t t, int64_t count, int64_t rows) {
    int64_t j = 0;
    const uint16_t *p = P + t * K * 8;
    if (rows == 1)
        for (; j + 4 <= count; j += 4) tile_chunk_bf16(p + j * K * 8, Xf, biasf, Y, N, K, t + j, 1, 4);
    else if (rows == 2)
        for (; j + 2 <= count; j += 2) tile_chunk_bf16(p + j * K * 8, Xf, biasf, Y, N, K, t + j, 2, 2);
    else if (rows == 3)
        for (; j + 2 <= count; j += 2) tile_chunk_bf16(p + j * K * 8, Xf, biasf, Y, N, K, t + j, 3, 2);
    else if (rows == 4)
        for (; j + 2 <= count; j += 2) tile_chunk_bf16(p + j * K * 8, Xf, biasf, Y, N, K, t + j, 4, 2);
    for (; j < count; j++) {
        const uint16_t *pj = p + j * K * 8;
        switch (rows) {
            case 1: tile_chunk_bf16(pj, Xf, biasf, Y, N, K, t + j, 1, 1); break;
            case 2: tile_chunk_bf16(pj, Xf, biasf, Y, N, K, t + j, 2, 1); break;
            case 3: tile_chunk_bf16(pj, Xf, biasf, Y, N, K, t + j, 3, 1); break;
            case 4: tile_chunk_bf16(pj, Xf, biasf, Y, N, K, t + j, 4, 1); break;
            case 5: tile_chunk_bf16(pj, Xf, biasf, Y, N, K, t + j, 5, 1); break;
            case 6: tile_chunk_bf16(pj, Xf, biasf, Y, N, K, t + j, 6, 1); break;
            case 7: tile_chunk_bf16(pj, Xf, biasf, Y, N, K, t + j, 7, 1); break;
            default: tile_chunk_bf16(pj, Xf, biasf, Y, N, K, t + j, 8, 1); break;
        }
    }
}

/* Y (M, N) = X (M, K) @ W^T [+ bias (N)] from the bf16 tiles P of W, any M >= 1, by team t
   (team.h). The rows are split into ceil(M / 8) chunks of near-equal size. Returns 2 on bad
   shapes, 3 when the scratch buffer cannot be allocated. */
static int matvec_tiles_rows_bf16_team(const Team *t, const uint16_t *P, const uint16_t *X,
                                       const uint16_t *bias, uint16_t *Y, int64_t N, int64_t K,
                                       int64_t M) {
    if (N % 8 || M < 1 || K < 1) return 2;
    float *Xf = team_share(
        t, t->id ? NULL : malloc((size_t)(M * K + (bias ? N : 0)) * sizeof(float)));
    if (!Xf) return 3;
    float *biasf = bias ? Xf + M * K : NULL;
    int64_t tiles = N / 8, chunks = (M + BF16_MAX_CHUNK - 1) / BF16_MAX_CHUNK, lo, hi;
    team_range(t, M * K, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) Xf[i] = bf16_to_f32(X[i]);
    if (bias) {
        team_range(t, N, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) biasf[i] = bf16_to_f32(bias[i]);
    }
    team_sync(t, 0);
    team_range(t, (tiles + BF16_GROUP - 1) / BF16_GROUP, &lo, &hi);
    for (int64_t g = lo; g < hi; g++) {
        int64_t t0 = g * BF16_GROUP, count = tiles - t0 < BF16_GROUP ? tiles - t0 : BF16_GROUP;
        for (int64_t c = 0, m0 = 0; c < chunks; c++) {
            int64_t rows = (M - m0) / (chunks - c);  /* near-equal chunks, larger last */
            tile_group_bf16(P, Xf + m0 * K, biasf, Y + m0 * N, N, K, t0, count, rows);
            m0 += rows;
        }
    }
    team_sync(t, 0);
    if (t->id == 0) free(Xf);
    return 0;
}

int matvec_tiles_rows_bf16(const uint16_t *P, const uint16_t *X, const uint16_t *bias,
                           uint16_t *Y, int64_t N, int64_t K, int64_t M, int num_threads) {
    return TEAM_RUN(num_threads, (double)M * N * K,
                    matvec_tiles_rows_bf16_team(t, P, X, bias, Y, N, K, M));
}
