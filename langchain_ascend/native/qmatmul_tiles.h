/* The block-product loops of qmatmul.c, written once and compiled once per instruction set.
 *
 * qmatmul.c includes this file several times, each time with
 *   QK_SUFFIX  a name suffix (avx2, avxvnni, avx512vnni), and
 *   QK_DOT(u, s)  8 int32 lanes, lane j = sum over bytes 4j..4j+3 of u (unsigned) * s (signed):
 *                 maddubs + madd on AVX2, one dpbusd with VNNI (the same integers),
 * under a target pragma for the VNNI variants. Every variant computes the same integers and
 * the same float operations in the same order, so their results are equal bit for bit.
 *
 * Layout "gguf" (the file's): a tile is R activation rows (1..4) times T weight rows (1, 2 or
 * 4); its R*T accumulators
 * are named variables (an array of vectors is kept in memory by gcc 12, see matvec.c).
 * Per block b of 32 inputs, for each weight row t: the 32 weights as bytes (q4: the nibbles
 * unpacked, low nibbles = elements 0..15 in the low half, high = 16..31 in the high half;
 * q8: as stored) and the block's scale (and min); for each row r and weight row t:
 *
 *   i     = QK_DOT(w, a)          (q8_0: QK_DOT(|a|, sign(w, a)), the sign trick)
 *   q4_0: i -= 8 * (the activation's 4-element sums)  -- (q - 8) * a, exactly
 *   acc   = fma(float(i), d_w * d_a, acc)
 *   q4_1: acc = fma([m_w, 0, ..., 0], s_a, acc)        -- the min term, in lane 0 only
 *
 * and after the last block the output is hsum(acc) [+ bias].
 *
 * Layout "x8" (8 weight rows interleaved 4 inputs at a time, quant/formats.py): a tile is R
 * activation rows (1..4) times the 8 weight rows of a group; one 32-byte load holds 4 inputs
 * of all 8 rows, multiplied by the row's 4 activations broadcast, so the int32 lanes ARE the 8
 * outputs. Per block b and row r:
 *
 *   i     = exact int32 dot products of the 8 weight rows with the row's 32 activations
 *           (AVX2: int16 partial sums, at most 8 * 2 * 15 * 127 = 30480 for 4-bit weights,
 *           then madd; q8_0 and VNNI: int32 throughout)
 *   q4_0: i -= 8 * sum(q_a)
 *   acc   = fma(float(i), d_w[0..7] * d_a, acc)
 *   q4_1: acc = fma(m_w[0..7], s_a, acc)
 *
 * and after the last block the outputs are acc [+ bias]. Each (row, output) pair goes through
 * exactly its layout's sequence whatever R, T, M and the threads are: a row's result does not
 * depend on the other rows of the call.
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
        if (FMT == QFMT_Q4_0) i = _mm256_sub_epi32(i, corr);                                   \
        c##r##t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw##t, da), c##r##t);   \
        if (FMT == QFMT_Q4_1) c##r##t = _mm256_fmadd_ps(mw##t, sa, c##r##t);                   \
    }
#define QT_ROW(r)                                                                              \
    if (R > r) {                                                                               \
        const int64_t at = (m0 + r) * nb + b;                                                  \
        __m256i a = _mm256_loadu_si256((const __m256i *)(acts->q + (m0 + r) * K + b * QBLOCK)); \
        __m256 da = _mm256_broadcast_ss(acts->d + at);                                         \
        __m256i ua = _mm256_setzero_si256(), corr = _mm256_setzero_si256();                    \
        __m256 sa = _mm256_setzero_ps();                                                       \
        if (FMT == QFMT_Q8_0) ua = _mm256_abs_epi8(a);                                         \
        if (FMT == QFMT_Q4_0) corr = _mm256_loadu_si256((const __m256i *)(acts->corr + at * 8)); \
        if (FMT == QFMT_Q4_1) sa = _mm256_broadcast_ss(acts->s + at);                          \
        QT_ALL(r, QT_STEP)                                                                     \
    }
/* Weight row t of block b: its bytes, its scale broadcast, its min in lane 0 (q4_1). */
#define QT_WEIGHT(t)                                                                           \
    __m256i w##t = _mm256_setzero_si256();                                                     \
    __m256 dw##t = _mm256_setzero_ps(), mw##t = _mm256_setzero_ps();                           \
    if (T > t) {                                                                               \
        const uint8_t *blk = W + (n0 + t) * row_bytes + b * BYTES;                             \
        w##t = FMT == QFMT_Q8_0 ? _mm256_loadu_si256((const __m256i *)(blk + 2))                \
                                : unpack_nibbles(blk + HEADER);                                \
        dw##t = _mm256_set1_ps(half_to_float(blk));                                            \
        if (FMT == QFMT_Q4_1)                                                                  \
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
    const int64_t K = acts->K, nb = acts->nb;
    const int BYTES = FMT == QFMT_Q4_0 ? 18 : FMT == QFMT_Q4_1 ? 20 : 34;
    const int HEADER = FMT == QFMT_Q4_1 ? 4 : 2;
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
QT_DEFINE_FMT(0) QT_DEFINE_FMT(1) QT_DEFINE_FMT(2)

/* The tile function of format fmt for `rows` (1..4) rows and `width` (1, 2, or 4 for one
   row) weight rows. */
static QK_FN(qtile_fn) QK_FN(qtile_for)(int fmt, int64_t rows, int width) {
#define QT_TABLE(F)                                                                            \
    {{QK_FN(qtile_##F##_1x1), QK_FN(qtile_##F##_2x1), QK_FN(qtile_##F##_3x1),                  \
      QK_FN(qtile_##F##_4x1)},                                                                 \
     {QK_FN(qtile_##F##_1x2), QK_FN(qtile_##F##_2x2), QK_FN(qtile_##F##_3x2),                  \
      QK_FN(qtile_##F##_4x2)}}
    static const QK_FN(qtile_fn) table[3][2][4] = {QT_TABLE(0), QT_TABLE(1), QT_TABLE(2)};
#undef QT_TABLE
    static const QK_FN(qtile_fn) wide[3] = {QK_FN(qtile_0_1x4), QK_FN(qtile_1_1x4),
                                            QK_FN(qtile_2_1x4)};
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
        const int8_t *qa = acts->q + (m0 + r) * K + b * QBLOCK + 4 * p;                       \
        s##r = QK_Q4_ACC(s##r, lo, _mm256_set1_epi32(load_i32(qa)));                           \
        s##r = QK_Q4_ACC(s##r, hi, _mm256_set1_epi32(load_i32(qa + 16)));                      \
    }
#define Q8_ROW_Q8(r)                                                                           \
    if (R > r) {                                                                               \
        const __m256i a = _mm256_set1_epi32(load_i32(acts->q + (m0 + r) * K + b * QBLOCK + 4 * g)); \
        s##r = QK_Q8_ACC(s##r, w, a);                                                          \
    }
#define Q8_ROW_SCALE(r)                                                                        \
    if (R > r) {                                                                               \
        const int64_t at = (m0 + r) * nb + b;                                                  \
        __m256i i = FMT == QFMT_Q8_0 ? s##r : QK_Q4_FINISH(s##r);                               \
        if (FMT == QFMT_Q4_0) i = _mm256_sub_epi32(i, _mm256_set1_epi32(8 * acts->sums[at]));    \
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
    const int64_t K = acts->K, nb = acts->nb;
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
                const __m256i w = _mm256_loadu_si256((const __m256i *)(sb + VALUES + 32 * g));
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

/* Weight rows n0..n0+count-1 (multiples of 8) of an x8 weight times activation rows
   m_begin..m_end-1, in row chunks of at most 4. */
static void QK_FN(qgroup8)(int fmt, const uint8_t *W, int64_t row_bytes, const QActs *acts,
                           const float *bias, float *Y, int64_t N, int64_t m_begin,
                           int64_t m_end, int64_t n0, int64_t count) {
    static const QK_FN(qtile8_fn) table[3][4] = {
        {QK_FN(qtile8_0_1), QK_FN(qtile8_0_2), QK_FN(qtile8_0_3), QK_FN(qtile8_0_4)},
        {QK_FN(qtile8_1_1), QK_FN(qtile8_1_2), QK_FN(qtile8_1_3), QK_FN(qtile8_1_4)},
        {QK_FN(qtile8_2_1), QK_FN(qtile8_2_2), QK_FN(qtile8_2_3), QK_FN(qtile8_2_4)}};
    for (int64_t j = 0; j < count; j += 8) {
        for (int64_t m0 = m_begin; m0 < m_end;) {
            int64_t rows = m_end - m0 < QROWS ? m_end - m0 : QROWS;
            table[fmt][rows - 1](W, row_bytes, acts, bias, Y, N, m0, n0 + j);
            m0 += rows;
        }
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
