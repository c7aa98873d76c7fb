/* The block-product loops of qmatmul.c, written once and compiled once per instruction set.
 *
 * qmatmul.c includes this file several times, each time with
 *   QK_SUFFIX  a name suffix (avx2, avxvnni, avx512vnni), and
 *   QK_DOT(u, s)  8 int32 lanes, lane j = sum over bytes 4j..4j+3 of u (unsigned) * s (signed):
 *                 maddubs + madd on AVX2, one dpbusd with VNNI (the same integers),
 * under a target pragma for the VNNI variants. Every variant computes the same integers and
 * the same float operations in the same order, so their results are equal bit for bit.
 *
 * Layout "gguf" (the file's; q4_0, q4_1, q8_0, q5_0, q5_1 -- the K-quants are
 * qmatmul_ktiles.h's): a tile is R activation rows (1..4) times T weight rows (1, 2 or 4);
 * its R*T accumulators
 * are named variables (an array of vectors is kept in memory by gcc 12, see matvec.c).
 * Per block b of 32 inputs, for each weight row t: the 32 weights as bytes (q4: the nibbles
 * unpacked, low nibbles = elements 0..15 in the low half, high = 16..31 in the high half;
 * q5: the same nibbles | the fifth bits << 4; q8: as stored) and the block's scale (and
 * min); for each row r and weight row t:
 *
 *   i     = QK_DOT(w, a)          (q8_0: QK_DOT(|a|, sign(w, a)), the sign trick)
 *   q4_0: i -= 8 * (the activation's 4-element sums)  -- (q - 8) * a, exactly
 *   q5_0: i -= 16 * (the same sums)                    -- (q - 16) * a
 *   acc   = fma(float(i), d_w * d_a, acc)
 *   q4_1, q5_1: acc = fma([m_w, 0, ..., 0], s_a, acc)  -- the min term, in lane 0 only
 *
 * and after the last block the output is hsum(acc) [+ bias].
 *
 * Layout "x8" (8 weight rows interleaved 4 inputs at a time, quant/formats.py): one 32-byte
 * load holds 4 inputs of all 8 rows of a group, multiplied by a row's 4 activations
 * broadcast, so the int32 lanes ARE the 8 outputs. Per block b and row r:
 *
 *   i     = exact int32 dot products of the 8 weight rows with the row's 32 activations
 *           (AVX2: int16 partial sums, at most 8 * 2 * 15 * 128 = 30720 for 4-bit weights,
 *           then madd; q8_0 and VNNI: int32 throughout; VNNI q8_0: the weights + 128 times
 *           the activations, then - 128 * sum(q_a))
 *   q4_0: i -= 8 * sum(q_a)
 *   acc   = fma(float(i), d_w[0..7] * d_a, acc)
 *   q4_1: acc = fma(m_w[0..7], s_a, acc)
 *
 * and after the last block the outputs are acc [+ bias]. Three loop nests run it:
 *   qtile8   R rows (1..4) times one group, accumulators in registers, the block's weights
 *            unpacked per tile (few rows);
 *   qpanel8  every row of the call times one group: per block the 8 weight vectors are
 *            unpacked into registers once and applied to all rows, whose accumulators live
 *            in a small array (many rows: the unpacking is shared, and no register limit);
 *   qpanel16 (AVX512) the same for two groups at once, one 512-bit vector per step (lanes 0..7
 *            the first group, 8..15 the second), with R = 1..4 accumulators in registers or
 *            any number in the array.
 * Each (row, output) pair goes through exactly its layout's sequence whatever the loop nest,
 * M and the threads are: a row's result does not depend on the other rows of the call.
 */

#define QK_CAT2(a, b) a##_##b
#define QK_CAT(a, b) QK_CAT2(a, b)
#define QK_FN(name) QK_CAT(name, QK_SUFFIX)

#define QT_ACC(r) __m256 c##r##0, c##r##1, c##r##2, c##r##3;
#define QT_ALL(r, OP) OP(r, 0) OP(r, 1) OP(r, 2) OP(r, 3)
#define QT_INIT(r, t) if (R > r && T > t) c##r##t = _mm256_setzero_ps();
#define QT_ROW_INIT(r) QT_ALL(r, QT_INIT)
#define QT_FOR_ROWS(OP) OP(0) OP(1) OP(2) OP(3)

