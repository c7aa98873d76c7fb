/* Re-laying a GGUF block weight into the native products' "x8" layout, at load, in one pass.
 *
 * The file holds a q4_0 / q4_1 / q8_0 weight row by row: row n is its B blocks of P bytes, each
 * a header of Hb bytes (the half-float scale, and for q4_1 the min) and P - Hb bytes of values.
 * "x8" (quant/formats.py) interleaves 8 rows: for rows 8g..8g+7 and block b, one superblock of
 * 8 * P bytes holds the 8 rows' header halves first, half h of row r at half-word h * 8 + r,
 * then their values as 4-byte words, word c of row r at word c * 8 + r. The same bytes move,
 * nothing is computed, so the result equals the numpy re-laying of formats.to_layout bit for
 * bit; this is that re-laying in one pass, the value words transposed 8 rows at a time in AVX2
 * registers (the numpy one moves 2- and 4-byte strided items: ~2x slower on a 1B model's load,
 * measured in docs/performance.md; the AVX2 words 1.4-1.6x the plain copies' speed).
 *
 * Rows may be strided (src_stride bytes apart), e.g. a view of the file's memory map.
 * Return codes: 0 success, 2 a header or value part not in whole half-words / words.
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

int x8_from_rows(const uint8_t *src, int64_t src_stride, int64_t groups, int64_t blocks,
                 int64_t block_bytes, int64_t header_bytes, uint8_t *dst) {
    if (header_bytes % 2 || (block_bytes - header_bytes) % 4) return 2;
    const int64_t halves = header_bytes / 2, words = (block_bytes - header_bytes) / 4;
    const int64_t super_bytes = 8 * block_bytes;
    /* A parallel region costs a wake-up of the pool (and on a busy host a time slice of the
     * other thread): small weights (SmolLM2's, 0.1-0.6 MB) are re-laid by this thread alone. */
#pragma omp parallel for schedule(static) if (groups * blocks * super_bytes >= PARALLEL_MIN_BYTES)
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *rows[8];
        for (int r = 0; r < 8; r++) rows[r] = src + (8 * g + r) * src_stride;
        uint8_t *out = dst + g * blocks * super_bytes;
        for (int64_t b = 0; b < blocks; b++, out += super_bytes) {
            const int64_t at = b * block_bytes;
            uint8_t *head = out, *values = out + 8 * header_bytes;
            for (int r = 0; r < 8; r++)
                for (int64_t h = 0; h < halves; h++)
                    memcpy(head + (h * 8 + r) * 2, rows[r] + at + 2 * h, 2);
            int64_t c = 0;
            for (; c + 4 <= words; c += 4)
                transpose_4_words(rows, at + header_bytes + 4 * c, values + c * 32);
            for (; c < words; c++)
                for (int r = 0; r < 8; r++)
                    memcpy(values + (c * 8 + r) * 4, rows[r] + at + header_bytes + 4 * c, 4);
        }
    }
    return 0;
}
