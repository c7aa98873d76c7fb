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
 * Work: rows in spans of QROW_SPAN, each quantized at once and cut into blocks of QROW_BLOCK
 * (activations stored block-major per row block: block b of its rows together; large
 * prefills need little scratch and meet the threads' barrier once a span); a work item is a
 * row block times a group of QGROUP output rows, shared by the calling team (team.h) -- the
 * decode stack's, or a region qmatmul_into opens itself.
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
#include "team.h"

#define QBLOCK 32       /* weights per block */
#define QROWS 4         /* activation rows per register tile */
#define QGROUP 16       /* output rows per parallel work item */
#define QROW_BLOCK 64   /* activation rows multiplied at a time (a work item's rows) */
#define QROW_SPAN 256   /* activation rows quantized at a time (row blocks per pass: 4) */

enum { QFMT_Q4_0 = 0, QFMT_Q4_1 = 1, QFMT_Q8_0 = 2, QFMT_Q5_0 = 3, QFMT_Q5_1 = 4, QFMT_Q4_K = 5,
       QFMT_Q5_K = 6, QFMT_Q6_K = 7 };
#define QFMT_COUNT 8
#define QK_SUPER 256    /* weights per K-quant superblock */
enum { QVAR_SCALAR = 0, QVAR_AVX2 = 1, QVAR_AVXVNNI = 2, QVAR_AVX512VNNI = 3 };

static int qblock_bytes(int fmt) {
    static const int bytes[QFMT_COUNT] = {18, 20, 34, 22, 24, 144, 176, 210};
    return bytes[fmt];
}
static int qblock_values(int fmt) { return fmt >= QFMT_Q4_K ? QK_SUPER : QBLOCK; }
static int is_kquant(int fmt) { return fmt >= QFMT_Q4_K; }
static int has_min(int fmt) { return fmt == QFMT_Q4_1 || fmt == QFMT_Q5_1; }

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

/* Quantized activations for the K-quant products (qmatmul_ktiles.h), superblock-major (the
   rows of one superblock s together, so a weight superblock meets every row in one stream):
   row m's 8 blocks of superblock s at index ks_at = s * rows + m; q: 256 bytes at ks_at * 256
   transposed by 4-byte words (input 4p + i of group g at byte 32 p + 4 g + i); d and sums: 8
   at ks_at * 8; bs32 (q6_k): 16 at ks_at * 16, 32 * the sums of q_a over inputs 0..15 of
   groups 0..7, then over inputs 16..31. */
typedef struct {
    const int8_t *q;       /* (ns, rows, 8 words p, 8 groups, 4) */
    const float *d;        /* (ns, rows, 8) d_a */
    const int32_t *sums;   /* (ns, rows, 8) sum of q_a */
    const int32_t *bs32;   /* (ns, rows, 16) */
    int64_t nb, rows;
} KActs;
static inline int64_t ks_at(const KActs *acts, int64_t m, int64_t s) { return s * acts->rows + m; }

/* Quantized activations for the K-quant products of the x8 layout (qmatmul_k8.h), block-major
   as QActs: block b of row m at index b * rows + m (q: 32 bytes there), d and s (q4_k, q5_k:
   d_a * sum(q_a)) one value, h32 (q6_k) two: -32 * the sums of q_a over inputs 0..15, 16..31. */
/* Byte offsets in a q6_k x8 superblock (quant/formats.py: d[8], scales[16][8], then 256-byte
   chunks ql 0..7, qh 0..7, ql 8..15, ql 16..23, qh 8..15, ql 24..31): ql words 16 h + 8 u..,
   qh words 8 h.. */
#define K6_QL(h, u) ((h) ? ((u) ? 1424 : 912) : ((u) ? 656 : 144))
#define K6_QH(h) ((h) ? 1168 : 400)

typedef struct {
    const int8_t *q;       /* (nb, rows, 32) */
    const float *d;        /* (nb, rows) d_a */
    const float *s;        /* (nb, rows) d_a * sum(q_a) */
    const int32_t *h32;    /* (nb, rows, 2) */
    int64_t nb, rows;
} K8Acts;

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

/* q5_0 / q5_1 weights: qh (uint32 little-endian) then 16 bytes of nibbles -> 32 bytes, element
   e = its nibble | bit e of qh << 4. */
static inline __m256i unpack_five(const uint8_t *p) {
    uint32_t qh;
    memcpy(&qh, p, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i x = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    x = _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
    return _mm256_or_si256(unpack_nibbles(p + 4), _mm256_and_si256(x, _mm256_set1_epi8(0x10)));
}

/* The weight e (0..31) of a q5 block's values p (qh, then nibbles). */
static inline int32_t five_weight(const uint8_t *p, int e) {
    uint32_t qh;
    memcpy(&qh, p, 4);
    int32_t nib = e < 16 ? (p[4 + e] & 0x0F) : (p[4 + e - 16] >> 4);
    return nib | (int32_t)((qh >> e) & 1) << 4;
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
        if (has_min(fmt)) s[o] = db * (float)total;
        if (noff && (fmt == QFMT_Q4_0 || fmt == QFMT_Q8_0))
            noff[o] = (fmt == QFMT_Q4_0 ? -8 : -128) * total;
        if ((fmt == QFMT_Q4_0 || fmt == QFMT_Q5_0) && corr)
            _mm256_storeu_si256((__m256i *)(corr + o * 8),
                                _mm256_slli_epi32(lanes, fmt == QFMT_Q4_0 ? 3 : 4));
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
        if (has_min(fmt)) s[o] = db * (float)total;
        if (noff && (fmt == QFMT_Q4_0 || fmt == QFMT_Q8_0))
            noff[o] = (fmt == QFMT_Q4_0 ? -8 : -128) * total;
        if ((fmt == QFMT_Q4_0 || fmt == QFMT_Q5_0) && corr)
            for (int j = 0; j < 8; j++) corr[o * 8 + j] = (fmt == QFMT_Q4_0 ? 8 : 16) * lanes[j];
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
#include "qmatmul_ktiles.h"
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
#include "qmatmul_ktiles.h"
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
#include "qmatmul_ktiles.h"
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
    const int bytes = qblock_bytes(fmt), header = has_min(fmt) ? 4 : 2;
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
                        else if (fmt == QFMT_Q5_0 || fmt == QFMT_Q5_1)
                            w = five_weight(blk + header, e);
                        else
                            w = e < 16 ? (blk[header + e] & 0x0F) : (blk[header + e - 16] >> 4);
                        lane += w * a[e];
                    }
                    if (fmt == QFMT_Q4_0 || fmt == QFMT_Q5_0) lane -= acts->corr[at * 8 + j];
                    acc[j] = fmaf((float)lane, scale, acc[j]);
                    if (has_min(fmt))
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

/* The weight e (0..31) of 32-group g of a K-quant superblock sb, and (q4_k / q5_k) the
   group's 6-bit scale and min. */
static int32_t k_weight(int fmt, const uint8_t *sb, int g, int e) {
    if (fmt == QFMT_Q6_K) {
        const int h = g / 4, k = g % 4;
        const uint8_t l = sb[64 * h + 32 * (k % 2) + e], hb = sb[128 + 32 * h + e];
        return ((k < 2 ? l & 0x0F : l >> 4) | ((hb >> (2 * k)) & 3) << 4);
    }
    const uint8_t *qs = sb + (fmt == QFMT_Q4_K ? 16 : 48);
    const uint8_t byte = qs[32 * (g / 2) + e];
    int32_t q = g % 2 ? byte >> 4 : byte & 0x0F;
    if (fmt == QFMT_Q5_K) q |= ((sb[16 + e] >> g) & 1) << 4;
    return q;
}
static void k_scale_min(const uint8_t *sb, int g, int32_t *sc, int32_t *mn) {
    const uint8_t *p = sb + 4;
    if (g < 4) {
        *sc = p[g] & 63;
        *mn = p[g + 4] & 63;
    } else {
        *sc = (p[g + 4] & 0x0F) | ((p[g - 4] >> 6) << 4);
        *mn = (p[g + 4] >> 4) | ((p[g] >> 6) << 4);
    }
}

/* The scalar path of the K-quants: the integers of qmatmul_ktiles.h, and its float operations
   lane by lane in the same order. */
static void kgroup_scalar(int fmt, const uint8_t *W, int64_t row_bytes, const KActs *acts,
                          const float *bias, float *Y, int64_t y_stride, int64_t m_begin,
                          int64_t m_end, int64_t n0, int64_t count) {
    const int bytes = qblock_bytes(fmt);
    const int64_t nb = acts->nb, ns = nb / 8;
    for (int64_t n = n0; n < n0 + count; n++) {
        for (int64_t m = m_begin; m < m_end; m++) {
            float acc[8] = {0};
            for (int64_t s = 0; s < ns; s++) {
                const uint8_t *sb = W + n * row_bytes + s * bytes;
                const float fd = half_to_float(fmt == QFMT_Q6_K ? sb + 208 : sb);
                const float fmn = fmt == QFMT_Q6_K ? 0.0f : -half_to_float(sb + 2);
                for (int g = 0; g < 8; g++) {
                    const int64_t at = ks_at(acts, m, s) * 8 + g;
                    const int8_t *super = acts->q + ks_at(acts, m, s) * QK_SUPER;
                    int8_t a[QBLOCK];
                    for (int e = 0; e < QBLOCK; e++) a[e] = super[32 * (e / 4) + 4 * g + e % 4];
                    int32_t I, sc = 0, mn = 0;
                    if (fmt == QFMT_Q6_K) {
                        int32_t half[2] = {0, 0}, asum[2] = {0, 0};
                        for (int e = 0; e < QBLOCK; e++) {
                            half[e / 16] += k_weight(fmt, sb, g, e) * a[e];
                            asum[e / 16] += a[e];
                        }
                        const int8_t *scales = (const int8_t *)(sb + 192);
                        I = scales[2 * g] * (half[0] - 32 * asum[0])
                            + scales[2 * g + 1] * (half[1] - 32 * asum[1]);
                    } else {
                        int32_t dot = 0;
                        for (int e = 0; e < QBLOCK; e++) dot += k_weight(fmt, sb, g, e) * a[e];
                        k_scale_min(sb, g, &sc, &mn);
                        I = sc * dot;
                    }
                    const float da = acts->d[at];
                    acc[g] = fmaf((float)I, fd * da, acc[g]);
                    if (fmt != QFMT_Q6_K)
                        acc[g] = fmaf((float)(mn * acts->sums[at]), fmn * da, acc[g]);
                }
            }
            float h[4], v;
            for (int j = 0; j < 4; j++) h[j] = acc[j] + acc[j + 4];
            v = (h[0] + h[2]) + (h[1] + h[3]);
            if (bias) v += bias[n];
            Y[m * y_stride + n] = v;
        }
    }
}

typedef void (*kgroup_fn)(int, const uint8_t *, int64_t, const KActs *, const float *, float *,
                          int64_t, int64_t, int64_t, int64_t, int64_t);

/* The scalar path of the x8 K-quant panels (qmatmul_k8.h): the same integers, and the same
   float operations lane by lane in the same order. W: groups of 8 rows, group_bytes each. */
static void kgroup8_scalar(int fmt, const uint8_t *W, int64_t group_bytes, const K8Acts *acts,
                           const float *bias, float *Y, int64_t y_stride, int64_t m_begin,
                           int64_t m_end, int64_t n0, int64_t count) {
    const int SB = fmt == QFMT_Q4_K ? 1152 : fmt == QFMT_Q5_K ? 1408 : 1680;
    const int QS = fmt == QFMT_Q5_K ? 384 : 128;
    const int64_t ns = acts->nb / 8, stride = acts->rows;
    for (int64_t n = n0; n < n0 + count; n++) {
        const int r = (int)(n % 8);
        const uint8_t *group = W + n / 8 * group_bytes;
        for (int64_t m = m_begin; m < m_end; m++) {
            float f = 0.0f;
            for (int64_t s = 0; s < ns; s++) {
                const uint8_t *sb = group + s * SB;
                float ds[16];
                if (fmt == QFMT_Q6_K) {
                    const float d = half_to_float(sb + 2 * r);
                    for (int i = 0; i < 16; i++) ds[i] = d * (float)(int8_t)sb[16 + 8 * i + r];
                } else {
                    uint8_t packed[16];  /* the row's block header as GGUF has it */
                    for (int w = 0; w < 3; w++) memcpy(packed + 4 + 4 * w, sb + 32 + 32 * w + 4 * r, 4);
                    const float d = half_to_float(sb + 2 * r), mn = -half_to_float(sb + 16 + 2 * r);
                    for (int j = 0; j < 8; j++) {
                        int32_t sc, mj;
                        k_scale_min(packed, j, &sc, &mj);
                        ds[j] = d * (float)sc;
                        ds[8 + j] = mn * (float)mj;
                    }
                }
                for (int j = 0; j < 8; j++) {
                    const int64_t at = (8 * s + j) * stride + m;
                    const int8_t *a = acts->q + at * QBLOCK;
                    int32_t half[2] = {0, 0};
                    for (int e = 0; e < QBLOCK; e++) {
                        const int o = 32 * (e / 4) + 4 * r + e % 4;  /* word e / 4, row r */
                        int32_t q;
                        if (fmt == QFMT_Q6_K) {
                            const int h = j / 4, k = j % 4;
                            const uint8_t l = sb[K6_QL(h, k % 2) + o];
                            const uint8_t hb = sb[K6_QH(h) + o];
                            q = (k < 2 ? l & 0x0F : l >> 4) | ((hb >> (2 * k)) & 3) << 4;
                        } else {
                            const uint8_t b = sb[QS + 32 * 8 * (j / 2) + o];
                            q = j % 2 ? b >> 4 : b & 0x0F;
                            if (fmt == QFMT_Q5_K) q |= ((sb[128 + o] >> j) & 1) << 4;
                        }
                        half[e / 16] += q * a[e];
                    }
                    const float da = acts->d[at];
                    if (fmt == QFMT_Q6_K) {
                        f = fmaf((float)(half[0] + acts->h32[2 * at]), ds[2 * j] * da, f);
                        f = fmaf((float)(half[1] + acts->h32[2 * at + 1]), ds[2 * j + 1] * da, f);
                    } else {
                        f = fmaf((float)(half[0] + half[1]), ds[j] * da, f);
                        f = fmaf(ds[8 + j], acts->s[at], f);
                    }
                }
            }
            if (bias) f += bias[n];
            Y[m * y_stride + n] = f;
        }
    }
}

typedef void (*kgroup8_fn)(int, const uint8_t *, int64_t, const K8Acts *, const float *, float *,
                           int64_t, int64_t, int64_t, int64_t, int64_t);

/* The x8 K-quant product (qmatmul's contract, N % 8 == 0) by team t: activations quantized per
   block of 32 as qmatmul's (block-major, K8Acts), then groups of QGROUP output rows. */
static int qmatmul_k8(const Team *t, int fmt, int variant, const uint8_t *W, int64_t N, int64_t K,
                      const void *X, int dtype, int64_t x_stride, int64_t M, const float *bias,
                      float *Y, int64_t y_stride) {
    static const kgroup8_fn groups[4] = {kgroup8_scalar, kgroup8_avx2, kgroup8_avxvnni,
                                         kgroup8_avx512vnni};
    const kgroup8_fn group = groups[variant];
    const int64_t nb = K / QBLOCK, group_bytes = 8 * (K / QK_SUPER) * qblock_bytes(fmt);
    const int64_t block_rows = M < QROW_BLOCK ? M : QROW_BLOCK;
    /* scratch: q (nb, block_rows, 32) int8, then d, s, sums (nb, block_rows) and h32
       (nb, block_rows, 2), 4 bytes each */
    const size_t q_bytes = (size_t)(block_rows * K), v_bytes = (size_t)(block_rows * nb) * 4;
    char *scratch = team_share(
        t, t->id ? NULL : aligned_alloc(64, (q_bytes + 5 * v_bytes + 63) / 64 * 64));
    if (!scratch) return 3;
    int8_t *q = (int8_t *)scratch;
    float *d = (float *)(scratch + q_bytes), *s = (float *)(scratch + q_bytes + v_bytes);
    int32_t *sums = (int32_t *)(scratch + q_bytes + 2 * v_bytes);
    int32_t *h32 = (int32_t *)(scratch + q_bytes + 3 * v_bytes);
    const int64_t groups_n = (N + QGROUP - 1) / QGROUP;
    const size_t el = dtype == 0 ? 4 : 2;
    int64_t lo, hi;
    for (int64_t r0 = 0; r0 < M; r0 += QROW_BLOCK) {
        const int64_t rows = M - r0 < QROW_BLOCK ? M - r0 : QROW_BLOCK;
        const K8Acts acts = {q, d, s, h32, nb, rows};
        team_range(t, rows, &lo, &hi);
        for (int64_t r = lo; r < hi; r++) {
            const void *x = (const char *)X + el * (size_t)((r0 + r) * x_stride);
            /* (q4_1's quantization: the same q and d, with s = d * sum(q)) */
            if (variant == QVAR_SCALAR)
                quantize_row_scalar(x, dtype, K, QFMT_Q4_1, q + r * QBLOCK, d + r, s + r, NULL,
                                    sums + r, NULL, rows);
            else
                quantize_row(x, dtype, K, QFMT_Q4_1, q + r * QBLOCK, d + r, s + r, NULL,
                             sums + r, NULL, rows);
            if (fmt == QFMT_Q6_K)
                for (int64_t b = 0; b < nb; b++) {
                    const int8_t *a = q + (b * rows + r) * QBLOCK;
                    int32_t lo16 = 0, hi16 = 0;
                    for (int e = 0; e < 16; e++) {
                        lo16 += a[e];
                        hi16 += a[16 + e];
                    }
                    h32[2 * (b * rows + r)] = -32 * lo16;
                    h32[2 * (b * rows + r) + 1] = -32 * hi16;
                }
        }
        team_sync(t, 0);
        team_range(t, groups_n, &lo, &hi);
        for (int64_t g = lo; g < hi; g++) {
            int64_t n0 = g * QGROUP, count = N - n0 < QGROUP ? N - n0 : QGROUP;
            group(fmt, W, group_bytes, &acts, bias, Y + r0 * y_stride, y_stride, 0, rows, n0,
                  count);
        }
        team_sync(t, 0);
    }
    if (t->id == 0) free(scratch);
    return 0;
}

/* The K-quant activations of row m of x (KActs): qmatmul's blocks of 32, quantized into the
   row's staging (q K bytes, d and sums nb values, row-major), then laid superblock-major. */
static void quantize_row_k(const void *x, int dtype, int64_t K, int fmt, int variant,
                           const KActs *acts, int64_t m, int8_t *stage_q, float *stage_d,
                           int32_t *stage_sums) {
    if (variant == QVAR_SCALAR)
        quantize_row_scalar(x, dtype, K, fmt, stage_q, stage_d, NULL, NULL, stage_sums, NULL, 1);
    else
        quantize_row(x, dtype, K, fmt, stage_q, stage_d, NULL, NULL, stage_sums, NULL, 1);
    for (int64_t s = 0; s < K / QK_SUPER; s++) {
        const int64_t at = ks_at(acts, m, s);
        const int8_t *super = stage_q + s * QK_SUPER;
        if (fmt == QFMT_Q6_K)
            for (int i = 0; i < 16; i++) {  /* half i / 8 of group i % 8 */
                const int8_t *a = super + 32 * (i % 8) + 16 * (i / 8);
                int32_t total = 0;
                for (int e = 0; e < 16; e++) total += a[e];
                ((int32_t *)acts->bs32)[at * 16 + i] = 32 * total;
            }
        int8_t *words = (int8_t *)acts->q + at * QK_SUPER;
        for (int g = 0; g < 8; g++)
            for (int p = 0; p < 8; p++) memcpy(words + 32 * p + 4 * g, super + 32 * g + 4 * p, 4);
        memcpy((float *)acts->d + at * 8, stage_d + 8 * s, 8 * sizeof(float));
        memcpy((int32_t *)acts->sums + at * 8, stage_sums + 8 * s, 8 * sizeof(int32_t));
    }
}

/* The K-quant product (qmatmul's contract, output row stride y_stride) by team t. */
static int qmatmul_k(const Team *t, int fmt, int variant, const uint8_t *W, int64_t N, int64_t K,
                     const void *X, int dtype, int64_t x_stride, int64_t M, const float *bias,
                     float *Y, int64_t y_stride) {
    static const kgroup_fn groups[4] = {kgroup_scalar, kgroup_avx2, kgroup_avxvnni,
                                        kgroup_avx512vnni};
    const kgroup_fn group = groups[variant];
    const int64_t nb = K / QBLOCK, ns = K / QK_SUPER, row_bytes = ns * qblock_bytes(fmt);
    const int64_t block_rows = M < QROW_BLOCK ? M : QROW_BLOCK;
    /* scratch: q (block_rows, K) int8, d and sums (block_rows, nb), bs32 (block_rows, ns, 16)
       (KActs), then the rows' staging: q, d, sums again, row-major */
    const size_t q_bytes = (size_t)(block_rows * K), v_bytes = (size_t)(block_rows * nb) * 4;
    const size_t bs_at = (q_bytes + 2 * v_bytes + 63) / 64 * 64;
    const size_t bs_bytes = fmt == QFMT_Q6_K ? (size_t)(block_rows * ns * 16) * 4 : 0;
    const size_t stage_at = (bs_at + bs_bytes + 63) / 64 * 64;
    char *scratch = team_share(
        t, t->id ? NULL : aligned_alloc(64, (stage_at + q_bytes + 2 * v_bytes + 63) / 64 * 64));
    if (!scratch) return 3;
    int8_t *stage_q = (int8_t *)(scratch + stage_at);
    float *stage_d = (float *)(scratch + stage_at + q_bytes);
    int32_t *stage_sums = (int32_t *)(scratch + stage_at + q_bytes + v_bytes);
    const int64_t groups_n = (N + QGROUP - 1) / QGROUP;
    const size_t el = dtype == 0 ? 4 : 2;
    int64_t lo, hi;
    for (int64_t r0 = 0; r0 < M; r0 += QROW_BLOCK) {
        const int64_t rows = M - r0 < QROW_BLOCK ? M - r0 : QROW_BLOCK;
        const KActs acts = {(const int8_t *)scratch, (const float *)(scratch + q_bytes),
                            (const int32_t *)(scratch + q_bytes + v_bytes),
                            (const int32_t *)(scratch + bs_at), nb, rows};
        team_range(t, rows, &lo, &hi);
        for (int64_t r = lo; r < hi; r++)
            quantize_row_k((const char *)X + el * (size_t)((r0 + r) * x_stride), dtype, K, fmt,
                           variant, &acts, r, stage_q + r * K, stage_d + r * nb,
                           stage_sums + r * nb);
        team_sync(t, 0);
        team_range(t, groups_n, &lo, &hi);
        for (int64_t g = lo; g < hi; g++) {
            int64_t n0 = g * QGROUP, count = N - n0 < QGROUP ? N - n0 : QGROUP;
            group(fmt, W, row_bytes, &acts, bias, Y + r0 * y_stride, y_stride, 0, rows, n0,
                  count);
        }
        team_sync(t, 0);
    }
    if (t->id == 0) free(scratch);
    return 0;
}

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

/* One work item of qmatmul_into: row block `block` of a span of `span` rows (its activations
   at the block's offsets in the span's arrays) times output group `g` (QGROUP rows; N % 8 == 0
   in layout 1, so a group's count stays a multiple of 8). */
static inline void qmatmul_item(qgroup_fn group, int fmt, const uint8_t *W, int64_t row_bytes,
                                int64_t K, int64_t nb, const int8_t *q, const float *d,
                                const float *s, const int32_t *corr, const int32_t *sums,
                                const int32_t *noff, int64_t span, int64_t block, int64_t g,
                                int64_t N, const float *bias, float *Y, int64_t y_stride) {
    const int64_t r0 = block * QROW_BLOCK, rows = span - r0 < QROW_BLOCK ? span - r0 : QROW_BLOCK;
    const int64_t off = r0 * nb;
    const QActs acts = {q + r0 * K, d + off, s + off, corr ? corr + off * 8 : NULL, sums + off,
                        noff + off, K, nb, rows};
    const int64_t n0 = g * QGROUP, count = N - n0 < QGROUP ? N - n0 : QGROUP;
    group(fmt, W, row_bytes, &acts, bias, Y + r0 * y_stride, y_stride, 0, rows, n0, count);
}

/* Y (M, N) float32 = X (M, K) @ W^T [+ bias (N) float32] for W (N, K) in format fmt (0 q4_0,
   1 q4_1, 2 q8_0, 3 q5_0, 4 q5_1, 5 q4_k, 6 q5_k, 7 q6_k) as blocks of layout 0 (GGUF) or 1
   (x8, formats 0..2 and 5..7, N % 8 == 0); X float32 (dtype 0) or bfloat16 (1), row stride x_stride
   elements; Y row stride y_stride (>= N). Computed by team t (every thread of it calls this with
   the same arguments and gets the same status); Y is complete when it returns. */
static int qmatmul_team(const Team *t, int fmt, int layout, int variant, const uint8_t *W,
                        int64_t N, int64_t K, const void *X, int dtype, int64_t x_stride,
                        int64_t M, const float *bias, float *Y, int64_t y_stride) {
    if (fmt < 0 || fmt >= QFMT_COUNT || variant < 0 || variant > 3 || (dtype != 0 && dtype != 1)
        || (layout != 0 && layout != 1)
        || (layout == 1 && fmt > QFMT_Q8_0 && !is_kquant(fmt)))
        return 4;
    if (N < 1 || M < 1 || K < qblock_values(fmt) || K % qblock_values(fmt) || x_stride < K
        || y_stride < N || (layout == 1 && N % 8))
        return 2;
    if (!qmatmul_supported(variant)) return 5;
    if (is_kquant(fmt) && layout == 1)
        return qmatmul_k8(t, fmt, variant, W, N, K, X, dtype, x_stride, M, bias, Y, y_stride);
    if (is_kquant(fmt))
        return qmatmul_k(t, fmt, variant, W, N, K, X, dtype, x_stride, M, bias, Y, y_stride);
    static const qgroup_fn groups[2][4] = {
        {qgroup_scalar, qgroup_avx2, qgroup_avxvnni, qgroup_avx512vnni},
        {qgroup8_scalar, qgroup8_avx2, qgroup8_avxvnni, qgroup8_avx512vnni}};
    const qgroup_fn group = groups[layout][variant];
    const int64_t nb = K / QBLOCK, row_bytes = nb * qblock_bytes(fmt);
    const int64_t span_rows = M < QROW_SPAN ? M : QROW_SPAN;
    /* scratch for a span of up to QROW_SPAN rows, row block by row block; each block of up to
       QROW_BLOCK rows block-major (QActs): q (nb, rows, 32) int8, d, s, sums and noff
       (nb, rows) 4 bytes each, corr (nb, rows, 8) int32 for the q4_0 GGUF-layout kernel */
    const int with_corr = (fmt == QFMT_Q4_0 || fmt == QFMT_Q5_0) && layout == 0;
    const size_t q_bytes = (size_t)(span_rows * K), ds_bytes = (size_t)(span_rows * nb) * 4;
    const size_t corr_bytes = with_corr ? (size_t)(span_rows * nb * 8) * 4 : 0;
    char *scratch = team_share(
        t, t->id ? NULL : aligned_alloc(64, (q_bytes + 4 * ds_bytes + corr_bytes + 127) / 64 * 64));
    if (!scratch) return 3;
    int8_t *q_all = (int8_t *)scratch;
    float *d_all = (float *)(scratch + q_bytes), *s_all = (float *)(scratch + q_bytes + ds_bytes);
    int32_t *sums_all = (int32_t *)(scratch + q_bytes + 2 * ds_bytes);
    int32_t *noff_all = (int32_t *)(scratch + q_bytes + 3 * ds_bytes);
    int32_t *corr_all = with_corr ? (int32_t *)(scratch + q_bytes + 4 * ds_bytes) : NULL;
    const int64_t groups_n = (N + QGROUP - 1) / QGROUP;
    const size_t el = dtype == 0 ? 4 : 2;
    /* Many rows: the work items (a row block, a group of outputs) go to whichever thread is
       free (a thread another process delays holds no one up at the span's end); few rows
       (decode) keep each thread its contiguous run of groups, which its prefetches follow.
       Either way an item is computed by the same code: the bits do not depend on it. */
    const int dynamic = M >= QROW_BLOCK;
    int64_t lo, hi;
    for (int64_t s0 = 0; s0 < M; s0 += QROW_SPAN) {
        const int64_t span = M - s0 < QROW_SPAN ? M - s0 : QROW_SPAN;
        const int64_t blocks = (span + QROW_BLOCK - 1) / QROW_BLOCK;
        team_range(t, span, &lo, &hi);
        for (int64_t r = lo; r < hi; r++) {
            /* row r of the span: row r % QROW_BLOCK of its row block, whose arrays start
               at its first row's offset with a stride of the block's row count */
            const int64_t r0 = r / QROW_BLOCK * QROW_BLOCK;
            const int64_t rows = span - r0 < QROW_BLOCK ? span - r0 : QROW_BLOCK;
            const int64_t i = r - r0;
            const void *x = (const char *)X + el * (size_t)((s0 + r) * x_stride);
            int8_t *q = q_all + r0 * K + i * QBLOCK;
            float *d = d_all + r0 * nb + i, *sv = s_all + r0 * nb + i;
            int32_t *sums = sums_all + r0 * nb + i, *noff = noff_all + r0 * nb + i;
            int32_t *row_corr = corr_all ? corr_all + (r0 * nb + i) * 8 : NULL;
            if (variant == QVAR_SCALAR)
                quantize_row_scalar(x, dtype, K, fmt, q, d, sv, row_corr, sums, noff, rows);
            else
                quantize_row(x, dtype, K, fmt, q, d, sv, row_corr, sums, noff, rows);
        }
        if (dynamic && t->id == 0) team_restart(t);
        team_sync(t, 0);
        const int64_t items = blocks * groups_n;
        if (dynamic) {
            for (int64_t i0; (i0 = team_next(t, 4)) < items;)
                for (int64_t item = i0; item < items && item < i0 + 4; item++)
                    qmatmul_item(group, fmt, W, row_bytes, K, nb, q_all, d_all, s_all, corr_all,
                                 sums_all, noff_all, span, item / groups_n, item % groups_n, N,
                                 bias, Y + s0 * y_stride, y_stride);
        } else {
            team_range(t, items, &lo, &hi);
            for (int64_t item = lo; item < hi; item++)
                qmatmul_item(group, fmt, W, row_bytes, K, nb, q_all, d_all, s_all, corr_all,
                             sums_all, noff_all, span, item / groups_n, item % groups_n, N,
                             bias, Y + s0 * y_stride, y_stride);
        }
        team_sync(t, 0);
    }
    if (t->id == 0) free(scratch);
    return 0;
}

/* qmatmul_team over a region of `threads` threads opened here (the per-op entry). */
int qmatmul_into(int fmt, int layout, int variant, const uint8_t *W, int64_t N, int64_t K,
                 const void *X, int dtype, int64_t x_stride, int64_t M, const float *bias,
                 float *Y, int64_t y_stride, int threads) {
    return TEAM_RUN(threads, (double)M * N * K,
                    qmatmul_team(t, fmt, layout, variant, W, N, K, X, dtype, x_stride, M, bias, Y,
                                 y_stride));
}

/* qmatmul_into with the output rows packed (y_stride N). */
int qmatmul(int fmt, int layout, int variant, const uint8_t *W, int64_t N, int64_t K,
            const void *X, int dtype, int64_t x_stride, int64_t M, const float *bias, float *Y,
            int threads) {
    return qmatmul_into(fmt, layout, variant, W, N, K, X, dtype, x_stride, M, bias, Y, N, threads);
}

/* Just step 1, for tests: X (M, K) quantized as qmatmul does (q (M, K) int8, d and s (M, nb),
   corr (M, nb, 8), sums (M, nb)), by `variant`'s quantizer (0 scalar, else AVX2). */
int qmatmul_quantize_rows(int fmt, int variant, const void *X, int dtype, int64_t M, int64_t K,
                          int8_t *q, float *d, float *s, int32_t *corr, int32_t *sums) {
    if (fmt < 0 || fmt >= QFMT_COUNT || (dtype != 0 && dtype != 1)) return 4;
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