/* One (row r, weight row t) step of block b (see the header comment). */
#define QT_STEP(r, t)                                                                          \
    if (R > r && T > t) {                                                                      \
        __m256i i = FMT == QFMT_Q8_0 ? QK_DOT(ua, _mm256_sign_epi8(w##t, a)) : QK_DOT(w##t, a); \
        if (FMT == QFMT_Q4_0 || FMT == QFMT_Q5_0) i = _mm256_sub_epi32(i, corr);               \
        c##r##t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw##t, da), c##r##t);   \
        if (FMT == QFMT_Q4_1 || FMT == QFMT_Q5_1) c##r##t = _mm256_fmadd_ps(mw##t, sa, c##r##t); \
    }
#define QT_ROW(r)                                                                              \
    if (R > r) {                                                                               \
        const int64_t at = qa_at(acts, m0 + r, b);                                             \
        __m256i a = _mm256_load_si256((const __m256i *)(acts->q + at * QBLOCK));               \
        __m256 da = _mm256_broadcast_ss(acts->d + at);                                         \
        __m256i ua = _mm256_setzero_si256(), corr = _mm256_setzero_si256();                    \
        __m256 sa = _mm256_setzero_ps();                                                       \
        if (FMT == QFMT_Q8_0) ua = _mm256_abs_epi8(a);                                         \
        if (FMT == QFMT_Q4_0 || FMT == QFMT_Q5_0)                                              \
            corr = _mm256_loadu_si256((const __m256i *)(acts->corr + at * 8));                 \
        if (FMT == QFMT_Q4_1 || FMT == QFMT_Q5_1) sa = _mm256_broadcast_ss(acts->s + at);      \
        QT_ALL(r, QT_STEP)                                                                     \
    }
/* Weight row t of block b: its bytes, its scale broadcast, its min in lane 0 (q4_1). */
#define QT_WEIGHT(t)                                                                           \
    __m256i w##t = _mm256_setzero_si256();                                                     \
    __m256 dw##t = _mm256_setzero_ps(), mw##t = _mm256_setzero_ps();                           \
    if (T > t) {                                                                               \
        const uint8_t *blk = W + (n0 + t) * row_bytes + b * BYTES;                             \
        w##t = FMT == QFMT_Q8_0 ? _mm256_loadu_si256((const __m256i *)(blk + 2))                \
               : FMT == QFMT_Q5_0 || FMT == QFMT_Q5_1 ? unpack_five(blk + HEADER)              \
                                                      : unpack_nibbles(blk + HEADER);          \
        dw##t = _mm256_set1_ps(half_to_float(blk));                                            \
        if (FMT == QFMT_Q4_1 || FMT == QFMT_Q5_1)                                              \
            mw##t = _mm256_zextps128_ps256(_mm_set_ss(half_to_float(blk + 2)));                \
    }
#define QT_STORE(r, t)                                                                         \
    if (R > r && T > t) {                                                                      \
        float v = hsum(c##r##t);                                                               \
        if (bias) v += bias[n0 + t];                                                           \
        Y[(m0 + r) * N + n0 + t] = v;                                                          \
    }
#define QT_ROW_STORE(r) QT_ALL(r, QT_STORE)

/* Rows m0..m0+R-1 times weight rows n0..n0+T-1 of format FMT into Y (M, N). */
static inline __attribute__((always_inline)) void QK_FN(qtile)(
        const uint8_t *W, int64_t row_bytes, const QActs *acts, const float *bias, float *Y,
        int64_t N, int64_t m0, int64_t n0, const int FMT, const int R, const int T) {
    const int64_t nb = acts->nb;
    const int BYTES = FMT == QFMT_Q4_0 ? 18 : FMT == QFMT_Q4_1 ? 20 : FMT == QFMT_Q8_0 ? 34
                      : FMT == QFMT_Q5_0 ? 22 : 24;
    const int HEADER = FMT == QFMT_Q4_1 || FMT == QFMT_Q5_1 ? 4 : 2;
    QT_FOR_ROWS(QT_ACC)
    QT_FOR_ROWS(QT_ROW_INIT)
    for (int64_t b = 0; b < nb; b++) {
        QT_WEIGHT(0) QT_WEIGHT(1) QT_WEIGHT(2) QT_WEIGHT(3)
        QT_FOR_ROWS(QT_ROW)
    }
    QT_FOR_ROWS(QT_ROW_STORE)
}

/* One function per (format, R, T): each inlined copy keeps its accumulators in registers. */
typedef void (*QK_FN(qtile_fn))(const uint8_t *, int64_t, const QActs *, const float *, float *,
                                int64_t, int64_t, int64_t);
#define QT_DEFINE(F, R, T)                                                                     \
    static void QK_FN(qtile_##F##_##R##x##T)(const uint8_t *W, int64_t row_bytes,              \
                                              const QActs *acts, const float *bias, float *Y,  \
                                              int64_t N, int64_t m0, int64_t n0) {             \
        QK_FN(qtile)(W, row_bytes, acts, bias, Y, N, m0, n0, F, R, T);                         \
    }
#define QT_DEFINE_FMT(F)                                                                       \
    QT_DEFINE(F, 1, 1) QT_DEFINE(F, 2, 1) QT_DEFINE(F, 3, 1) QT_DEFINE(F, 4, 1)                \
    QT_DEFINE(F, 1, 2) QT_DEFINE(F, 2, 2) QT_DEFINE(F, 3, 2) QT_DEFINE(F, 4, 2)                \
    QT_DEFINE(F, 1, 4)
QT_DEFINE_FMT(0) QT_DEFINE_FMT(1) QT_DEFINE_FMT(2) QT_DEFINE_FMT(3) QT_DEFINE_FMT(4)

/* The tile function of format fmt for `rows` (1..4) rows and `width` (1, 2, or 4 for one
   row) weight rows. */
static QK_FN(qtile_fn) QK_FN(qtile_for)(int fmt, int64_t rows, int width) {
#define QT_TABLE(F)                                                                            \
    {{QK_FN(qtile_##F##_1x1), QK_FN(qtile_##F##_2x1), QK_FN(qtile_##F##_3x1),                  \
      QK_FN(qtile_##F##_4x1)},                                                                 \
     {QK_FN(qtile_##F##_1x2), QK_FN(qtile_##F##_2x2), QK_FN(qtile_##F##_3x2),                  \
      QK_FN(qtile_##F##_4x2)}}
    static const QK_FN(qtile_fn) table[5][2][4] = {QT_TABLE(0), QT_TABLE(1), QT_TABLE(2),
                                                   QT_TABLE(3), QT_TABLE(4)};
#undef QT_TABLE
    static const QK_FN(qtile_fn) wide[5] = {QK_FN(qtile_0_1x4), QK_FN(qtile_1_1x4),
                                            QK_FN(qtile_2_1x4), QK_FN(qtile_3_1x4),
                                            QK_FN(qtile_4_1x4)};
    if (width == 4) return wide[fmt];
    return table[fmt][width == 2][rows - 1];
}

/* Weight rows n0..n0+count-1 times activation rows m_begin..m_end-1: one row four weight
   rows at a time, more rows two weight rows at a time, in row chunks of at most 4. */
static void QK_FN(qgroup)(int fmt, const uint8_t *W, int64_t row_bytes, const QActs *acts,
                          const float *bias, float *Y, int64_t N, int64_t m_begin,
                          int64_t m_end, int64_t n0, int64_t count) {
    int64_t rows_total = m_end - m_begin;
    int wide = rows_total == 1 ? 4 : 2;
    for (int64_t j = 0; j < count;) {
        int width = count - j >= wide ? wide : (count - j >= 2 ? 2 : 1);
        for (int64_t m0 = m_begin; m0 < m_end;) {
            int64_t rows = m_end - m0 < QROWS ? m_end - m0 : QROWS;
            QK_FN(qtile_for)(fmt, width == 4 ? 1 : rows, width)(W, row_bytes, acts, bias, Y, N, m0,
                                                                n0 + j);
            m0 += width == 4 ? 1 : rows;
        }
        j += width;
    }
}

/* ---- layout x8 ---------------------------------------------------------------------------- */

#define Q8_ROW_ACC(r) __m256 f##r = _mm256_setzero_ps();
#define Q8_ROW_ZERO(r) __m256i s##r = _mm256_setzero_si256();
/* Rows r of chunk p (4-bit: lo = inputs 4p.., hi = 16+4p..) or g (q8_0). */
#define Q8_ROW_Q4(r)                                                                           \
    if (R > r) {                                                                               \
        const int8_t *qa = qa_q(acts, m0 + r, b) + 4 * p;                                      \
        s##r = QK_Q4_ACC(s##r, lo, _mm256_set1_epi32(load_i32(qa)));                           \
        s##r = QK_Q4_ACC(s##r, hi, _mm256_set1_epi32(load_i32(qa + 16)));                      \
    }
#if QK_VNNI
/* VNNI: the weights + 128 (unsigned), and -128 * sum(q_a) added in Q8_ROW_SCALE */
#define Q8_ROW_Q8(r)                                                                           \
    if (R > r) {                                                                               \
        const __m256i a = _mm256_set1_epi32(load_i32(qa_q(acts, m0 + r, b) + 4 * g));          \
        s##r = QK_DPBUSD(s##r, w, a);                                                          \
    }
#else
#define Q8_ROW_Q8(r)                                                                           \
    if (R > r) {                                                                               \
        const __m256i a = _mm256_set1_epi32(load_i32(qa_q(acts, m0 + r, b) + 4 * g));          \
        s##r = QK_Q8_ACC(s##r, uw, w, a);                                                      \
    }
#endif
#define Q8_ROW_SCALE(r)                                                                        \
    if (R > r) {                                                                               \
        const int64_t at = qa_at(acts, m0 + r, b);                                             \
        __m256i i = FMT == QFMT_Q8_0 ? s##r : QK_Q4_FINISH(s##r);                               \
        if (FMT == QFMT_Q4_0 || (FMT == QFMT_Q8_0 && QK_VNNI))                                \
            i = _mm256_add_epi32(i, _mm256_set1_epi32(acts->noff[at]));                        \
        f##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i),                                          \
                               _mm256_mul_ps(dw, _mm256_broadcast_ss(acts->d + at)), f##r);    \
        if (FMT == QFMT_Q4_1) f##r = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(acts->s + at), f##r); \
    }
#define Q8_ROW_STORE(r)                                                                        \
    if (R > r) {                                                                               \
        __m256 v = f##r;                                                                       \
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0));                            \
        _mm256_storeu_ps(Y + (m0 + r) * N + n0, v);                                            \
    }
#define Q8_FOR_ROWS(OP) OP(0) OP(1) OP(2) OP(3)

/* Rows m0..m0+R-1 times the 8 weight rows n0..n0+7 (n0 % 8 == 0) of an x8 weight. */
static inline __attribute__((always_inline)) void QK_FN(qtile8)(
        const uint8_t *W, int64_t row_bytes, const QActs *acts, const float *bias, float *Y,
        int64_t N, int64_t m0, int64_t n0, const int FMT, const int R) {
    const int64_t nb = acts->nb;
    const int SB = 8 * (FMT == QFMT_Q4_0 ? 18 : FMT == QFMT_Q4_1 ? 20 : 34);
    const int VALUES = FMT == QFMT_Q4_1 ? 32 : 16;
    const __m256i low = _mm256_set1_epi8(0x0F);
    const uint8_t *group = W + n0 * row_bytes;
    Q8_FOR_ROWS(Q8_ROW_ACC)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sb = group + b * SB;
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sb));
        const __m256 mw = FMT == QFMT_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16)))
                                           : _mm256_setzero_ps();
        Q8_FOR_ROWS(Q8_ROW_ZERO)
        if (FMT == QFMT_Q8_0) {
            for (int g = 0; g < 8; g++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(sb + VALUES + 32 * g));
#if QK_VNNI
                w = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
#else
                __asm__("" : "+x"(w));  /* one load: gcc would fold it into both users */
                const __m256i uw = _mm256_abs_epi8(w);
#endif
                Q8_FOR_ROWS(Q8_ROW_Q8)
            }
        } else {
            for (int p = 0; p < 4; p++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(sb + VALUES + 32 * p));
                const __m256i lo = _mm256_and_si256(v, low);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                Q8_FOR_ROWS(Q8_ROW_Q4)
            }
        }
        Q8_FOR_ROWS(Q8_ROW_SCALE)
    }
    Q8_FOR_ROWS(Q8_ROW_STORE)
}

