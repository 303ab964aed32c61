import CStitchCRC

/// A running CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected 0x82F63B78 — the iSCSI/ext4 CRC), the cheap
/// per-piece checksum of downloaded data computed on the write path.
///
/// `value` is always a finished CRC (the pre- and post-inversion happen per update), so feeding the data in any
/// number of pieces gives the same value as one call over all of it, and a stored `value` can be resumed by
/// `CRC32C(value:)`. The work is done in C (`CStitchCRC`): the SSE4.2 `crc32` instruction when the CPU has it
/// (chosen once at first use), else a slicing-by-8 table loop.
struct CRC32C: Sendable, Hashable {
    /// The CRC of everything fed so far; 0 for no data.
    var value: UInt32

    /// A CRC of no data.
    init() { value = 0 }

    /// Continues from the CRC of earlier data.
    init(value: UInt32) { self.value = value }

    /// Feeds `buffer` (which may be empty).
    mutating func update(_ buffer: UnsafeRawBufferPointer) {
        value = stitch_crc32c_update(value, buffer.baseAddress, buffer.count)
    }

    /// Feeds `bytes`.
    mutating func update(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { update($0) }
    }

    /// The CRC-32C of `buffer`.
    static func checksum(_ buffer: UnsafeRawBufferPointer) -> UInt32 {
        stitch_crc32c_update(0, buffer.baseAddress, buffer.count)
    }

    /// The CRC-32C of `bytes`.
    static func checksum(_ bytes: [UInt8]) -> UInt32 {
        bytes.withUnsafeBytes { checksum($0) }
    }

    /// The CRC-32C of `a ++ b` from `crc1` = CRC(`a`), `crc2` = CRC(`b`) and `length2` = the byte count of `b`, without
    /// the data (x^(8·`length2`) mod P times `crc1`, xor `crc2`; zlib's `crc32_combine` for this polynomial).
    static func combine(_ crc1: UInt32, _ crc2: UInt32, length2: Int64) -> UInt32 {
        precondition(length2 >= 0, "a negative length")
        return stitch_crc32c_combine(crc1, crc2, UInt64(length2))
    }

    /// Whether `update` uses the SSE4.2 instruction (otherwise the table fallback).
    static var isHardwareAccelerated: Bool { stitch_crc32c_hardware_available() != 0 }

    /// Continues `crc` over `buffer` with the portable table implementation only — for tests and benchmarks
    /// that compare it with the hardware path.
    static func portableUpdate(_ crc: UInt32, _ buffer: UnsafeRawBufferPointer) -> UInt32 {
        stitch_crc32c_update_portable(crc, buffer.baseAddress, buffer.count)
    }

    /// The implementations this CPU has, by number (0 tables, 1 the SSE4.2 instruction, 2 AVX-512 VPCLMULQDQ
    /// folding): for tests that compare them.
    static var implementations: [Int32] { (0...2).filter { stitch_crc32c_implementation_available($0) != 0 } }

    /// `crc` updated over `buffer` by one of ``implementations``.
    static func update(implementation: Int32, _ crc: UInt32, _ buffer: UnsafeRawBufferPointer) -> UInt32 {
        stitch_crc32c_update_with(implementation, crc, buffer.baseAddress, buffer.count)
    }
}
