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
 * same bits. The integers are summed in any order (exact).
 *
 * The activations of a superblock are stored transposed by 4-byte words (KActs: vector p holds
 * inputs 4p..4p+3 of each group g in lane g), and per weight row and superblock the weights
 * are unpacked once into 8 vectors of 32 bytes, transposed the same way, and applied to every
 * row of the call (accumulators in a small array): 8 QK_DOTs accumulate group g's dot product
 * in lane g, with no per-row reduction.
 *
 * The "x8" layout of the K-quants (8 weight rows interleaved, quant/formats.py) has its own
 * panels, qmatmul_k8.h, included at the end with kgroup8 choosing between them.
 */

#define QK_CAT2(a, b) a##_##b
#define QK_CAT(a, b) QK_CAT2(a, b)
#define QK_FN(name) QK_CAT(name, QK_SUFFIX)
/* Bytes ahead of the current superblock fetched into L1 by the one-weight-row loop: the
   hardware prefetchers alone left a 4096 x 14336 q4_k product at ~8 GB/s on one Zen 5 core
   (12-13 with 2048 ahead; 1024 and 4096 less). */
#ifndef KT_PREFETCH
#define KT_PREFETCH 2048
#endif

/* The 8x8 transpose of 4-byte words: r_g word p -> V_p word g. */
#define KT_TRANSPOSE(r, V)                                                                     \
    {                                                                                          \
        const __m256i t0 = _mm256_unpacklo_epi32(r##0, r##1), t1 = _mm256_unpackhi_epi32(r##0, r##1); \
        const __m256i t2 = _mm256_unpacklo_epi32(r##2, r##3), t3 = _mm256_unpackhi_epi32(r##2, r##3); \
        const __m256i t4 = _mm256_unpacklo_epi32(r##4, r##5), t5 = _mm256_unpackhi_epi32(r##4, r##5); \
        const __m256i t6 = _mm256_unpacklo_epi32(r##6, r##7), t7 = _mm256_unpackhi_epi32(r##6, r##7); \
        const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);  \
        const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);  \
        const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);  \
        const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);  \
        V##0 = _mm256_permute2x128_si256(u0, u4, 0x20);                                        \
        V##1 = _mm256_permute2x128_si256(u1, u5, 0x20);                                        \
        V##2 = _mm256_permute2x128_si256(u2, u6, 0x20);                                        \
        V##3 = _mm256_permute2x128_si256(u3, u7, 0x20);                                        \
        V##4 = _mm256_permute2x128_si256(u0, u4, 0x31);                                        \
        V##5 = _mm256_permute2x128_si256(u1, u5, 0x31);                                        \
        V##6 = _mm256_permute2x128_si256(u2, u6, 0x31);                                        \
        V##7 = _mm256_permute2x128_si256(u3, u7, 0x31);                                        \
    }

/* One weight superblock sb unpacked: the 8 groups' weights as bytes (r[g], inputs in order),
   their scales (q4_k / q5_k: sc and mn lanes g; q6_k: sc_lo / sc_hi lane g = scales 2g, 2g + 1)
   and d, -dmin. */
#define KT_PREP_ARGS(k) &k##r0, &k##r1, &k##r2, &k##r3, &k##r4, &k##r5, &k##r6, &k##r7, &k##sc, \
                        &k##mn, &k##sc_lo, &k##sc_hi, &k##fd, &k##fmn
#define KT_PREP_VARS(k) __m256i k##r0, k##r1, k##r2, k##r3, k##r4, k##r5, k##r6, k##r7, k##sc, \
                        k##mn, k##sc_lo, k##sc_hi;                                             \
                        float k##fd, k##fmn;
/* (outputs through pointers to the caller's variables: after inlining they are registers,
   where gcc 12 keeps an array of vectors in memory) */
