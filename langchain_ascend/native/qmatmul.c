/* Products with quantized weights, read as GGUF stores them: Y (M, N) = X (M, K) @ W^T [+ bias].
 *
 * W is N rows of K / 32 blocks (quant/formats.py): q4_0 (half d, 16 bytes of nibbles; (q - 8)
 * * d), q4_1 (half d, half m, nibbles; q * d + m) or q8_0 (half d, 32 int8; q * d). Nothing
 * is unpacked to memory: each block is read once per call and applied to every row of X.
 *
 * 1. Each row of X (float32 or bfloat16) is quantized per block of 32 to int8, q8_0 style:
 *    d_a = max|x| / 127, q_a = round-to-nearest-even(x * (1 / d_a)) (0 for an all-zero block),
 *    kept with d_a as float32 (not rounded to half), and per format what the product needs:
 *    s_a = d_a * sum(q_a) (the min term of q4_1), 8 * the 4-element sums of q_a (the -8
 *    offset of q4_0 in the GGUF layout, subtracted as integers) or -8 * sum(q_a) (q4_0) and
 *    -128 * sum(q_a) (q8_0: the VNNI kernels multiply the weights + 128, unsigned), added as
 *    integers in the x8 layout.
 * 2. Per (row, output, block) the integer dot product of the 32 pairs -- exact -- goes into a
 *    float32 accumulator of 8 lanes: acc = fma(float(int lanes), d_w * d_a, acc); q4_1 adds
 *    m_w * s_a in lane 0. The output is the horizontal sum of the lanes, then + bias.
 *    (qmatmul_tiles.h has the loops.)
 *
 * Every (row, output) pair goes through the same operations in the same order whatever M,
 * the tiling, the threads and the instruction set are (the scalar path emulates the lanes), so
 * a row's result never depends on the rest of the batch, and every variant gives the same
 * bits. Variants, chosen by the caller from the CPU's flags (see qmatmul.py):
 *   0 scalar C (emulates the lanes),
 *   1 AVX2 (maddubs + madd),
 *   2 AVX-VNNI (256-bit dpbusd),
 *   3 AVX512-VNNI (dpbusd: the x8 layout 16 output rows per 512-bit vector, the GGUF layout
 *     256-bit with AVX512VL).
 * No AMX instruction is ever emitted.
 *
 * Work: rows in blocks of QROW_BLOCK (activations quantized per row block, so large prefills
 * need little scratch, and stored block-major: block b of every row together); within a
 * block, OpenMP over groups of QGROUP output rows.
 *
 * Return codes: 0 success, 2 bad shapes, 3 out of memory, 4 unknown format or variant, 5 the
 * variant's instructions are not supported by this CPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "avx2_util.h"
#include "bf16_util.h"

#define QBLOCK 32       /* weights per block */
#define QROWS 4         /* activation rows per register tile */
#define QGROUP 16       /* output rows per parallel work item */
#define QROW_BLOCK 64   /* activation rows quantized and multiplied at a time */

enum { QFMT_Q4_0 = 0, QFMT_Q4_1 = 1, QFMT_Q8_0 = 2 };
enum { QVAR_SCALAR = 0, QVAR_AVX2 = 1, QVAR_AVXVNNI = 2, QVAR_AVX512VNNI = 3 };

static int qblock_bytes(int fmt) { return fmt == QFMT_Q4_0 ? 18 : fmt == QFMT_Q4_1 ? 20 : 34; }

/* Quantized activations of a block of `rows` rows, block-major: block b of row m (m < rows) at
   index at = b * rows + m (q: 32 bytes at q + 32 * at), so one block of every row is contiguous. */
typedef struct {
    const int8_t *q;      /* (nb, rows, 32) */
    const float *d;       /* (nb, rows) d_a */
    const float *s;       /* (nb, rows) d_a * sum(q_a), q4_1 */
    const int32_t *corr;  /* (nb, rows, 8) 8 * sum of q_a over elements 4j..4j+3, q4_0 GGUF */
    const int32_t *sums;  /* (nb, rows) sum of q_a */
    const int32_t *noff;  /* (nb, rows) -8 * sum(q_a) (q4_0) or -128 * sum(q_a) (q8_0) */
    int64_t K, nb, rows;
} QActs;

static inline int64_t qa_at(const QActs *acts, int64_t m, int64_t b) { return b * acts->rows + m; }
static inline const int8_t *qa_q(const QActs *acts, int64_t m, int64_t b) {
    return acts->q + qa_at(acts, m, b) * 32;
}

static inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31). */
static inline __m256i unpack_nibbles(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m128i low = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
}

/* ---- activations ------------------------------------------------------------------------ */

static inline __m256 load8(const void *x, int dtype, int64_t i) {
    return dtype == 0 ? _mm256_loadu_ps((const float *)x + i) : load_bf16x8((const uint16_t *)x + i);
}

/* One row of K values (dtype 0 float32, 1 bfloat16) quantized per block (AVX2). Block b goes
   to q + 32 * b * stride and index b * stride of d, s, sums, noff (and corr + 8 * b * stride);
   corr and noff may be NULL. */
static void quantize_row(const void *x, int dtype, int64_t K, int fmt, int8_t *q, float *d,
                         float *s, int32_t *corr, int32_t *sums, int32_t *noff, int64_t stride) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < K / QBLOCK; b++) {
        __m256 v0 = load8(x, dtype, b * QBLOCK), v1 = load8(x, dtype, b * QBLOCK + 8);
        __m256 v2 = load8(x, dtype, b * QBLOCK + 16), v3 = load8(x, dtype, b * QBLOCK + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        float db = amax / 127.0f;
        float inv = db != 0.0f ? 1.0f / db : 0.0f;
        __m256 iv = _mm256_set1_ps(inv);
#define QROUND(v) _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v, iv), \
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
        __m256i i01 = _mm256_packs_epi32(QROUND(v0), QROUND(v1));
        __m256i i23 = _mm256_packs_epi32(QROUND(v2), QROUND(v3));
#undef QROUND
        __m256i qv = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i01, i23), order);
        const int64_t o = b * stride;
        _mm256_storeu_si256((__m256i *)(q + o * QBLOCK), qv);
        d[o] = db;
        __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qv), ones16); /* lane j: 4j..4j+3 */
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        const int32_t total = _mm_cvtsi128_si32(t);
        sums[o] = total;
        if (fmt == QFMT_Q4_1) s[o] = db * (float)total;
        if (noff && fmt != QFMT_Q4_1) noff[o] = (fmt == QFMT_Q4_0 ? -8 : -128) * total;
        if (fmt == QFMT_Q4_0 && corr)
            _mm256_storeu_si256((__m256i *)(corr + o * 8), _mm256_slli_epi32(lanes, 3));
    }
}

/* The same quantization in plain C (same bits: max is exact, 1/d and x * (1/d) are single
   IEEE operations, rintf rounds to nearest even like _mm256_round_ps). */
static void quantize_row_scalar(const void *x, int dtype, int64_t K, int fmt, int8_t *q,
                                float *d, float *s, int32_t *corr, int32_t *sums, int32_t *noff,
                                int64_t stride) {
    for (int64_t b = 0; b < K / QBLOCK; b++) {
        float v[QBLOCK], amax = 0.0f;
        for (int j = 0; j < QBLOCK; j++) {
            int64_t i = b * QBLOCK + j;
            v[j] = dtype == 0 ? ((const float *)x)[i] : bf16_to_f32(((const uint16_t *)x)[i]);
            float a = fabsf(v[j]);
            amax = a > amax ? a : amax;
        }
        float db = amax / 127.0f;
        float inv = db != 0.0f ? 1.0f / db : 0.0f;
        const int64_t o = b * stride;
        int32_t lanes[8] = {0}, total = 0;
        for (int j = 0; j < QBLOCK; j++) {
            float r = rintf(v[j] * inv);
            int32_t qi = r > 127.0f ? 127 : r < -128.0f ? -128 : (int32_t)r;
            if (r != r) qi = -128;  /* NaN: what cvtps + saturating packs give */
            q[o * QBLOCK + j] = (int8_t)qi;
            lanes[j / 4] += qi;
            total += qi;
        }
        d[o] = db;
        sums[o] = total;
        if (fmt == QFMT_Q4_1) s[o] = db * (float)total;
        if (noff && fmt != QFMT_Q4_1) noff[o] = (fmt == QFMT_Q4_0 ? -8 : -128) * total;
        if (fmt == QFMT_Q4_0 && corr)
            for (int j = 0; j < 8; j++) corr[o * 8 + j] = 8 * lanes[j];
    }
}

/* ---- the block products, once per instruction set ----------------------------------------- */

