/* The K-quant block products of qmatmul.c (q4_k, q5_k, q6_k: superblocks of 256 weights in
 * GGUF's layout, quant/formats.py), written once and compiled once per instruction set with
 * qmatmul_tiles.h's macros (QK_SUFFIX, QK_DOT).
 *
 * The activations are qmatmul.c's int8 blocks of 32 (d_a = max|x| / 127 per block), row-major
 * here (KActs): a superblock of the weight meets 8 activation blocks, one per 32-weight group
 * g. Per (row, output, superblock), with the group's exact integer dot products:
 *
 *   q4_k, q5_k:  I_g = sc_g * dot(q_g, a_g)         (q 0..15 / 0..31, 6-bit scale sc_g)
 *                N_g = mn_g * sum(a_g)              (6-bit min mn_g)
 *                acc_g = fma(float(I_g), d * d_a_g, acc_g)
 *                acc_g = fma(float(N_g), -dmin * d_a_g, acc_g)
 *   q6_k:        I_g = sc_2g * (dot(q, a) - 32 sum(a) over elements 0..15)
 *                    + sc_2g+1 * (the same over elements 16..31)    (q 0..63, int8 scales)
 *                acc_g = fma(float(I_g), d * d_a_g, acc_g)
 *
 * with the 8 lanes acc_g of one float32 vector, and the output hsum(acc) [+ bias] (lanes j and
 * j + 4, then 0 + 2 and 1 + 3, then those two), so every variant and the scalar path give the
 * same bits. The integers are summed in any order (exact): per group QK_DOT's 8 lanes of 4
 * products, then one transposing reduction of the 8 groups (hadd) whose middle step holds the
 * 16 half-group sums that q6_k scales.
 *
 * Per weight row and superblock the weights are unpacked once into 8 vectors of 32 bytes (one
 * per group) and applied to every row of the call, whose accumulators live in a small array.
 */

#define QK_CAT2(a, b) a##_##b
#define QK_CAT(a, b) QK_CAT2(a, b)
#define QK_FN(name) QK_CAT(name, QK_SUFFIX)

/* The 8 groups' dot totals, transposed: lane g = sum of D_g's lanes. mid0/mid1 get the
   half-group sums [lo 0, lo 1, lo 2, lo 3 | hi 0, hi 1, hi 2, hi 3] of groups 0..3 / 4..7. */
#define KT_HALVES(D, mid0, mid1)                                                               \
    {                                                                                          \
        const __m256i t0 = _mm256_hadd_epi32(D##0, D##1), t1 = _mm256_hadd_epi32(D##2, D##3); \
        const __m256i t2 = _mm256_hadd_epi32(D##4, D##5), t3 = _mm256_hadd_epi32(D##6, D##7); \
        mid0 = _mm256_hadd_epi32(t0, t1);                                                      \
        mid1 = _mm256_hadd_epi32(t2, t3);                                                      \
    }
#define KT_JOIN(mid0, mid1)                                                                    \
    _mm256_add_epi32(_mm256_permute2x128_si256(mid0, mid1, 0x20),                              \
                     _mm256_permute2x128_si256(mid0, mid1, 0x31))

/* Weight row w_row (ns superblocks of format FMT) times activation rows m_begin..m_begin+M-1:
   acc (M, 8) lanes, then Y[m * y_stride + n] = hsum [+ bias]. */
static inline __attribute__((always_inline)) void QK_FN(krow)(
        const int FMT, const uint8_t *w_row, const KActs *acts, const float *bias, float *Y,
        int64_t y_stride, int64_t m_begin, int64_t M, int64_t n) {
    const int64_t nb = acts->nb, ns = nb / 8;
    const int BYTES = FMT == QFMT_Q4_K ? 144 : FMT == QFMT_Q5_K ? 176 : 210;
    float acc[QROW_BLOCK * 8] __attribute__((aligned(32)));
    for (int64_t m = 0; m < M; m++) _mm256_store_ps(acc + 8 * m, _mm256_setzero_ps());
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int64_t s = 0; s < ns; s++) {
        const uint8_t *sb = w_row + s * BYTES;
        __m256i w0, w1, w2, w3, w4, w5, w6, w7;
        __m256i sc = _mm256_setzero_si256(), mn = sc, sc0 = sc, sc1 = sc;
        float fd, fmn = 0.0f;
        if (FMT == QFMT_Q6_K) {
            fd = half_to_float(sb + 208);
            const __m256i bits = _mm256_set1_epi8(0x30);
#define KT_SIX(h)                                                                              \
            {                                                                                  \
                const __m256i a0 = _mm256_loadu_si256((const __m256i *)(sb + 64 * h));         \
                const __m256i a1 = _mm256_loadu_si256((const __m256i *)(sb + 64 * h + 32));    \
                const __m256i hq = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * h));   \
                w##h##0 = _mm256_or_si256(_mm256_and_si256(a0, low),                           \
                                          _mm256_and_si256(_mm256_slli_epi16(hq, 4), bits));   \
                w##h##1 = _mm256_or_si256(_mm256_and_si256(a1, low),                           \
                                          _mm256_and_si256(_mm256_slli_epi16(hq, 2), bits));   \
                w##h##2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a0, 4), low),     \
                                          _mm256_and_si256(hq, bits));                         \
                w##h##3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a1, 4), low),     \
                                          _mm256_and_si256(_mm256_srli_epi16(hq, 2), bits));   \
            }
            __m256i w00, w01, w02, w03, w10, w11, w12, w13;
            KT_SIX(0) KT_SIX(1)