static inline __attribute__((always_inline)) void QK_FN(kprep)(
        const int FMT, const uint8_t *sb, __m256i *o0, __m256i *o1, __m256i *o2, __m256i *o3,
        __m256i *o4, __m256i *o5, __m256i *o6, __m256i *o7, __m256i *osc, __m256i *omn,
        __m256i *osc_lo, __m256i *osc_hi, float *ofd, float *ofmn) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i r0, r1, r2, r3, r4, r5, r6, r7;
    __m256i sc = _mm256_setzero_si256(), mn = sc, sc_lo = sc, sc_hi = sc;
    float fd, fmn = 0.0f;
    if (FMT == QFMT_Q6_K) {
        fd = half_to_float(sb + 208);
        const __m256i bits = _mm256_set1_epi8(0x30);
#define KT_SIX(h, g0, g1, g2, g3)                                                              \
        {                                                                                      \
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(sb + 64 * h));             \
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(sb + 64 * h + 32));        \
            const __m256i hq = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * h));       \
            g0 = _mm256_or_si256(_mm256_and_si256(a0, low),                                    \
                                 _mm256_and_si256(_mm256_slli_epi16(hq, 4), bits));            \
            g1 = _mm256_or_si256(_mm256_and_si256(a1, low),                                    \
                                 _mm256_and_si256(_mm256_slli_epi16(hq, 2), bits));            \
            g2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a0, 4), low),              \
                                 _mm256_and_si256(hq, bits));                                  \
            g3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a1, 4), low),              \
                                 _mm256_and_si256(_mm256_srli_epi16(hq, 2), bits));            \
        }
        KT_SIX(0, r0, r1, r2, r3) KT_SIX(1, r4, r5, r6, r7)
#undef KT_SIX
        /* scales 2g (inputs 0..15 of group g) and 2g + 1 (16..31), lane g */
        const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        const __m128i s16 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(sb + 192)), order);
        sc_lo = _mm256_cvtepi8_epi32(s16);
        sc_hi = _mm256_cvtepi8_epi32(_mm_srli_si128(s16, 8));
    } else {
        fd = half_to_float(sb);
        fmn = -half_to_float(sb + 2);
        uint32_t u0, u1, u2;
        memcpy(&u0, sb + 4, 4);
        memcpy(&u1, sb + 8, 4);
        memcpy(&u2, sb + 12, 4);
        const uint32_t sc_lo4 = u0 & 0x3F3F3F3Fu, mn_lo4 = u1 & 0x3F3F3F3Fu;
        const uint32_t sc_hi4 = (u2 & 0x0F0F0F0Fu) | ((u0 >> 2) & 0x30303030u);
        const uint32_t mn_hi4 = ((u2 >> 4) & 0x0F0F0F0Fu) | ((u1 >> 2) & 0x30303030u);
        sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)(sc_lo4 | (uint64_t)sc_hi4 << 32)));
        mn = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)(mn_lo4 | (uint64_t)mn_hi4 << 32)));
        const uint8_t *qs = sb + (FMT == QFMT_Q4_K ? 16 : 48);
#define KT_FOUR(c, j, k)                                                                       \
        {                                                                                      \
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));              \
            j = _mm256_and_si256(v, low);                                                      \
            k = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);                                \
        }
        KT_FOUR(0, r0, r1) KT_FOUR(1, r2, r3) KT_FOUR(2, r4, r5) KT_FOUR(3, r6, r7)
#undef KT_FOUR
        if (FMT == QFMT_Q5_K) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(sb + 16));
            const __m256i bit = _mm256_set1_epi8(0x10);
            r0 = _mm256_or_si256(r0, _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit));
            r1 = _mm256_or_si256(r1, _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit));
            r2 = _mm256_or_si256(r2, _mm256_and_si256(_mm256_slli_epi16(qh, 2), bit));
            r3 = _mm256_or_si256(r3, _mm256_and_si256(_mm256_slli_epi16(qh, 1), bit));
            r4 = _mm256_or_si256(r4, _mm256_and_si256(qh, bit));
            r5 = _mm256_or_si256(r5, _mm256_and_si256(_mm256_srli_epi16(qh, 1), bit));
            r6 = _mm256_or_si256(r6, _mm256_and_si256(_mm256_srli_epi16(qh, 2), bit));
            r7 = _mm256_or_si256(r7, _mm256_and_si256(_mm256_srli_epi16(qh, 3), bit));
        }
    }
    *o0 = r0; *o1 = r1; *o2 = r2; *o3 = r3; *o4 = r4; *o5 = r5; *o6 = r6; *o7 = r7;
    *osc = sc; *omn = mn; *osc_lo = sc_lo; *osc_hi = sc_hi;
    *ofd = fd; *ofmn = fmn;
}