/* QK_DOT(u, s): 8 int32 lanes, lane j = sum over bytes 4j..4j+3 of u (unsigned) * s (signed).
   QK_Q4_ACC(acc, w, a) / QK_Q4_FINISH(acc): accumulate u8 4-bit weights times s8 activations
   (AVX2: in int16 lanes, widened by FINISH); QK_Q8_ACC(acc, uw, w, a) (AVX2, x8 layout): int8
   weights w times int8 activations a into int32 lanes by the sign trick, |w| (uw, unsigned
   bytes: 128 for -128) times a with w's sign. All exact, but for a = -128, which quantization
   gives only to a non-finite x (whose row's outputs are not finite anyway); the GGUF layout's
   q8_0 tiles take |a| times w with a's sign instead (exact but for w = -128, which GGUF's
   quantizer never writes). The VNNI x8 kernels are exact throughout (weights + 128). */
#define QK_SUFFIX avx2
#define QK_VNNI 0
#define QK_DOT(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define QK_Q4_ACC(acc, w, a) _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, a))
#define QK_Q4_FINISH(acc) _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
#define QK_Q8_ACC(acc, uw, w, a) _mm256_add_epi32(acc, QK_DOT(uw, _mm256_sign_epi8(a, w)))
#include "qmatmul_tiles.h"
#undef QK_SUFFIX
#undef QK_VNNI
#undef QK_DPBUSD
#undef QK_DOT
#undef QK_Q4_ACC
#undef QK_Q4_FINISH
#undef QK_Q8_ACC

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avxvnni")
#endif
#define QK_SUFFIX avxvnni
#define QK_VNNI 1
#define QK_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define QK_DOT(u, s) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
#define QK_Q4_ACC(acc, w, a) _mm256_dpbusd_avx_epi32(acc, w, a)
#define QK_Q4_FINISH(acc) (acc)
#define QK_Q8_ACC(acc, uw, w, a) _mm256_dpbusd_avx_epi32(acc, uw, _mm256_sign_epi8(a, w))
#include "qmatmul_tiles.h"
#undef QK_SUFFIX
#undef QK_VNNI
#undef QK_DPBUSD
#undef QK_DOT
#undef QK_Q4_ACC
#undef QK_Q4_FINISH
#undef QK_Q8_ACC
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vnni,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vnni,avx512vl")
#endif
#define QK_SUFFIX avx512vnni
#define QK_VNNI 1
#define QK_ZMM 1
#define QK_DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define QK_DOT(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define QK_Q4_ACC(acc, w, a) _mm256_dpbusd_epi32(acc, w, a)
#define QK_Q4_FINISH(acc) (acc)
#define QK_Q8_ACC(acc, uw, w, a) _mm256_dpbusd_epi32(acc, uw, _mm256_sign_epi8(a, w))
#include "qmatmul_tiles.h"
#undef QK_SUFFIX
#undef QK_VNNI
#undef QK_ZMM
#undef QK_DPBUSD
#undef QK_DOT
#undef QK_Q4_ACC
#undef QK_Q4_FINISH
#undef QK_Q8_ACC
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* The scalar path: the same integers, and the float operations of the vector lanes in the
   same order (lane j holds elements 4j..4j+3; hsum adds lanes j and j+4, then 0+2 and 1+3,
   then those two). */
static void qgroup_scalar(int fmt, const uint8_t *W, int64_t row_bytes, const QActs *acts,
                          const float *bias, float *Y, int64_t N, int64_t m_begin,
                          int64_t m_end, int64_t n0, int64_t count) {
    const int bytes = qblock_bytes(fmt), header = fmt == QFMT_Q4_1 ? 4 : 2;
    const int64_t nb = acts->nb;
    for (int64_t n = n0; n < n0 + count; n++) {
        for (int64_t m = m_begin; m < m_end; m++) {
            float acc[8] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = W + n * row_bytes + b * bytes;
                const int8_t *a = qa_q(acts, m, b);
                const int64_t at = qa_at(acts, m, b);
                float dw = half_to_float(blk), scale = dw * acts->d[at];
                for (int j = 0; j < 8; j++) {
                    int32_t lane = 0;
                    for (int e = 4 * j; e < 4 * j + 4; e++) {
                        int32_t w;
                        if (fmt == QFMT_Q8_0)
                            w = (int8_t)blk[2 + e];
                        else
                            w = e < 16 ? (blk[header + e] & 0x0F) : (blk[header + e - 16] >> 4);
                        lane += w * a[e];
                    }
                    if (fmt == QFMT_Q4_0) lane -= acts->corr[at * 8 + j];
                    acc[j] = fmaf((float)lane, scale, acc[j]);
                    if (fmt == QFMT_Q4_1)
                        acc[j] = fmaf(j == 0 ? half_to_float(blk + 2) : 0.0f, acts->s[at], acc[j]);
                }
            }
            float h[4], v;
            for (int j = 0; j < 4; j++) h[j] = acc[j] + acc[j + 4];
            v = (h[0] + h[2]) + (h[1] + h[3]);
            if (bias) v += bias[n];
            Y[m * N + n] = v;
        }
    }
}

