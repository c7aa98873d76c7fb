/* The K-quant panel of the "x8" layout (q4_k, q5_k, q6_k; quant/formats.py), included by
 * qmatmul_ktiles.h once per instruction set with K8_ZMM 0 (one group of 8 weight rows, 256-bit
 * vectors) and, for AVX512, once more with K8_ZMM 1 (two groups, 16 rows, 512-bit vectors:
 * lanes 0..7 the first group, 8..15 the second, each lane through exactly the 8-row panel's
 * operations, so the same bits).
 *
 * The lanes are output rows: one 32-byte word vector of a group superblock holds 4 inputs of
 * each of its 8 rows, multiplied by a row's 4 activations broadcast. Per group superblock the
 * scales are expanded once into float32 vectors (q4_k / q5_k: ds_j = d * sc_j and dm_j =
 * -dmin * mn_j, j = 0..7; q6_k: ds_i = d * scales_i, i = 0..15) and, per 32-input sub-block j,
 * its 8 weight vectors are unpacked once into registers and applied to every activation row of
 * the call (K8Acts, block-major), whose float32 accumulators live in a small array (one row:
 * in a register):
 *
 *   q4_k, q5_k: f = fma(float(dot(q_j, a_j)), ds_j * d_a, f)
 *               f = fma(dm_j, d_a * sum(a_j), f)
 *   q6_k:       f = fma(float(dot(q, a over inputs 0..15) - 32 sum(a 0..15)), ds_2j * d_a, f)
 *               (K8Acts.h32 holds -32 sum(a), where the integer sums start)
 *               f = fma(float(the same over inputs 16..31), ds_2j+1 * d_a, f)
 *
 * with the exact integer dot products (any order) and the output f [+ bias]: the scalar path
 * (qmatmul.c, kgroup8_scalar) does the same float operations in the same order.
 */

#if K8_ZMM
#define KV __m512i
#define KF __m512
#define K8_LANES 16
#define K8_NAME(n) QK_FN(QK_CAT(n, z))
#define KV_LOAD(off)                                                                           \
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(sb0 + (off)))), \
                       _mm256_loadu_si256((const __m256i *)(sb1 + (off))), 1)
#define KV_AND _mm512_and_si512
#define KV_OR _mm512_or_si512
#define KV_SRLI _mm512_srli_epi32
#define KV_SLLI _mm512_slli_epi32
#define KV_ADD _mm512_add_epi32
#define KV_SUB _mm512_sub_epi32
#define KV_XOR _mm512_xor_si512
#define KV_SET _mm512_set1_epi32
#define KV_ZERO _mm512_setzero_si512()
#define KF_CVT _mm512_cvtepi32_ps
#define KF_FMA _mm512_fmadd_ps
#define KF_MUL _mm512_mul_ps
#define KF_SET _mm512_set1_ps
#define KF_LOAD _mm512_load_ps
#define KF_STORE _mm512_store_ps
#define KF_ZERO _mm512_setzero_ps()
#define KF_AS_INT _mm512_castps_si512
#define KF_OF_INT _mm512_castsi512_ps
#define KF_HALVES(off)                                                                         \
    _mm512_cvtph_ps(_mm256_inserti128_si256(                                                   \
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(sb0 + (off)))),               \
        _mm_loadu_si128((const __m128i *)(sb1 + (off))), 1))
#define KV_BYTES(off)                                                                          \
    _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(sb0 + (off))),   \
                                            _mm_loadl_epi64((const __m128i *)(sb1 + (off)))))
#define KV_DP(acc, w, p) _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(load_i32(p)))
#define KF_STORE_OUT(p, v) _mm512_storeu_ps(p, v)
#define KF_LOADU _mm512_loadu_ps
#define KF_ADD _mm512_add_ps
#else
#define KV __m256i
#define KF __m256
#define K8_LANES 8
#define K8_NAME(n) QK_FN(QK_CAT(n, y))
#define KV_LOAD(off) _mm256_loadu_si256((const __m256i *)(sb0 + (off)))
#define KV_AND _mm256_and_si256
#define KV_OR _mm256_or_si256
#define KV_SRLI _mm256_srli_epi32
#define KV_SLLI _mm256_slli_epi32
#define KV_ADD _mm256_add_epi32
#define KV_SUB _mm256_sub_epi32
#define KV_XOR _mm256_xor_si256
#define KV_SET _mm256_set1_epi32
#define KV_ZERO _mm256_setzero_si256()
#define KF_CVT _mm256_cvtepi32_ps
#define KF_FMA _mm256_fmadd_ps
#define KF_MUL _mm256_mul_ps
#define KF_SET _mm256_set1_ps
#define KF_LOAD _mm256_load_ps
#define KF_STORE _mm256_store_ps
#define KF_ZERO _mm256_setzero_ps()
#define KF_AS_INT _mm256_castps_si256
#define KF_OF_INT _mm256_castsi256_ps
#define KF_HALVES(off) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb0 + (off))))
#define KV_BYTES(off) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sb0 + (off))))
#if QK_VNNI
#define KV_DP(acc, w, p) QK_DPBUSD(acc, w, _mm256_set1_epi32(load_i32(p)))
#endif
#define KF_STORE_OUT(p, v) _mm256_storeu_ps(p, v)
#define KF_LOADU _mm256_loadu_ps
#define KF_ADD _mm256_add_ps
#endif