/* Weight row w_row (ns superblocks of format FMT) times activation rows m_begin..m_begin+M-1:
   acc (M, 8) lanes, then Y[m * y_stride + n] = hsum [+ bias]. Per superblock the 8 groups'
   weights r_g (32 bytes each) are transposed by 4-byte words into V_p (lane g = inputs
   4p..4p+3 of group g), as the activations were (KActs), so QK_DOT(V_p, P_p) accumulated over
   p holds group g's dot product in lane g. */
static inline __attribute__((always_inline)) void QK_FN(krow)(
        const int FMT, const uint8_t *w_row, const KActs *acts, const float *bias, float *Y,
        int64_t y_stride, int64_t m_begin, int64_t M, int64_t n) {
    const int64_t nb = acts->nb, ns = nb / 8;
    const int BYTES = FMT == QFMT_Q4_K ? 144 : FMT == QFMT_Q5_K ? 176 : 210;
    float acc[QROW_BLOCK * 8] __attribute__((aligned(32)));
    for (int64_t s = 0; s < ns; s++) {
        const uint8_t *sb = w_row + s * BYTES;
        for (int o = 0; o < BYTES; o += 64) _mm_prefetch((const char *)sb + KT_PREFETCH + o, _MM_HINT_T0);
        KT_PREP_VARS()
        QK_FN(kprep)(FMT, sb, KT_PREP_ARGS());
        __m256i V0, V1, V2, V3, V4, V5, V6, V7;
        KT_TRANSPOSE(r, V)
        const __m256 vd = _mm256_set1_ps(fd), vmn = _mm256_set1_ps(fmn);
        for (int64_t m = 0; m < M; m++) {
            const int64_t at = ks_at(acts, m_begin + m, s);
            const int8_t *a = acts->q + at * QK_SUPER;
#define KT_P(p) _mm256_load_si256((const __m256i *)(a + 32 * p))
#if QK_VNNI
#define KT_ACC(acc, p) QK_DPBUSD(acc, V##p, KT_P(p))
#else
#define KT_ACC(acc, p) _mm256_add_epi32(acc, QK_DOT(V##p, KT_P(p)))
#endif
            /* two chains: inputs 0..15 of every group, and 16..31 */
            const __m256i zero = _mm256_setzero_si256();
            __m256i lo = KT_ACC(KT_ACC(KT_ACC(KT_ACC(zero, 0), 1), 2), 3);
            __m256i hi = KT_ACC(KT_ACC(KT_ACC(KT_ACC(zero, 4), 5), 6), 7);
#undef KT_ACC
#undef KT_P
            __m256i I;
            if (FMT == QFMT_Q6_K) {
                const int32_t *bs = acts->bs32 + at * 16;
                lo = _mm256_mullo_epi32(_mm256_sub_epi32(lo, _mm256_load_si256((const __m256i *)bs)), sc_lo);
                hi = _mm256_mullo_epi32(_mm256_sub_epi32(hi, _mm256_load_si256((const __m256i *)(bs + 8))), sc_hi);
                I = _mm256_add_epi32(lo, hi);
            } else {
                I = _mm256_mullo_epi32(_mm256_add_epi32(lo, hi), sc);
            }
            const __m256 da = _mm256_loadu_ps(acts->d + at * 8);
            __m256 f = s ? _mm256_load_ps(acc + 8 * m) : _mm256_setzero_ps();
            f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(vd, da), f);
            if (FMT != QFMT_Q6_K) {
                const __m256i N = _mm256_mullo_epi32(
                    mn, _mm256_loadu_si256((const __m256i *)(acts->sums + at * 8)));
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

#ifdef QK_ZMM
/* Two weight rows n and n + 1 at once in 512-bit vectors (lanes 0..7 row n's groups, 8..15 row
   n + 1's), each half through exactly krow's operations (so the same bits). */
static inline __m512i kz_join(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}
static inline __m512 kz_joinf(__m256 a, __m256 b) {
    return _mm512_castsi512_ps(kz_join(_mm256_castps_si256(a), _mm256_castps_si256(b)));
}
static inline __attribute__((always_inline)) void QK_FN(krow2)(
        const int FMT, const uint8_t *w_row, int64_t row_bytes, const KActs *acts,
        const float *bias, float *Y, int64_t y_stride, int64_t m_begin, int64_t M, int64_t n) {
    const int64_t ns = acts->nb / 8;
    const int BYTES = FMT == QFMT_Q4_K ? 144 : FMT == QFMT_Q5_K ? 176 : 210;
    float acc[QROW_BLOCK * 16] __attribute__((aligned(64)));
    const __m512i lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int64_t s = 0; s < ns; s++) {
        const uint8_t *sb = w_row + s * BYTES;
        KT_PREP_VARS(a_)
        KT_PREP_VARS(b_)
        QK_FN(kprep)(FMT, sb, KT_PREP_ARGS(a_));
        QK_FN(kprep)(FMT, sb + row_bytes, KT_PREP_ARGS(b_));
        __m512i r0 = kz_join(a_r0, b_r0), r1 = kz_join(a_r1, b_r1), r2 = kz_join(a_r2, b_r2);
        __m512i r3 = kz_join(a_r3, b_r3), r4 = kz_join(a_r4, b_r4), r5 = kz_join(a_r5, b_r5);
        __m512i r6 = kz_join(a_r6, b_r6), r7 = kz_join(a_r7, b_r7);
        const __m512i sc = kz_join(a_sc, b_sc), mn = kz_join(a_mn, b_mn);
        const __m512i sc_lo = kz_join(a_sc_lo, b_sc_lo), sc_hi = kz_join(a_sc_hi, b_sc_hi);
        const __m512 vd = kz_joinf(_mm256_set1_ps(a_fd), _mm256_set1_ps(b_fd));
        const __m512 vmn = kz_joinf(_mm256_set1_ps(a_fmn), _mm256_set1_ps(b_fmn));
        const __m512i t0 = _mm512_unpacklo_epi32(r0, r1), t1 = _mm512_unpackhi_epi32(r0, r1);
        const __m512i t2 = _mm512_unpacklo_epi32(r2, r3), t3 = _mm512_unpackhi_epi32(r2, r3);
        const __m512i t4 = _mm512_unpacklo_epi32(r4, r5), t5 = _mm512_unpackhi_epi32(r4, r5);
        const __m512i t6 = _mm512_unpacklo_epi32(r6, r7), t7 = _mm512_unpackhi_epi32(r6, r7);
        const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
        const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
        const __m512i u4 = _mm512_unpacklo_epi64(t4, t6), u5 = _mm512_unpackhi_epi64(t4, t6);
        const __m512i u6 = _mm512_unpacklo_epi64(t5, t7), u7 = _mm512_unpackhi_epi64(t5, t7);
        const __m512i V0 = _mm512_permutex2var_epi64(u0, lo_idx, u4);
        const __m512i V1 = _mm512_permutex2var_epi64(u1, lo_idx, u5);
        const __m512i V2 = _mm512_permutex2var_epi64(u2, lo_idx, u6);
        const __m512i V3 = _mm512_permutex2var_epi64(u3, lo_idx, u7);
        const __m512i V4 = _mm512_permutex2var_epi64(u0, hi_idx, u4);
        const __m512i V5 = _mm512_permutex2var_epi64(u1, hi_idx, u5);
        const __m512i V6 = _mm512_permutex2var_epi64(u2, hi_idx, u6);
        const __m512i V7 = _mm512_permutex2var_epi64(u3, hi_idx, u7);
/* Row m's step into the 16 accumulator lanes f */
#define KZ_ROW(m, f)                                                                           \
        {                                                                                      \
            const int64_t at = ks_at(acts, m_begin + (m), s);                                  \
            const int8_t *a = acts->q + at * QK_SUPER;                                         \
            const __m512i zero = _mm512_setzero_si512();                                       \
            __m512i lo = KZ_ACC(KZ_ACC(KZ_ACC(KZ_ACC(zero, 0), 1), 2), 3);                     \
            __m512i hi = KZ_ACC(KZ_ACC(KZ_ACC(KZ_ACC(zero, 4), 5), 6), 7);                     \
            __m512i I;                                                                         \
            if (FMT == QFMT_Q6_K) {                                                            \
                const int32_t *bs = acts->bs32 + at * 16;                                      \
                lo = _mm512_mullo_epi32(_mm512_sub_epi32(lo, KZ_B(bs)), sc_lo);                \
                hi = _mm512_mullo_epi32(_mm512_sub_epi32(hi, KZ_B(bs + 8)), sc_hi);            \
                I = _mm512_add_epi32(lo, hi);                                                  \
            } else {                                                                           \
                I = _mm512_mullo_epi32(_mm512_add_epi32(lo, hi), sc);                          \
            }                                                                                  \
            const __m512 da = _mm512_castsi512_ps(KZ_B(acts->d + at * 8));                     \
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(vd, da), f);              \
            if (FMT != QFMT_Q6_K) {                                                            \
                const __m512i N = _mm512_mullo_epi32(mn, KZ_B(acts->sums + at * 8));           \
                f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(N), _mm512_mul_ps(vmn, da), f);         \
            }                                                                                  \
        }
#define KZ_B(p) _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p)))
#define KZ_ACC(acc, p) _mm512_dpbusd_epi32(acc, V##p, KZ_B(a + 32 * p))
        for (int64_t m = 0; m < M; m++) {
            __m512 f = s ? _mm512_load_ps(acc + 16 * m) : _mm512_setzero_ps();
            KZ_ROW(m, f)
            _mm512_store_ps(acc + 16 * m, f);
        }
#undef KZ_ACC
#undef KZ_B
#undef KZ_ROW
    }
    for (int64_t m = 0; m < M; m++) {
        float v0 = hsum(_mm256_load_ps(acc + 16 * m)), v1 = hsum(_mm256_load_ps(acc + 16 * m + 8));
        if (bias) {
            v0 += bias[n];
            v1 += bias[n + 1];
        }
        Y[(m_begin + m) * y_stride + n] = v0;
        Y[(m_begin + m) * y_stride + n + 1] = v1;
    }
}
typedef void (*QK_FN(krow2_fn))(const uint8_t *, int64_t, const KActs *, const float *, float *,
                                int64_t, int64_t, int64_t, int64_t);