typedef void (*QK_FN(qtile8_fn))(const uint8_t *, int64_t, const QActs *, const float *,
                                 float *, int64_t, int64_t, int64_t);
#define Q8_DEFINE(F, R)                                                                        \
    static void QK_FN(qtile8_##F##_##R)(const uint8_t *W, int64_t row_bytes,                   \
                                         const QActs *acts, const float *bias, float *Y,       \
                                         int64_t N, int64_t m0, int64_t n0) {                  \
        QK_FN(qtile8)(W, row_bytes, acts, bias, Y, N, m0, n0, F, R);                           \
    }
Q8_DEFINE(0, 1) Q8_DEFINE(0, 2) Q8_DEFINE(0, 3) Q8_DEFINE(0, 4)
Q8_DEFINE(1, 1) Q8_DEFINE(1, 2) Q8_DEFINE(1, 3) Q8_DEFINE(1, 4)
Q8_DEFINE(2, 1) Q8_DEFINE(2, 2) Q8_DEFINE(2, 3) Q8_DEFINE(2, 4)

/* The panel: weight rows n0..n0+7 times activation rows m_begin..m_end-1 (any number up to
   QROW_BLOCK), block by block: a block's 8 weight vectors are unpacked into registers once and
   applied to every row, whose float accumulators live in acc (8 floats a row). Weight vector k
   (0..7) holds inputs 4k..4k+3 of the 8 rows: q4, k < 4: the low nibbles of chunk k, k >= 4:
   the high nibbles of chunk k - 4; q8_0: chunk k. Per row: the exact int32 dot products i of
   the 8 rows with the 32 activations, then exactly the float steps of the header comment. */