/* Weight j (0..31) of row r (0..7) of an x8 superblock sb. */
static int32_t x8_weight(int fmt, const uint8_t *sb, int r, int j) {
    if (fmt == QFMT_Q8_0) return (int8_t)sb[16 + 32 * (j / 4 % 8) + 4 * r + j % 4];
    const uint8_t *values = sb + (fmt == QFMT_Q4_1 ? 32 : 16);
    int e = j % 16;
    uint8_t byte = values[32 * (e / 4) + 4 * r + e % 4];
    return j < 16 ? (byte & 0x0F) : (byte >> 4);
}

/* The scalar path of the x8 layout: per block the exact int32 dot product, then the same
   float operations as the vector lanes. */
static void qgroup8_scalar(int fmt, const uint8_t *W, int64_t row_bytes, const QActs *acts,
                           const float *bias, float *Y, int64_t N, int64_t m_begin,
                           int64_t m_end, int64_t n0, int64_t count) {
    const int sb_bytes = 8 * qblock_bytes(fmt);
    const int64_t nb = acts->nb;
    for (int64_t n = n0; n < n0 + count; n++) {
        const uint8_t *group = W + (n - n % 8) * row_bytes;
        const int r = (int)(n % 8);
        for (int64_t m = m_begin; m < m_end; m++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *sb = group + b * sb_bytes;
                const int8_t *a = qa_q(acts, m, b);
                const int64_t at = qa_at(acts, m, b);
                int32_t dot = 0;
                for (int j = 0; j < QBLOCK; j++) dot += x8_weight(fmt, sb, r, j) * a[j];
                if (fmt == QFMT_Q4_0) dot -= 8 * acts->sums[at];
                acc = fmaf((float)dot, half_to_float(sb + 2 * r) * acts->d[at], acc);
                if (fmt == QFMT_Q4_1) acc = fmaf(half_to_float(sb + 16 + 2 * r), acts->s[at], acc);
            }
            if (bias) acc += bias[n];
            Y[m * N + n] = acc;
        }
    }
}

typedef void (*qgroup_fn)(int, const uint8_t *, int64_t, const QActs *, const float *, float *,
                          int64_t, int64_t, int64_t, int64_t, int64_t);

/* Whether this CPU runs `variant` (0..3); the caller picks it from /proc/cpuinfo, this is
   the guard against an illegal instruction. */
int qmatmul_supported(int variant) {
    __builtin_cpu_init();
    switch (variant) {
        case QVAR_SCALAR: return 1;
        case QVAR_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case QVAR_AVXVNNI: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avxvnni");
        case QVAR_AVX512VNNI:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f")
                   && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
        default: return 0;
    }
}

/* Y (M, N) float32 = X (M, K) @ W^T [+ bias (N) float32] for W (N, K) in format fmt (0 q4_0,
   1 q4_1, 2 q8_0) as blocks of layout 0 (GGUF) or 1 (x8, N % 8 == 0); X float32 (dtype 0)
   or bfloat16 (1), row stride x_stride elements; Y row stride N. */