#define KZ_DEFINE(F)                                                                           \
    static void QK_FN(krow2_##F)(const uint8_t *w_row, int64_t row_bytes, const KActs *acts,   \
                                  const float *bias, float *Y, int64_t y_stride,               \
                                  int64_t m_begin, int64_t M, int64_t n) {                     \
        QK_FN(krow2)(F, w_row, row_bytes, acts, bias, Y, y_stride, m_begin, M, n);             \
    }
KZ_DEFINE(5) KZ_DEFINE(6) KZ_DEFINE(7)
#undef KZ_DEFINE
#ifndef KZ_MIN_ROWS
#define KZ_MIN_ROWS 4
#endif
#endif

static void QK_FN(kgroup)(int fmt, const uint8_t *W, int64_t row_bytes, const KActs *acts,
                          const float *bias, float *Y, int64_t y_stride, int64_t m_begin,
                          int64_t m_end, int64_t n0, int64_t count) {
    const int64_t M = m_end - m_begin;
    int64_t n = n0;
#ifdef QK_ZMM
    /* (few rows: one weight row at a time in 256 bits is faster on a Zen 5 host; many: the
       two-row 512-bit steps share the activations' loads) */
    static const QK_FN(krow2_fn) pairs[3] = {QK_FN(krow2_5), QK_FN(krow2_6), QK_FN(krow2_7)};
    if (M > KZ_MIN_ROWS)
        for (; n + 2 <= n0 + count; n += 2)
            pairs[fmt - QFMT_Q4_K](W + n * row_bytes, row_bytes, acts, bias, Y, y_stride,
                                   m_begin, M, n);
#endif
    for (; n < n0 + count; n++) {
        const uint8_t *w_row = W + n * row_bytes;
        if (fmt == QFMT_Q4_K)
            QK_FN(krow)(QFMT_Q4_K, w_row, acts, bias, Y, y_stride, m_begin, M, n);
        else if (fmt == QFMT_Q5_K)
            QK_FN(krow)(QFMT_Q5_K, w_row, acts, bias, Y, y_stride, m_begin, M, n);
        else
            QK_FN(krow)(QFMT_Q6_K, w_row, acts, bias, Y, y_stride, m_begin, M, n);
    }
}