/* Few rows (at most K8_PREFETCH_ROWS), where the weight streams from memory: per superblock,
   the same superblock K8_AHEAD work items on (the next group, or two with K8_ZMM: a thread's
   groups are consecutive) is fetched into L2 (K8_HINT), so the next streams start warm. The
   hardware prefetchers alone restart on each group, only a few KB (K = 2048: 9 KB of q4_k):
   on one Zen 5 core from memory q4_k x8 went from ~12 to ~19 GB/s at 16384x2048 (into L1:
   slower). */
#ifndef K8_HINT
#define K8_HINT _MM_HINT_T1
#endif
#ifndef K8_AHEAD
#define K8_AHEAD 1
#endif
#ifndef K8_PREFETCH_ROWS
#define K8_PREFETCH_ROWS 4
#endif

/* Weight groups g0 (and, K8_ZMM, g0 + group_bytes) of format FMT times activation rows
   m_begin..m_begin+M-1 -> Y[m * y_stride + n0 + lane] [+ bias]. ONE: M is 1, the accumulator
   in a register. */
static inline __attribute__((always_inline)) void K8_NAME(kpanel8)(
        const int FMT, const int ONE, const uint8_t *g0, int64_t group_bytes,
        const K8Acts *acts, const float *bias, float *Y, int64_t y_stride, int64_t m_begin,
        int64_t M, int64_t n0) {
    const int64_t ns = acts->nb / 8, stride = acts->rows;
    const int SB = FMT == QFMT_Q4_K ? 1152 : FMT == QFMT_Q5_K ? 1408 : 1680;
    const int QS = FMT == QFMT_Q5_K ? 384 : 128;  /* q4_k / q5_k: the nibbles' words */
    float acc[QROW_BLOCK * K8_LANES] __attribute__((aligned(64)));
    KF f1 = KF_ZERO;
    if (!ONE)
        for (int64_t m = 0; m < M; m++) KF_STORE(acc + K8_LANES * m, KF_ZERO);
    for (int64_t s = 0; s < ns; s++) {
        const uint8_t *sb0 = g0 + s * SB;
#if K8_ZMM
        const uint8_t *sb1 = sb0 + group_bytes;
#endif
        if (M <= K8_PREFETCH_ROWS)
            for (int o = 0; o < SB; o += 64) {
#if K8_ZMM
                _mm_prefetch((const char *)sb0 + 2 * K8_AHEAD * group_bytes + o, K8_HINT);
                _mm_prefetch((const char *)sb1 + 2 * K8_AHEAD * group_bytes + o, K8_HINT);
#else
                _mm_prefetch((const char *)sb0 + K8_AHEAD * group_bytes + o, K8_HINT);
#endif
            }
        /* the scales: d (and -dmin) per lane, q4_k / q5_k's 6-bit sc_j and mn_j as bytes j % 4
           of the lanes of scl (j < 4) / sch and mnl / mnh */
        const KF vd = KF_HALVES(0);
        KF vm = KF_ZERO;
        KV scl = KV_ZERO, sch = KV_ZERO, mnl = KV_ZERO, mnh = KV_ZERO;
        if (FMT != QFMT_Q6_K) {
            vm = KF_OF_INT(KV_XOR(KF_AS_INT(KF_HALVES(16)), KV_SET((int)0x80000000u)));
            const KV u0 = KV_LOAD(32), u1 = KV_LOAD(64), u2 = KV_LOAD(96);
            const KV m6 = KV_SET(0x3F3F3F3F), m4 = KV_SET(0x0F0F0F0F), m2 = KV_SET(0x30303030);
            scl = KV_AND(u0, m6);
            mnl = KV_AND(u1, m6);
            sch = KV_OR(KV_AND(u2, m4), KV_AND(KV_SRLI(u0, 2), m2));
            mnh = KV_OR(KV_AND(KV_SRLI(u2, 4), m4), KV_AND(KV_SRLI(u1, 2), m2));
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            /* sub-block j's scales as float32 (dsa, dsb: q4_k / q5_k ds_j, dm_j; q6_k ds_2j,
               ds_2j+1) and its 8 word vectors: w_p lane r = inputs 4p..4p+3 of row r */
            KF dsa, dsb;
            if (FMT == QFMT_Q6_K) {
                dsa = KF_MUL(vd, KF_CVT(KV_BYTES(16 + 16 * j)));
                dsb = KF_MUL(vd, KF_CVT(KV_BYTES(24 + 16 * j)));
            } else {
                const KV byte = KV_SET(0xFF);
                const KV sc = KV_AND(KV_SRLI(j < 4 ? scl : sch, 8 * (j % 4)), byte);
                const KV mn = KV_AND(KV_SRLI(j < 4 ? mnl : mnh, 8 * (j % 4)), byte);
                dsa = KF_MUL(vd, KF_CVT(sc));
                dsb = KF_MUL(vm, KF_CVT(mn));
            }
            const KV low = KV_SET(0x0F0F0F0F);
            KV w0, w1, w2, w3, w4, w5, w6, w7;
            if (FMT == QFMT_Q6_K) {
                const int h = j / 4, k = j % 4;
                const KV two = KV_SET(0x30303030);
#define K8_SIX(p)                                                                              \
                {                                                                              \
                    const KV a = KV_LOAD(K6_QL(h, k % 2) + 32 * p);                            \
                    const KV q = KV_LOAD(K6_QH(h) + 32 * p);                                   \
                    const KV l = k < 2 ? KV_AND(a, low) : KV_AND(KV_SRLI(a, 4), low);          \
                    const KV t = k == 0 ? KV_SLLI(q, 4) : k == 1 ? KV_SLLI(q, 2)               \
                                 : k == 2 ? q : KV_SRLI(q, 2);                                 \
                    w##p = KV_OR(l, KV_AND(t, two));                                           \
                }
                K8_SIX(0) K8_SIX(1) K8_SIX(2) K8_SIX(3) K8_SIX(4) K8_SIX(5) K8_SIX(6) K8_SIX(7)
#undef K8_SIX
            } else {
                const int c = j / 2;
#define K8_FOUR(p)                                                                             \
                {                                                                              \
                    const KV a = KV_LOAD(QS + 32 * (8 * c + p));                               \
                    w##p = j % 2 ? KV_AND(KV_SRLI(a, 4), low) : KV_AND(a, low);                \
                    if (FMT == QFMT_Q5_K) {                                                    \
                        const KV q = KV_LOAD(128 + 32 * p);                                    \
                        const KV t = j <= 4 ? KV_SLLI(q, 4 - j) : KV_SRLI(q, j - 4);           \
                        w##p = KV_OR(w##p, KV_AND(t, KV_SET(0x10101010)));                     \
                    }                                                                          \
                }
                K8_FOUR(0) K8_FOUR(1) K8_FOUR(2) K8_FOUR(3) K8_FOUR(4) K8_FOUR(5) K8_FOUR(6) K8_FOUR(7)
#undef K8_FOUR
            }
            const int64_t at0 = (8 * s + j) * stride + m_begin;
            const int8_t *qa = acts->q + at0 * QBLOCK;
            const float *da = acts->d + at0;
            for (int64_t m = 0; m < (ONE ? 1 : M); m++, qa += QBLOCK) {
                KV lo, hi;
                const int32_t *h32 = acts->h32 + 2 * (at0 + m);
#if QK_VNNI
                /* (q6_k: the sums start at -32 sum(a), the -32 offset of the weights) */
                const KV lo0 = FMT == QFMT_Q6_K ? KV_SET(h32[0]) : KV_ZERO;
                const KV hi0 = FMT == QFMT_Q6_K ? KV_SET(h32[1]) : KV_ZERO;
                lo = KV_DP(KV_DP(KV_DP(KV_DP(lo0, w0, qa), w1, qa + 4), w2, qa + 8), w3, qa + 12);
                if (FMT == QFMT_Q6_K) {
                    hi = KV_DP(KV_DP(KV_DP(KV_DP(hi0, w4, qa + 16), w5, qa + 20), w6, qa + 24),
                               w7, qa + 28);
                } else {  /* one chain: the rows of the call overlap its latency */
                    lo = KV_DP(KV_DP(KV_DP(KV_DP(lo, w4, qa + 16), w5, qa + 20), w6, qa + 24),
                               w7, qa + 28);
                    hi = KV_ZERO;
                }
#else
                {
                    const __m256i ones = _mm256_set1_epi16(1);
#define K8_MB(p) _mm256_maddubs_epi16(w##p, _mm256_set1_epi32(load_i32(qa + 4 * p)))
                    if (FMT == QFMT_Q4_K) {
                        /* int16 sums of 8 pairs' products: at most 8 * 2 * 15 * 128 = 30720 */
                        lo = _mm256_madd_epi16(
                            _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(K8_MB(0), K8_MB(1)),
                                                              _mm256_add_epi16(K8_MB(2), K8_MB(3))),
                                             _mm256_add_epi16(_mm256_add_epi16(K8_MB(4), K8_MB(5)),
                                                              _mm256_add_epi16(K8_MB(6), K8_MB(7)))),
                            ones);
                        hi = _mm256_setzero_si256();
                    } else if (FMT == QFMT_Q5_K) {
                        /* 4 pairs: at most 4 * 2 * 31 * 128 = 31744 */
                        lo = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(K8_MB(0), K8_MB(1)),
                                                                _mm256_add_epi16(K8_MB(2), K8_MB(3))),
                                               ones);
                        hi = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(K8_MB(4), K8_MB(5)),
                                                                _mm256_add_epi16(K8_MB(6), K8_MB(7))),
                                               ones);
                    } else {
                        /* 2 pairs: at most 2 * 2 * 63 * 128 = 32256 */
                        lo = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(K8_MB(0), K8_MB(1)), ones),
                                              _mm256_madd_epi16(_mm256_add_epi16(K8_MB(2), K8_MB(3)), ones));
                        hi = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(K8_MB(4), K8_MB(5)), ones),
                                              _mm256_madd_epi16(_mm256_add_epi16(K8_MB(6), K8_MB(7)), ones));
                        lo = _mm256_add_epi32(lo, _mm256_set1_epi32(h32[0]));
                        hi = _mm256_add_epi32(hi, _mm256_set1_epi32(h32[1]));
                    }
