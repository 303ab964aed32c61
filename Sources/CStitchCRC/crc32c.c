#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define STITCH_CRC32C_POLY 0x82F63B78u /* 0x1EDC6F41 bit-reversed */

/* table[k][b]: the CRC register after byte b followed by k zero bytes (slicing-by-8). */
static uint32_t crc_table[8][256];
static int use_hardware;
static pthread_once_t setup_once = PTHREAD_ONCE_INIT;

static void setup(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ STITCH_CRC32C_POLY : c >> 1;
        crc_table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = crc_table[0][b];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][b] = c;
        }
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    use_hardware = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    use_hardware = 0;
#endif
}

/* Raw register update (no inversion), slicing-by-8. */
static uint32_t portable_raw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n > 0 && ((uintptr_t)p & 7) != 0) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        word = __builtin_bswap64(word);
#endif
        word ^= crc;
        crc = crc_table[7][word & 0xff] ^ crc_table[6][(word >> 8) & 0xff] ^ crc_table[5][(word >> 16) & 0xff]
            ^ crc_table[4][(word >> 24) & 0xff] ^ crc_table[3][(word >> 32) & 0xff]
            ^ crc_table[2][(word >> 40) & 0xff] ^ crc_table[1][(word >> 48) & 0xff] ^ crc_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n > 0) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    return crc;
}

#if defined(__x86_64__)
/* Raw register update (no inversion) with the SSE4.2 `crc32` instruction; only called when the CPU has it. */
__attribute__((target("sse4.2"))) static uint32_t hardware_raw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n > 0 && ((uintptr_t)p & 7) != 0) {
        crc = _mm_crc32_u8(crc, *p++);
        n--;
    }
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n > 0) {
        crc = _mm_crc32_u8(crc, *p++);
        n--;
    }
    return crc;
}
#endif

uint32_t stitch_crc32c_update_portable(uint32_t crc, const void *data, size_t length) {
    if (length == 0) return crc;
    pthread_once(&setup_once, setup);
    return ~portable_raw(~crc, (const unsigned char *)data, length);
}

uint32_t stitch_crc32c_update(uint32_t crc, const void *data, size_t length) {
    if (length == 0) return crc;
    pthread_once(&setup_once, setup);
#if defined(__x86_64__)
    if (use_hardware) return ~hardware_raw(~crc, (const unsigned char *)data, length);
#endif
    return ~portable_raw(~crc, (const unsigned char *)data, length);
}

int stitch_crc32c_hardware_available(void) {
    pthread_once(&setup_once, setup);
    return use_hardware;
}