int qmatmul(int fmt, int layout, int variant, const uint8_t *W, int64_t N, int64_t K,
            const void *X, int dtype, int64_t x_stride, int64_t M, const float *bias, float *Y,
            int threads) {
    if (fmt < 0 || fmt > 2 || variant < 0 || variant > 3 || (dtype != 0 && dtype != 1)
        || (layout != 0 && layout != 1))
        return 4;
    if (N < 1 || M < 1 || K < QBLOCK || K % QBLOCK || x_stride < K || (layout == 1 && N % 8))
        return 2;
    if (!qmatmul_supported(variant)) return 5;
    static const qgroup_fn groups[2][4] = {
        {qgroup_scalar, qgroup_avx2, qgroup_avxvnni, qgroup_avx512vnni},
        {qgroup8_scalar, qgroup8_avx2, qgroup8_avxvnni, qgroup8_avx512vnni}};
    const qgroup_fn group = groups[layout][variant];
    const int64_t nb = K / QBLOCK, row_bytes = nb * qblock_bytes(fmt);
    const int64_t block_rows = M < QROW_BLOCK ? M : QROW_BLOCK;
    /* scratch, block-major (QActs): q (nb, block_rows, 32) int8, d, s, sums and noff
       (nb, block_rows) 4 bytes each, corr (nb, block_rows, 8) int32 for the q4_0 GGUF-layout
       kernel */
    size_t q_bytes = (size_t)(block_rows * K), ds_bytes = (size_t)(block_rows * nb) * sizeof(float);
    size_t corr_bytes = fmt == QFMT_Q4_0 && layout == 0
                            ? (size_t)(block_rows * nb * 8) * sizeof(int32_t) : 0;
    char *scratch = aligned_alloc(64, (q_bytes + 4 * ds_bytes + corr_bytes + 127) / 64 * 64);
    if (!scratch) return 3;
    QActs acts = {(const int8_t *)scratch, (const float *)(scratch + q_bytes),
                  (const float *)(scratch + q_bytes + ds_bytes),
                  corr_bytes ? (const int32_t *)(scratch + q_bytes + 4 * ds_bytes) : NULL,
                  (const int32_t *)(scratch + q_bytes + 2 * ds_bytes),
                  (const int32_t *)(scratch + q_bytes + 3 * ds_bytes), K, nb, block_rows};
    int8_t *q = (int8_t *)acts.q;
    float *d = (float *)acts.d, *s = (float *)acts.s;
    int32_t *corr = (int32_t *)acts.corr, *sums = (int32_t *)acts.sums;
    int32_t *noff = (int32_t *)acts.noff;
    const int64_t groups_n = (N + QGROUP - 1) / QGROUP;
    const size_t el = dtype == 0 ? 4 : 2;
    #pragma omp parallel num_threads(threads)
    {
        for (int64_t r0 = 0; r0 < M; r0 += QROW_BLOCK) {
            const int64_t rows = M - r0 < QROW_BLOCK ? M - r0 : QROW_BLOCK;
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) {
                const void *x = (const char *)X + el * (size_t)((r0 + r) * x_stride);
                int32_t *row_corr = corr ? corr + r * 8 : NULL;
                if (variant == QVAR_SCALAR)
                    quantize_row_scalar(x, dtype, K, fmt, q + r * QBLOCK, d + r, s + r, row_corr,
                                        sums + r, noff + r, block_rows);
                else
                    quantize_row(x, dtype, K, fmt, q + r * QBLOCK, d + r, s + r, row_corr,
                                 sums + r, noff + r, block_rows);
            }
            #pragma omp for schedule(static)
            for (int64_t g = 0; g < groups_n; g++) {
                int64_t n0 = g * QGROUP, count = N - n0 < QGROUP ? N - n0 : QGROUP;
                /* (N % 8 == 0 in layout 1, so count stays a multiple of 8) */
                group(fmt, W, row_bytes, &acts, bias, Y + r0 * N, N, 0, rows, n0, count);
            }
        }
    }
    free(scratch);
    return 0;
}

/* Just step 1, for tests: X (M, K) quantized as qmatmul does (q (M, K) int8, d and s (M, nb),
   corr (M, nb, 8), sums (M, nb)), by `variant`'s quantizer (0 scalar, else AVX2). */
int qmatmul_quantize_rows(int fmt, int variant, const void *X, int dtype, int64_t M, int64_t K,
                          int8_t *q, float *d, float *s, int32_t *corr, int32_t *sums) {
    if (fmt < 0 || fmt > 2 || (dtype != 0 && dtype != 1)) return 4;
    if (M < 1 || K < QBLOCK || K % QBLOCK) return 2;
    const int64_t nb = K / QBLOCK;
    const size_t el = dtype == 0 ? 4 : 2;
    for (int64_t r = 0; r < M; r++) {
        const void *x = (const char *)X + el * (size_t)(r * K);
        if (variant == QVAR_SCALAR)
            quantize_row_scalar(x, dtype, K, fmt, q + r * K, d + r * nb, s + r * nb,
                                corr + r * nb * 8, sums + r * nb, NULL, 1);
        else
            quantize_row(x, dtype, K, fmt, q + r * K, d + r * nb, s + r * nb, corr + r * nb * 8,
                         sums + r * nb, NULL, 1);
    }
    return 0;
}