#if QK_VNNI
/* The 8 dot products plus init: two dpbusd chains of 4 (u: unsigned bytes; q8_0 passes its
   weights + 128 and init = -128 * sum(q_a)). */
#define QP_DOT(init, w, qa)                                                                    \
    _mm256_add_epi32(                                                                          \
        QK_DPBUSD(QK_DPBUSD(QK_DPBUSD(QK_DPBUSD(init, w##0, QP_BC(qa, 0)), w##1, QP_BC(qa, 1)),  \
                            w##2, QP_BC(qa, 2)), w##3, QP_BC(qa, 3)),                          \
        QK_DPBUSD(QK_DPBUSD(QK_DPBUSD(QK_DPBUSD(_mm256_setzero_si256(), w##4, QP_BC(qa, 4)),     \
                                      w##5, QP_BC(qa, 5)), w##6, QP_BC(qa, 6)),                \
                  w##7, QP_BC(qa, 7)))
#endif
#define QP_BC(qa, k) _mm256_set1_epi32(load_i32((qa) + 4 * (k)))

static inline __attribute__((always_inline)) void QK_FN(qpanel8)(
        const uint8_t *W, int64_t row_bytes, const QActs *acts, const float *bias, float *Y,
        int64_t N, int64_t m_begin, int64_t m_end, int64_t n0, const int FMT) {
    const int64_t nb = acts->nb, stride = acts->rows, M = m_end - m_begin;
    const int SB = 8 * (FMT == QFMT_Q4_0 ? 18 : FMT == QFMT_Q4_1 ? 20 : 34);
    const int VALUES = FMT == QFMT_Q4_1 ? 32 : 16;
    const uint8_t *group = W + n0 * row_bytes;
    float acc[QROW_BLOCK * 8] __attribute__((aligned(32)));
    for (int64_t m = 0; m < M; m++) _mm256_store_ps(acc + 8 * m, _mm256_setzero_ps());
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sb = group + b * SB;
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sb));
        const __m256 mw = FMT == QFMT_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16)))
                                           : _mm256_setzero_ps();
        __m256i w0, w1, w2, w3, w4, w5, w6, w7;
        if (FMT == QFMT_Q8_0) {
#define QP_LOAD8(k) w##k = _mm256_loadu_si256((const __m256i *)(sb + 16 + 32 * k));
            QP_LOAD8(0) QP_LOAD8(1) QP_LOAD8(2) QP_LOAD8(3)
            QP_LOAD8(4) QP_LOAD8(5) QP_LOAD8(6) QP_LOAD8(7)
#undef QP_LOAD8
#if QK_VNNI
            const __m256i flip = _mm256_set1_epi8((char)0x80);
            w0 = _mm256_xor_si256(w0, flip); w1 = _mm256_xor_si256(w1, flip);
            w2 = _mm256_xor_si256(w2, flip); w3 = _mm256_xor_si256(w3, flip);
            w4 = _mm256_xor_si256(w4, flip); w5 = _mm256_xor_si256(w5, flip);
            w6 = _mm256_xor_si256(w6, flip); w7 = _mm256_xor_si256(w7, flip);
#else
            /* |w| (their signs are read again from the superblock, per row) */
            w0 = _mm256_abs_epi8(w0); w1 = _mm256_abs_epi8(w1); w2 = _mm256_abs_epi8(w2);
            w3 = _mm256_abs_epi8(w3); w4 = _mm256_abs_epi8(w4); w5 = _mm256_abs_epi8(w5);
            w6 = _mm256_abs_epi8(w6); w7 = _mm256_abs_epi8(w7);
#endif
        } else {
            const __m256i low = _mm256_set1_epi8(0x0F);
#define QP_UNPACK(p, k)                                                                        \
            {                                                                                  \
                const __m256i v = _mm256_loadu_si256((const __m256i *)(sb + VALUES + 32 * p)); \
                w##p = _mm256_and_si256(v, low);                                               \
                w##k = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);                         \
            }
            QP_UNPACK(0, 4) QP_UNPACK(1, 5) QP_UNPACK(2, 6) QP_UNPACK(3, 7)
#undef QP_UNPACK
        }
        const int64_t at0 = b * stride + m_begin;
        const int8_t *qa = acts->q + at0 * QBLOCK;
        const float *da = acts->d + at0, *sa = acts->s + at0;
        const int32_t *noff = acts->noff + at0;
        for (int64_t m = 0; m < M; m++, qa += QBLOCK) {
            __m256i i;
#if QK_VNNI
            i = QP_DOT(FMT == QFMT_Q4_1 ? _mm256_setzero_si256() : _mm256_set1_epi32(noff[m]), w, qa);
#else
            const __m256i ones = _mm256_set1_epi16(1);
            if (FMT == QFMT_Q8_0) {
                /* the sign trick (QK_Q8_ACC): |w| times a with w's sign, pairs summed in
                   int16 (exact), each chunk widened to int32 */
#define QP_S8(k) _mm256_madd_epi16(_mm256_maddubs_epi16(w##k, _mm256_sign_epi8(                    \
                     QP_BC(qa, k), _mm256_loadu_si256((const __m256i *)(sb + 16 + 32 * k)))), ones)
                i = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(QP_S8(0), QP_S8(1)),
                                                      _mm256_add_epi32(QP_S8(2), QP_S8(3))),
                                     _mm256_add_epi32(_mm256_add_epi32(QP_S8(4), QP_S8(5)),
                                                      _mm256_add_epi32(QP_S8(6), QP_S8(7))));
#undef QP_S8
            } else {
                /* int16 partial sums, at most 8 * 2 * 15 * 128 = 30720 in any order */
#define QP_S4(k) _mm256_maddubs_epi16(w##k, QP_BC(qa, k))
                __m256i h = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(QP_S4(0), QP_S4(1)),
                                                              _mm256_add_epi16(QP_S4(2), QP_S4(3))),
                                             _mm256_add_epi16(_mm256_add_epi16(QP_S4(4), QP_S4(5)),
                                                              _mm256_add_epi16(QP_S4(6), QP_S4(7))));
