/* CRC-32C of TFRecord framing: SSE4.2's crc32 instruction where the CPU has
 * it, three streams at once on buffers of 3 KB and more; else slicing-by-8
 * tables. */
#include "_native_crc32c.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define HAVE_X86 1
#endif

#define CRC32C_POLYNOMIAL 0x82f63b78u /* Castagnoli, reflected */

static uint32_t crc_table[8][256]; /* slicing-by-8, for CPUs without SSE4.2 */

#define CRC_BLOCK 1024 /* buffers of 3 KB and more: three streams of this many bytes at once */
static uint32_t crc_shift_table[4][256]; /* state -> state after CRC_BLOCK zero bytes */
static int have_sse42;

static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
              crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
              crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

static uint32_t crc_shift(uint32_t crc) {
    return crc_shift_table[0][crc & 0xff] ^ crc_shift_table[1][(crc >> 8) & 0xff] ^
           crc_shift_table[2][(crc >> 16) & 0xff] ^ crc_shift_table[3][crc >> 24];
}

#ifdef HAVE_X86
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
                                                          size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    /* The instruction's latency is three times its throughput: keep three
     * independent streams busy, then combine them (linearity of the CRC). */
    while (n >= 3 * CRC_BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *p1 = p + CRC_BLOCK, *p2 = p + 2 * CRC_BLOCK;
        for (size_t i = 0; i < CRC_BLOCK; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p1 + i, 8);
            memcpy(&w2, p2 + i, 8);
            c = _mm_crc32_u64(c, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        c = crc_shift(crc_shift((uint32_t)c) ^ (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * CRC_BLOCK;
        n -= 3 * CRC_BLOCK;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

/* The CRC register update (no pre/post inversion). */
static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n) {
#ifdef HAVE_X86
    if (have_sse42) return crc_hw(crc, p, n);
#endif
    return crc_sw(crc, p, n);
}

uint32_t crc32c(const uint8_t *p, size_t n) {
    return ~crc_update(0xffffffffu, p, n);
}

void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLYNOMIAL : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = crc_table[0][crc_table[t - 1][i] & 0xff] ^ (crc_table[t - 1][i] >> 8);
    /* The shift by CRC_BLOCK zero bytes is linear in the register: tabulate it
     * one register byte at a time from its values on the 32 single bits. */
    static const uint8_t zeros[CRC_BLOCK];
    uint32_t bit[32];
    for (int b = 0; b < 32; b++) bit[b] = crc_sw(1u << b, zeros, CRC_BLOCK);
    for (int t = 0; t < 4; t++)
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t s = 0;
            for (int b = 0; b < 8; b++)
                if (v & (1u << b)) s ^= bit[8 * t + b];
            crc_shift_table[t][v] = s;
        }
#ifdef HAVE_X86
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}