#undef KT_SIX
            w0 = w00; w1 = w01; w2 = w02; w3 = w03; w4 = w10; w5 = w11; w6 = w12; w7 = w13;
            /* the 16 scales in the order of the half-group sums: 0 2 4 6 1 3 5 7, 8 10 ... */
            const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
            const __m128i s16 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(sb + 192)), order);
            sc0 = _mm256_cvtepi8_epi32(s16);
            sc1 = _mm256_cvtepi8_epi32(_mm_srli_si128(s16, 8));
        } else {
            fd = half_to_float(sb);
            fmn = -half_to_float(sb + 2);
            uint32_t u0, u1, u2;
            memcpy(&u0, sb + 4, 4);
            memcpy(&u1, sb + 8, 4);
            memcpy(&u2, sb + 12, 4);
            const uint32_t sc_lo = u0 & 0x3F3F3F3Fu, mn_lo = u1 & 0x3F3F3F3Fu;
            const uint32_t sc_hi = (u2 & 0x0F0F0F0Fu) | ((u0 >> 2) & 0x30303030u);
            const uint32_t mn_hi = ((u2 >> 4) & 0x0F0F0F0Fu) | ((u1 >> 2) & 0x30303030u);
            sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)(sc_lo | (uint64_t)sc_hi << 32)));
            mn = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)(mn_lo | (uint64_t)mn_hi << 32)));
            const uint8_t *qs = sb + (FMT == QFMT_Q4_K ? 16 : 48);
#define KT_FOUR(c, j, k)                                                                       \
            {                                                                                  \
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));          \
                w##j = _mm256_and_si256(v, low);                                               \
                w##k = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);                         \
            }
            KT_FOUR(0, 0, 1) KT_FOUR(1, 2, 3) KT_FOUR(2, 4, 5) KT_FOUR(3, 6, 7)
#undef KT_FOUR
            if (FMT == QFMT_Q5_K) {
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(sb + 16));
                const __m256i bit = _mm256_set1_epi8(0x10);
                w0 = _mm256_or_si256(w0, _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit));
                w1 = _mm256_or_si256(w1, _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit));
                w2 = _mm256_or_si256(w2, _mm256_and_si256(_mm256_slli_epi16(qh, 2), bit));
                w3 = _mm256_or_si256(w3, _mm256_and_si256(_mm256_slli_epi16(qh, 1), bit));
                w4 = _mm256_or_si256(w4, _mm256_and_si256(qh, bit));
                w5 = _mm256_or_si256(w5, _mm256_and_si256(_mm256_srli_epi16(qh, 1), bit));
                w6 = _mm256_or_si256(w6, _mm256_and_si256(_mm256_srli_epi16(qh, 2), bit));
                w7 = _mm256_or_si256(w7, _mm256_and_si256(_mm256_srli_epi16(qh, 3), bit));
            }
        }
        const __m256 vd = _mm256_set1_ps(fd), vmn = _mm256_set1_ps(fmn);
        for (int64_t m = 0; m < M; m++) {
            const int64_t at = (m_begin + m) * nb + 8 * s;
            const int8_t *a = acts->q + at * QBLOCK;
#define KT_D(g) const __m256i D##g = QK_DOT(w##g, _mm256_load_si256((const __m256i *)(a + 32 * g)));
            KT_D(0) KT_D(1) KT_D(2) KT_D(3) KT_D(4) KT_D(5) KT_D(6) KT_D(7)
#undef KT_D
            __m256i mid0, mid1, I;
            KT_HALVES(D, mid0, mid1)
            if (FMT == QFMT_Q6_K) {
                const int32_t *bs = acts->bs32 + ((m_begin + m) * ns + s) * 16;
                mid0 = _mm256_mullo_epi32(_mm256_sub_epi32(mid0, _mm256_load_si256((const __m256i *)bs)), sc0);
                mid1 = _mm256_mullo_epi32(_mm256_sub_epi32(mid1, _mm256_load_si256((const __m256i *)(bs + 8))), sc1);
                I = KT_JOIN(mid0, mid1);
            } else {
                I = _mm256_mullo_epi32(KT_JOIN(mid0, mid1), sc);
            }
            const __m256 da = _mm256_loadu_ps(acts->d + at);
            __m256 f = _mm256_load_ps(acc + 8 * m);
            f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(vd, da), f);
            if (FMT != QFMT_Q6_K) {
                const __m256i N = _mm256_mullo_epi32(
                    mn, _mm256_loadu_si256((const __m256i *)(acts->sums + at)));
                f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(N), _mm256_mul_ps(vmn, da), f);
            }
            _mm256_store_ps(acc + 8 * m, f);
        }
    }
    for (int64_t m = 0; m < M; m++) {
        float v = hsum(_mm256_load_ps(acc + 8 * m));
        if (bias) v += bias[n];
        Y[(m_begin + m) * y_stride + n] = v;
    }
}

static void QK_FN(kgroup)(int fmt, const uint8_t *W, int64_t row_bytes, const KActs *acts,
                          const float *bias, float *Y, int64_t y_stride, int64_t m_begin,
                          int64_t m_end, int64_t n0, int64_t count) {
    const int64_t M = m_end - m_begin;
    for (int64_t n = n0; n < n0 + count; n++) {
        const uint8_t *w_row = W + n * row_bytes;
        if (fmt == QFMT_Q4_K)
            QK_FN(krow)(QFMT_Q4_K, w_row, acts, bias, Y, y_stride, m_begin, M, n);
        else if (fmt == QFMT_Q5_K)
            QK_FN(krow)(QFMT_Q5_K, w_row, acts, bias, Y, y_stride, m_begin, M, n);
        else
            QK_FN(krow)(QFMT_Q6_K, w_row, acts, bias, Y, y_stride, m_begin, M, n);
    }
}

#undef KT_HALVES
#undef KT_JOIN
#undef QK_FN
#undef QK_CAT
#undef QK_CAT2