#undef QP_S4
                i = _mm256_madd_epi16(h, ones);
                if (FMT == QFMT_Q4_0) i = _mm256_add_epi32(i, _mm256_set1_epi32(noff[m]));
            }
#endif
            __m256 f = _mm256_load_ps(acc + 8 * m);
            f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw, _mm256_set1_ps(da[m])), f);
            if (FMT == QFMT_Q4_1) f = _mm256_fmadd_ps(mw, _mm256_set1_ps(sa[m]), f);
            _mm256_store_ps(acc + 8 * m, f);
        }
    }
    for (int64_t m = 0; m < M; m++) {
        __m256 v = _mm256_load_ps(acc + 8 * m);
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0));
        _mm256_storeu_ps(Y + (m_begin + m) * N + n0, v);
    }
}
#undef QP_BC
#undef QP_DOT

static void QK_FN(qpanel8_0)(const uint8_t *W, int64_t row_bytes, const QActs *acts,
                             const float *bias, float *Y, int64_t N, int64_t m_begin,
                             int64_t m_end, int64_t n0) {
    QK_FN(qpanel8)(W, row_bytes, acts, bias, Y, N, m_begin, m_end, n0, 0);
}
static void QK_FN(qpanel8_1)(const uint8_t *W, int64_t row_bytes, const QActs *acts,
                             const float *bias, float *Y, int64_t N, int64_t m_begin,
                             int64_t m_end, int64_t n0) {
    QK_FN(qpanel8)(W, row_bytes, acts, bias, Y, N, m_begin, m_end, n0, 1);
}
static void QK_FN(qpanel8_2)(const uint8_t *W, int64_t row_bytes, const QActs *acts,
                             const float *bias, float *Y, int64_t N, int64_t m_begin,
                             int64_t m_end, int64_t n0) {
    QK_FN(qpanel8)(W, row_bytes, acts, bias, Y, N, m_begin, m_end, n0, 2);
}

