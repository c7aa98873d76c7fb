/* Re-laying a GGUF block weight into the native products' "x8" layout, at load, in one pass.
 *
 * The file holds a weight row by row: row n is its B blocks of P bytes, each a sequence of
 * fields (quant/x8_fields.py: q4_0 a half-float scale then 4 value words, q4_k two halves,
 * 3 scale words and 32 value words, q6_k eight word fields, 16 scale bytes and a half...).
 * "x8" (quant/formats.py) interleaves 8 rows: for rows 8g..8g+7 and block b, one superblock of
 * 8 * P bytes holds each field (in the layout's order) as the 8 rows' elements interleaved,
 * element i of row r at element i * 8 + r of the field's region. The table gives, per field,
 * its offset in a row's block, its element size (1, 2 or 4 bytes), its count and its offset
 * in the superblock. The same bytes move, nothing is computed, so the result equals the numpy
 * re-laying of formats.to_layout bit for bit; this is that re-laying in one pass, 4-byte
 * fields transposed 8 rows at a time in AVX2 registers (the numpy one moves 1- to 4-byte
 * strided items: ~2x slower on a 1B model's load, measured in docs/performance.md; the AVX2
 * words 1.4-1.6x the plain copies' speed).
 *
 * Rows may be strided (src_stride bytes apart), e.g. a view of the file's memory map.
 * Return codes: 0 success, 2 a field outside the block or of another element size, or
 * fields that do not cover the block's bytes.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define PARALLEL_MIN_BYTES (4 << 20)

/* Word c of rows r0..r7 -> 8 consecutive words, for the 4 value words of a q4_0 / q4_1 block
 * (16 bytes a row): two rows per 256-bit register, then a 4x4 word transpose in each lane. */
static inline void transpose_4_words(const uint8_t *const rows[8], int64_t offset,
                                     uint8_t *out) {
    __m256i a[4];
    for (int i = 0; i < 4; i++)
        a[i] = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rows[i] + offset))),
            _mm_loadu_si128((const __m128i *)(rows[i + 4] + offset)), 1);
    __m256i lo01 = _mm256_unpacklo_epi32(a[0], a[1]), hi01 = _mm256_unpackhi_epi32(a[0], a[1]);
    __m256i lo23 = _mm256_unpacklo_epi32(a[2], a[3]), hi23 = _mm256_unpackhi_epi32(a[2], a[3]);
    /* lane 0 holds rows 0-3, lane 1 rows 4-7: word c of the 8 rows in order */
    _mm256_storeu_si256((__m256i *)(out + 0), _mm256_unpacklo_epi64(lo01, lo23));
    _mm256_storeu_si256((__m256i *)(out + 32), _mm256_unpackhi_epi64(lo01, lo23));
    _mm256_storeu_si256((__m256i *)(out + 64), _mm256_unpacklo_epi64(hi01, hi23));
    _mm256_storeu_si256((__m256i *)(out + 96), _mm256_unpackhi_epi64(hi01, hi23));
}

/* Field f of block `at` of rows[0..7] -> its interleaved region at out. */
static inline void move_field(const uint8_t *const rows[8], int64_t at, const int64_t *f,
                              uint8_t *out) {
    const int64_t from = at + f[0], size = f[1], count = f[2];
    int64_t i = 0;
    if (size == 4)
        for (; i + 4 <= count; i += 4) transpose_4_words(rows, from + 4 * i, out + i * 32);
    for (; i < count; i++)
        for (int r = 0; r < 8; r++) memcpy(out + (i * 8 + r) * size, rows[r] + from + i * size, size);
}

int x8_from_rows(const uint8_t *src, int64_t src_stride, int64_t groups, int64_t blocks,
                 int64_t block_bytes, int64_t fields, const int64_t *table, uint8_t *dst) {
    int64_t covered = 0;
    if (fields < 1 || block_bytes < 1) return 2;
    for (int64_t f = 0; f < fields; f++) {
        const int64_t *t = table + 4 * f;
        if ((t[1] != 1 && t[1] != 2 && t[1] != 4) || t[0] < 0 || t[3] < 0 || t[2] < 1
            || t[2] > block_bytes || t[0] + t[1] * t[2] > block_bytes
            || t[3] + 8 * t[1] * t[2] > 8 * block_bytes)
            return 2;
        covered += t[1] * t[2];
    }
    if (covered != block_bytes) return 2;  /* every byte of the block moves exactly once */
    const int64_t super_bytes = 8 * block_bytes;
    /* A parallel region costs a wake-up of the pool (and on a busy host a time slice of the
     * other thread): small weights (SmolLM2's, 0.1-0.6 MB) are re-laid by this thread alone. */
#pragma omp parallel for schedule(static) if (groups * blocks * super_bytes >= PARALLEL_MIN_BYTES)
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *rows[8];
        for (int r = 0; r < 8; r++) rows[r] = src + (8 * g + r) * src_stride;
        uint8_t *out = dst + g * blocks * super_bytes;
        for (int64_t b = 0; b < blocks; b++, out += super_bytes)
            for (int64_t f = 0; f < fields; f++)
                move_field(rows, b * block_bytes, table + 4 * f, out + table[4 * f + 3]);
    }
    return 0;
}