/* ---- layout x8 (qmatmul_k8.h) ------------------------------------------------------------ */

#define K8_ZMM 0
#include "qmatmul_k8.h"
#undef K8_ZMM
#ifdef QK_ZMM
#define K8_ZMM 1
#include "qmatmul_k8.h"
#undef K8_ZMM
#endif

#ifndef K8_ZMM_MIN_ROWS
#define K8_ZMM_MIN_ROWS 2
#endif
typedef void (*QK_FN(kpanel8_fn))(const uint8_t *, int64_t, const K8Acts *, const float *,
                                  float *, int64_t, int64_t, int64_t, int64_t);
/* Weight rows n0..n0+count-1 (multiples of 8) of an x8 K-quant weight (groups of group_bytes)
   times activation rows m_begin..m_end-1: with AVX512 two groups per 512-bit panel, else (and
   for an odd last group) one per 256-bit panel -- the same operations per lane. */
static void QK_FN(kgroup8)(int fmt, const uint8_t *W, int64_t group_bytes, const K8Acts *acts,
                           const float *bias, float *Y, int64_t y_stride, int64_t m_begin,
                           int64_t m_end, int64_t n0, int64_t count) {
    static const QK_FN(kpanel8_fn) narrow[3] = {QK_FN(kpanel8_5_y), QK_FN(kpanel8_6_y),
                                                QK_FN(kpanel8_7_y)};
    const int64_t M = m_end - m_begin;
    int64_t n = n0;
#ifdef QK_ZMM
    static const QK_FN(kpanel8_fn) wide[3] = {QK_FN(kpanel8_5_z), QK_FN(kpanel8_6_z),
                                              QK_FN(kpanel8_7_z)};
    /* (fewer rows than K8_ZMM_MIN_ROWS: the 256-bit panel, one group after the other, reads
       a thread's groups as one stream, which memory serves faster than the two of the 512-bit
       panel) */
    if (M >= K8_ZMM_MIN_ROWS)
    for (; n + 16 <= n0 + count; n += 16)
        wide[fmt - QFMT_Q4_K](W + n / 8 * group_bytes, group_bytes, acts, bias, Y, y_stride,
                              m_begin, M, n);
#endif
    for (; n < n0 + count; n += 8)
        narrow[fmt - QFMT_Q4_K](W + n / 8 * group_bytes, group_bytes, acts, bias, Y, y_stride,
                                m_begin, M, n);
}

#undef KT_TRANSPOSE
#undef KT_PREP_ARGS
#undef KT_PREP_VARS
#undef QK_FN
#undef QK_CAT
#undef QK_CAT2