#ifdef QK_ZMM
/* The panel of 16 weight rows n0..n0+15 (two x8 groups, n0 % 8 == 0) in 512-bit vectors: lanes
   0..7 are group n0's rows, 8..15 group n0 + 8's, each lane through exactly the operations of
   the 8-row panel (so the same bits). */
#define QZ_DP(acc, w, qa, k) _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(load_i32((qa) + 4 * (k))))
#define QZ_DOT(init, w, qa)                                                                    \
    _mm512_add_epi32(                                                                          \
        QZ_DP(QZ_DP(QZ_DP(QZ_DP(init, w##0, qa, 0), w##1, qa, 1), w##2, qa, 2), w##3, qa, 3),  \
        QZ_DP(QZ_DP(QZ_DP(QZ_DP(_mm512_setzero_si512(), w##4, qa, 4), w##5, qa, 5), w##6, qa, 6), \
              w##7, qa, 7))
static inline __m512i qz_load2(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}
static inline __m512 qz_halves(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
        _mm_loadu_si128((const __m128i *)p1), 1));
}

static inline __attribute__((always_inline)) void QK_FN(qpanel16)(
        const uint8_t *W, int64_t row_bytes, const QActs *acts, const float *bias, float *Y,
        int64_t N, int64_t m_begin, int64_t m_end, int64_t n0, const int FMT, const int R) {
    /* R 1..4: exactly R rows, accumulators in registers; R 0: any number, in acc */
    const int64_t nb = acts->nb, stride = acts->rows, M = m_end - m_begin;
    const int SB = 8 * (FMT == QFMT_Q4_0 ? 18 : FMT == QFMT_Q4_1 ? 20 : 34);
    const int VALUES = FMT == QFMT_Q4_1 ? 32 : 16;
    const uint8_t *group0 = W + n0 * row_bytes, *group1 = group0 + 8 * row_bytes;
    float acc[QROW_BLOCK * 16] __attribute__((aligned(64)));
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    if (R == 0)
        for (int64_t m = 0; m < M; m++) _mm512_store_ps(acc + 16 * m, _mm512_setzero_ps());
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sb0 = group0 + b * SB, *sb1 = group1 + b * SB;
        /* The two groups are two short streams (one group's 8 rows, then the jump to the
           next 16), which the hardware prefetchers follow badly when the weight streams from
           memory (few rows): fetch the same block of the next 16 rows (the thread's next work
           item) a whole tile ahead, into L2 (as the K-quant panels, qmatmul_k8.h): into L1
           the prefetches evicted lines still in use, and one decode row streamed 1B q4_0
           at 22-23 GB/s on 2 threads, into L2 at 29-31 (docs/performance.md). */
        for (int o = 0; o < SB; o += 64) {
            _mm_prefetch((const char *)sb0 + 16 * row_bytes + o, _MM_HINT_T1);
            _mm_prefetch((const char *)sb1 + 16 * row_bytes + o, _MM_HINT_T1);
        }
        const __m512 dw = qz_halves(sb0, sb1);
        const __m512 mw = FMT == QFMT_Q4_1 ? qz_halves(sb0 + 16, sb1 + 16) : _mm512_setzero_ps();
        __m512i w0, w1, w2, w3, w4, w5, w6, w7;
        if (FMT == QFMT_Q8_0) {
            const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
#define QZ_LOAD8(k) w##k = _mm512_xor_si512(qz_load2(sb0 + 16 + 32 * k, sb1 + 16 + 32 * k), flip);
            QZ_LOAD8(0) QZ_LOAD8(1) QZ_LOAD8(2) QZ_LOAD8(3)
            QZ_LOAD8(4) QZ_LOAD8(5) QZ_LOAD8(6) QZ_LOAD8(7)
#undef QZ_LOAD8
        } else {
            const __m512i low = _mm512_set1_epi32(0x0F0F0F0F);
#define QZ_UNPACK(p, k)                                                                        \
            {                                                                                  \
                const __m512i v = qz_load2(sb0 + VALUES + 32 * p, sb1 + VALUES + 32 * p);      \
                w##p = _mm512_and_si512(v, low);                                               \
                w##k = _mm512_and_si512(_mm512_srli_epi32(v, 4), low);                         \
            }
            QZ_UNPACK(0, 4) QZ_UNPACK(1, 5) QZ_UNPACK(2, 6) QZ_UNPACK(3, 7)
#undef QZ_UNPACK
        }
        const int64_t at0 = b * stride + m_begin;
        const int8_t *qa = acts->q + at0 * QBLOCK;
        const float *da = acts->d + at0, *sa = acts->s + at0;
        const int32_t *noff = acts->noff + at0;
#define QZ_ROW(r)                                                                              \
        if (R > r) {                                                                           \
            const __m512i i = QZ_DOT(FMT == QFMT_Q4_1 ? _mm512_setzero_si512()                  \
                                                      : _mm512_set1_epi32(noff[r]), w, qa + 32 * r); \
            f##r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_set1_ps(da[r])), f##r); \
            if (FMT == QFMT_Q4_1) f##r = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[r]), f##r);      \
        }
        QZ_ROW(0) QZ_ROW(1) QZ_ROW(2) QZ_ROW(3)
#undef QZ_ROW
        if (R == 0)
        for (int64_t m = 0; m < M; m++, qa += QBLOCK) {
            const __m512i i = QZ_DOT(FMT == QFMT_Q4_1 ? _mm512_setzero_si512()
                                                      : _mm512_set1_epi32(noff[m]), w, qa);
            __m512 f = _mm512_load_ps(acc + 16 * m);
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_set1_ps(da[m])), f);
            if (FMT == QFMT_Q4_1) f = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[m]), f);
            _mm512_store_ps(acc + 16 * m, f);
        }
    }
    if (R > 0) {
        _mm512_store_ps(acc, f0);
        if (R > 1) _mm512_store_ps(acc + 16, f1);
        if (R > 2) _mm512_store_ps(acc + 32, f2);
        if (R > 3) _mm512_store_ps(acc + 48, f3);
    }
    for (int64_t m = 0; m < M; m++) {
        __m512 v = _mm512_load_ps(acc + 16 * m);
        if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n0));
        _mm512_storeu_ps(Y + (m_begin + m) * N + n0, v);
    }
}
#undef QZ_DP
#undef QZ_DOT
typedef void (*QK_FN(qpanel_fn))(const uint8_t *, int64_t, const QActs *, const float *, float *,
                                 int64_t, int64_t, int64_t, int64_t);
