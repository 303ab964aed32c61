#ifndef STITCH_CRC32C_H
#define STITCH_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/*
 * CRC-32C (Castagnoli; polynomial 0x1EDC6F41, reflected 0x82F63B78; the iSCSI / ext4 / SCTP CRC).
 *
 * `crc` is a finished CRC value (start with 0); the pre- and post-inversion happen inside, so
 * update(update(0, a), b) == update(0, a ++ b) for every split. `data` may be NULL when `length` is 0.
 * Thread-safe: the tables and the CPU check are set up once (pthread_once).
 */

/* The fastest implementation this CPU has: on x86-64 folding with AVX-512 VPCLMULQDQ (buffers of 1 KiB and more)
 * or the SSE4.2 `crc32` instruction when available, else slicing-by-8. */
uint32_t stitch_crc32c_update(uint32_t crc, const void *_Nullable data, size_t length);

/* Always the portable slicing-by-8 table implementation (exposed so tests can compare the two). */
uint32_t stitch_crc32c_update_portable(uint32_t crc, const void *_Nullable data, size_t length);

/*
 * The CRC of A ++ B from crc1 = CRC(A), crc2 = CRC(B) and len2 = |B| bytes, without the data: crc1 multiplied by
 * x^(8 * len2) modulo the polynomial, then xor crc2 (zlib's crc32_combine, for the Castagnoli polynomial). The
 * pre- and post-inversions cancel, so the finished values combine as they are. combine(crc, 0, 0) == crc. About
 * a microsecond (a multiplication per set bit of len2).
 */
uint32_t stitch_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/* One implementation by number, for tests that compare them: 0 slicing-by-8, 1 the SSE4.2 instruction (three
 * streams), 2 AVX-512 VPCLMULQDQ folding. One the CPU lacks falls back to 0: check it first with
 * `stitch_crc32c_implementation_available`, which says 1 for each this CPU has. */
uint32_t stitch_crc32c_update_with(int implementation, uint32_t crc, const void *_Nullable data, size_t length);
int stitch_crc32c_implementation_available(int implementation);

/* 1 when `stitch_crc32c_update` uses the hardware instruction, 0 when it falls back to the tables. */
int stitch_crc32c_hardware_available(void);

#endif
