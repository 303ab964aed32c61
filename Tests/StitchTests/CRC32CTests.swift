import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

@Suite struct CRC32CTests {

    // MARK: Known-answer vectors (the "check" value; RFC 3720 B.4 iSCSI vectors)

    static let vectors: [(String, [UInt8], UInt32)] = [
        ("123456789", Array("123456789".utf8), 0xE306_9283),
        ("32 zeros", [UInt8](repeating: 0, count: 32), 0x8A91_36AA),
        ("32 × 0xFF", [UInt8](repeating: 0xFF, count: 32), 0x62A8_AB43),
        ("0...31 ascending", (0..<32).map { UInt8($0) }, 0x46DD_794E),
        ("31...0 descending", (0..<32).map { UInt8(31 - $0) }, 0x113F_DB5C),
        ("empty", [], 0),
    ]

    @Test(arguments: vectors)
    func knownVector(name: String, bytes: [UInt8], expected: UInt32) {
        #expect(CRC32C.checksum(bytes) == expected, "\(name)")
        #expect(bytes.withUnsafeBytes { CRC32C.checksum($0) } == expected, "\(name)")
        #expect(bytes.withUnsafeBytes { CRC32C.portableUpdate(0, $0) } == expected, "\(name) (portable)")
        var crc = CRC32C()
        for byte in bytes { crc.update([byte]) }
        #expect(crc.value == expected, "\(name) byte by byte")
    }

    @Test func emptyUpdatesChangeNothing() {
        var crc = CRC32C()
        crc.update(UnsafeRawBufferPointer(start: nil, count: 0))
        crc.update([])
        #expect(crc.value == 0)
        crc.update(Array("123456789".utf8))
        crc.update(UnsafeRawBufferPointer(start: nil, count: 0))
        #expect(crc.value == 0xE306_9283)
        #expect(crc == CRC32C(value: 0xE306_9283))
    }

    // MARK: Splits

    static func randomBytes(count: Int, using rng: inout SplitMix64) -> [UInt8] {
        (0..<count).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
    }

    @Test func randomSplitsGiveTheSameValue() {
        let seed: UInt64 = 0xC5C3_2C00_1234_5678
        var rng = SplitMix64(seed: seed)
        let data = Self.randomBytes(count: 200_003, using: &rng)
        let whole = CRC32C.checksum(data)
        #expect(whole == data.withUnsafeBytes { CRC32C.portableUpdate(0, $0) })
        data.withUnsafeBytes { all in
            for trial in 0..<300 {
                // Up to 12 cut points, many of them close together so that short, odd-aligned pieces occur.
                let cuts = (0..<Int.random(in: 0...12, using: &rng)).map { _ in
                    Bool.random(using: &rng)
                        ? Int.random(in: 0...all.count, using: &rng) : Int.random(in: 0...64, using: &rng)
                }.sorted()
                var crc = CRC32C()
                var portable: UInt32 = 0
                var start = 0
                for end in cuts + [all.count] {
                    let piece = UnsafeRawBufferPointer(rebasing: all[start..<end])
                    crc.update(piece)
                    portable = CRC32C.portableUpdate(portable, piece)
                    start = end
                }
                #expect(crc.value == whole, "seed \(seed) trial \(trial) cuts \(cuts)")
                #expect(portable == whole, "portable, seed \(seed) trial \(trial) cuts \(cuts)")
            }
        }
    }

    /// Every implementation this CPU has gives the tables' value: lengths from 0 to 4 KiB and around the folding
    /// path's thresholds (1 KiB, steps of 256 bytes), start addresses off by 0 to 63 bytes, random start values,
    /// and 1 MiB buffers. On a CPU without AVX-512 VPCLMULQDQ (or SSE4.2) that implementation is not run, and the
    /// test says so.
    @Test func everyImplementationAgreesWithTheTables() {
        let seed: UInt64 = 0xC5C3_2C00_0000_0035
        var rng = SplitMix64(seed: seed)
        let data = Self.randomBytes(count: (1 << 20) + 64, using: &rng)
        let implementations = CRC32C.implementations
        #expect(implementations.contains(0))
        if !implementations.contains(2) { print("CRC32CTests: this CPU has no AVX-512 VPCLMULQDQ; that path is not run") }
        var lengths = Array(0...4096) + [(1 << 20) - 1, 1 << 20, (1 << 20) + 1]
        for base in [1024, 1280, 2048, 65536] { lengths += (base - 17...base + 17).map { $0 } }
        data.withUnsafeBytes { all in
            for length in lengths {
                let offset = Int.random(in: 0...63, using: &rng)
                let start = UInt32(truncatingIfNeeded: rng.next())
                let piece = UnsafeRawBufferPointer(rebasing: all[offset..<min(all.count, offset + length)])
                let expected = CRC32C.portableUpdate(start, piece)
                for implementation in implementations where implementation != 0 {
                    let got = CRC32C.update(implementation: implementation, start, piece)
                    if got != expected {
                        Issue.record("implementation \(implementation), length \(length), offset \(offset), seed \(seed)")
                        return
                    }
                }
            }
        }
    }

    // MARK: Combining without the data