#define QZ_DEFINE(F, R)                                                                        \
    static void QK_FN(qpanel16_##F##_##R)(const uint8_t *W, int64_t row_bytes,                 \
                                           const QActs *acts, const float *bias, float *Y,     \
                                           int64_t N, int64_t m_begin, int64_t m_end,          \
                                           int64_t n0) {                                       \
        QK_FN(qpanel16)(W, row_bytes, acts, bias, Y, N, m_begin, m_end, n0, F, R);             \
    }
#define QZ_DEFINE_FMT(F) QZ_DEFINE(F, 0) QZ_DEFINE(F, 1) QZ_DEFINE(F, 2) QZ_DEFINE(F, 3) QZ_DEFINE(F, 4)
QZ_DEFINE_FMT(0) QZ_DEFINE_FMT(1) QZ_DEFINE_FMT(2)
#undef QZ_DEFINE_FMT
#undef QZ_DEFINE
#endif

#ifndef QZ_TILE_MAX_ROWS
#define QZ_TILE_MAX_ROWS 8
#endif
#ifndef QPANEL_MIN_ROWS
#define QPANEL_MIN_ROWS (QK_VNNI ? 5 : 3)
#endif
/* Weight rows n0..n0+count-1 (multiples of 8) of an x8 weight times activation rows
   m_begin..m_end-1. */
