/* Re-laying a GGUF block weight into the native products' "x8" layout, at load, in one pass.
 *
 * The file holds a q4_0 / q4_1 / q8_0 weight row by row: row n is its B blocks of P bytes, each
 * a header of Hb bytes (the half-float scale, and for q4_1 the min) and P - Hb bytes of values.
 * "x8" (quant/formats.py) interleaves 8 rows: for rows 8g..8g+7 and block b, one superblock of
 * 8 * P bytes holds the 8 rows' header halves first, half h of row r at half-word h * 8 + r,
 * then their values as 4-byte words, word c of row r at word c * 8 + r. The same bytes move,
 * nothing is computed, so the result equals the numpy re-laying of formats.to_layout bit for
 * bit; this is that re-laying at memory speed (the numpy one moves 2- and 4-byte strided items
 * and took ~1 s of a 1B model's load).
 *
 * Rows may be strided (src_stride bytes apart), e.g. a view of the file's memory map.
 * Return codes: 0 success, 2 a header or value part not in whole half-words / words.
 */
#include <stdint.h>
#include <string.h>

int x8_from_rows(const uint8_t *src, int64_t src_stride, int64_t groups, int64_t blocks,
                 int64_t block_bytes, int64_t header_bytes, uint8_t *dst) {
    if (header_bytes % 2 || (block_bytes - header_bytes) % 4) return 2;
    const int64_t halves = header_bytes / 2, words = (block_bytes - header_bytes) / 4;
    const int64_t super_bytes = 8 * block_bytes;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *rows[8];
        for (int r = 0; r < 8; r++) rows[r] = src + (8 * g + r) * src_stride;
        uint8_t *out = dst + g * blocks * super_bytes;
        for (int64_t b = 0; b < blocks; b++, out += super_bytes) {
            uint8_t *head = out, *values = out + 8 * header_bytes;
            for (int r = 0; r < 8; r++) {
                const uint8_t *block = rows[r] + b * block_bytes;
                for (int64_t h = 0; h < halves; h++) memcpy(head + (h * 8 + r) * 2, block + 2 * h, 2);
                for (int64_t c = 0; c < words; c++)
                    memcpy(values + (c * 8 + r) * 4, block + header_bytes + 4 * c, 4);
            }
        }
    }
    return 0;
}