    /// `combine(CRC(a), CRC(b), |b|)` is `CRC(a ++ b)` for random splits, empty parts on either side and lengths at
    /// and about powers of two included; chaining it over many parts gives the whole's CRC.
    @Test func combineEqualsTheDirectComputation() {
        let seed: UInt64 = 0xC0B1_4E00_0000_0030
        var rng = SplitMix64(seed: seed)
        let data = Self.randomBytes(count: (1 << 20) + 4099, using: &rng)
        #expect(CRC32C.combine(0, 0, length2: 0) == 0)
        #expect(CRC32C.combine(0xE306_9283, 0, length2: 0) == 0xE306_9283, "nothing after: unchanged")
        data.withUnsafeBytes { all in
            var lengths: [Int] = [0, 1, 2, 3, 7, 8, 9, 255, 256, 257, 4096, 65_536, 1 << 20, all.count]
            lengths += (0..<400).map { _ in Int.random(in: 0...all.count, using: &rng) }
            for cut in lengths {
                let a = UnsafeRawBufferPointer(rebasing: all[0..<cut])
                let b = UnsafeRawBufferPointer(rebasing: all[cut...])
                let combined = CRC32C.combine(CRC32C.checksum(a), CRC32C.checksum(b), length2: Int64(b.count))
                #expect(combined == CRC32C.checksum(all), "seed \(seed) cut \(cut)")
                // The empty second part, at any place.
                #expect(CRC32C.combine(CRC32C.checksum(a), 0, length2: 0) == CRC32C.checksum(a))
                // An empty first part.
                #expect(CRC32C.combine(0, CRC32C.checksum(a), length2: Int64(a.count)) == CRC32C.checksum(a))
            }
            // Many parts chained, some empty: each combine joins the running CRC with the next part.
            for trial in 0..<50 {
                let cuts = (0..<Int.random(in: 1...40, using: &rng)).map { _ in Int.random(in: 0...all.count, using: &rng) }
                    .sorted()
                var crc: UInt32 = 0
                var start = 0
                for end in cuts + [all.count] {
                    let part = UnsafeRawBufferPointer(rebasing: all[start..<end])
                    crc = CRC32C.combine(crc, CRC32C.checksum(part), length2: Int64(part.count))
                    start = end
                }
                #expect(crc == CRC32C.checksum(all), "seed \(seed) trial \(trial) cuts \(cuts)")
            }
        }
        // Lengths far past any buffer: combining over len zeros equals continuing the CRC over len zero bytes.
        let zeros = [UInt8](repeating: 0, count: 3 << 20)
        for length in [1 << 20, (3 << 20) - 5] {
            let direct = zeros.withUnsafeBytes { CRC32C.portableUpdate(0x1234_5678, UnsafeRawBufferPointer(rebasing: $0[0..<length])) }
            let zerosCRC = zeros.withUnsafeBytes { CRC32C.checksum(UnsafeRawBufferPointer(rebasing: $0[0..<length])) }
            #expect(CRC32C.combine(0x1234_5678, zerosCRC, length2: Int64(length)) == direct, "length \(length)")
        }
        // A length near 2^63 terminates and is consistent: combining in two halves equals combining at once.
        let half = Int64(1) << 62
        let once = CRC32C.combine(0xDEAD_BEEF, 0, length2: Int64.max)
        let twice = CRC32C.combine(CRC32C.combine(0xDEAD_BEEF, 0, length2: half), 0, length2: Int64.max - half)
        #expect(once == twice)
    }

    // MARK: Hardware and table paths agree

    @Test func hardwareAndPortableAgree() {
        // Which path `update` takes here; both are exercised either way (on a CPU without SSE4.2 this compares
        // the table path with itself).
        print("CRC32C hardware accelerated: \(CRC32C.isHardwareAccelerated)")
        let seed: UInt64 = 0x0DDB_A11C_AFE0_F00D
        var rng = SplitMix64(seed: seed)
        let data = Self.randomBytes(count: (1 << 20) + 77, using: &rng)
        data.withUnsafeBytes { all in
            // Every alignment × every short length, so head, body and tail loops all run.
            for offset in 0..<16 {
                for length in 0...300 {
                    let piece = UnsafeRawBufferPointer(rebasing: all[offset..<offset + length])
                    let seedCRC = UInt32(truncatingIfNeeded: rng.next())
                    var hardware = CRC32C(value: seedCRC)
                    hardware.update(piece)
                    let portable = CRC32C.portableUpdate(seedCRC, piece)
                    if hardware.value != portable {
                        Issue.record(
                            "offset \(offset) length \(length) start \(seedCRC): \(hardware.value) != \(portable)")
                        return
                    }
                }
            }
            // Lengths about the three-stream path's block sizes (3 × 256 and 3 × 8192 bytes), at odd offsets.
            for base in [768, 3 * 8192, 3 * 8192 + 768, 2 * 3 * 8192] {
                for length in base - 9...base + 9 {
                    for offset in [0, 1, 7] {
                        let piece = UnsafeRawBufferPointer(rebasing: all[offset..<offset + length])
                        let hardware = CRC32C.checksum(piece)
                        let portable = CRC32C.portableUpdate(0, piece)
                        #expect(hardware == portable, "offset \(offset) length \(length)")
                    }
                }
            }
            // And a large buffer at an odd offset.
            let big = UnsafeRawBufferPointer(rebasing: all[3...])
            #expect(CRC32C.checksum(big) == CRC32C.portableUpdate(0, big))
        }
    }
}