static void QK_FN(qgroup8)(int fmt, const uint8_t *W, int64_t row_bytes, const QActs *acts,
                           const float *bias, float *Y, int64_t N, int64_t m_begin,
                           int64_t m_end, int64_t n0, int64_t count) {
    static const QK_FN(qtile8_fn) table[3][4] = {
        {QK_FN(qtile8_0_1), QK_FN(qtile8_0_2), QK_FN(qtile8_0_3), QK_FN(qtile8_0_4)},
        {QK_FN(qtile8_1_1), QK_FN(qtile8_1_2), QK_FN(qtile8_1_3), QK_FN(qtile8_1_4)},
        {QK_FN(qtile8_2_1), QK_FN(qtile8_2_2), QK_FN(qtile8_2_3), QK_FN(qtile8_2_4)}};
    static void (*const panels[3])(const uint8_t *, int64_t, const QActs *, const float *,
                                   float *, int64_t, int64_t, int64_t, int64_t) = {
        QK_FN(qpanel8_0), QK_FN(qpanel8_1), QK_FN(qpanel8_2)};
#ifdef QK_ZMM
    static const QK_FN(qpanel_fn) wide[3][5] = {
#define QZ_ROWFNS(F) {QK_FN(qpanel16_##F##_0), QK_FN(qpanel16_##F##_1), QK_FN(qpanel16_##F##_2), \
                      QK_FN(qpanel16_##F##_3), QK_FN(qpanel16_##F##_4)}
        QZ_ROWFNS(0), QZ_ROWFNS(1), QZ_ROWFNS(2)};
#undef QZ_ROWFNS
#endif
    const int64_t rows = m_end - m_begin;
    for (int64_t j = 0; j < count;) {
#ifdef QK_ZMM
        if (count - j >= 16) {
            if (rows <= QZ_TILE_MAX_ROWS) {
                for (int64_t m0 = m_begin; m0 < m_end; m0 += 4) {
                    const int64_t r = m_end - m0 < 4 ? m_end - m0 : 4;
                    wide[fmt][r](W, row_bytes, acts, bias, Y, N, m0, m0 + r, n0 + j);
                }
            } else {
                wide[fmt][0](W, row_bytes, acts, bias, Y, N, m_begin, m_end, n0 + j);
            }
            j += 16;
            continue;
        }
#endif
        if (rows >= QPANEL_MIN_ROWS) {
            panels[fmt](W, row_bytes, acts, bias, Y, N, m_begin, m_end, n0 + j);
        } else {
            for (int64_t m0 = m_begin; m0 < m_end;) {
                int64_t r = m_end - m0 < QROWS ? m_end - m0 : QROWS;
                table[fmt][r - 1](W, row_bytes, acts, bias, Y, N, m0, n0 + j);
                m0 += r;
            }
        }
        j += 8;
    }
}

#undef Q8_ROW_ACC
#undef Q8_ROW_ZERO
#undef Q8_ROW_Q4
#undef Q8_ROW_Q8
#undef Q8_ROW_SCALE
#undef Q8_ROW_STORE
#undef Q8_FOR_ROWS
#undef Q8_DEFINE
#undef QT_ACC
#undef QT_ALL
#undef QT_INIT
#undef QT_ROW_INIT
#undef QT_FOR_ROWS
#undef QT_STEP
#undef QT_ROW
#undef QT_WEIGHT
#undef QT_STORE
#undef QT_ROW_STORE
#undef QT_DEFINE
#undef QT_DEFINE_FMT
#undef QK_FN
#undef QK_CAT
#undef QK_CAT2
