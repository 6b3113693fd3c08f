/* CRC-32C (Castagnoli) and TFRecord's mask of it: SSE4.2 where the CPU has
 * it, else slicing-by-8 tables. crc_init() fills the tables once, at import. */
#ifndef TFSHARDS_NATIVE_CRC32C_H
#define TFSHARDS_NATIVE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#define MASK_DELTA 0xa282ead8u

void crc_init(void);
uint32_t crc32c(const uint8_t *p, size_t n);

static inline uint32_t masked(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + MASK_DELTA;
}

#endif