#undef K8_MB
                }
#endif
                KF f = ONE ? f1 : KF_LOAD(acc + K8_LANES * m);
                const KF vda = KF_SET(da[m]);
                if (FMT == QFMT_Q6_K) {
                    f = KF_FMA(KF_CVT(lo), KF_MUL(dsa, vda), f);
                    f = KF_FMA(KF_CVT(hi), KF_MUL(dsb, vda), f);
                } else {
                    f = KF_FMA(KF_CVT(QK_VNNI ? lo : KV_ADD(lo, hi)), KF_MUL(dsa, vda), f);
                    f = KF_FMA(dsb, KF_SET(acts->s[at0 + m]), f);
                }
                if (ONE)
                    f1 = f;
                else
                    KF_STORE(acc + K8_LANES * m, f);
            }
        }
    }
    if (ONE) KF_STORE(acc, f1);
    for (int64_t m = 0; m < M; m++) {
        KF v = KF_LOAD(acc + K8_LANES * m);
        if (bias) v = KF_ADD(v, KF_LOADU(bias + n0));
        KF_STORE_OUT(Y + (m_begin + m) * y_stride + n0, v);
    }
}

#define K8_DEFINE(F)                                                                           \
    static void K8_NAME(QK_CAT(kpanel8, F))(const uint8_t *g0, int64_t group_bytes,            \
                                            const K8Acts *acts, const float *bias, float *Y,   \
                                            int64_t y_stride, int64_t m_begin, int64_t M,      \
                                            int64_t n0) {                                      \
        if (M == 1)                                                                            \
            K8_NAME(kpanel8)(F, 1, g0, group_bytes, acts, bias, Y, y_stride, m_begin, 1, n0);  \
        else                                                                                   \
            K8_NAME(kpanel8)(F, 0, g0, group_bytes, acts, bias, Y, y_stride, m_begin, M, n0);  \
    }
K8_DEFINE(5) K8_DEFINE(6) K8_DEFINE(7)
#undef K8_DEFINE

#undef KV
#undef KF
#undef K8_LANES
#undef K8_NAME
#undef KV_LOAD
#undef KV_AND
#undef KV_OR
#undef KV_SRLI
#undef KV_SLLI
#undef KV_ADD
#undef KV_SUB
#undef KV_XOR
#undef KV_SET
#undef KV_ZERO
#undef KF_CVT
#undef KF_FMA
#undef KF_MUL
#undef KF_SET
#undef KF_LOAD
#undef KF_STORE
#undef KF_ZERO
#undef KF_AS_INT
#undef KF_OF_INT
#undef KF_HALVES
#undef KV_BYTES
#undef KV_DP
#undef KF_STORE_OUT
#undef KF_LOADU
#undef KF_ADD
