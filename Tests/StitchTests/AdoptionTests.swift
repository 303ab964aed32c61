import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// `--adopt`'s parts that need no server: aria2's control file read and refused, the segments a state gets for a
/// partial, the samples compared, and the take-over's order on disk (docs/adopt.md). The end-to-end runs with
/// real wget, curl and aria2c are in StitchCLITests/AdoptTests.swift.
@Suite struct AdoptionTests {

    /// An aria2 control file, version 1, for a download of `total` bytes in pieces of `pieceLength`.
    static func controlFile(
        pieceLength: UInt32, total: UInt64, complete: Set<Int>, inFlight: [(index: UInt32, length: UInt32)] = [],
        version: UInt16 = 1, infoHash: [UInt8] = [], bitfieldLength: Int? = nil, extraBits: Bool = false
    ) -> [UInt8] {
        func be<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
            withUnsafeBytes(of: value.bigEndian) { Array($0) }
        }
        let pieces = pieceLength == 0 ? 0 : Int((total + UInt64(pieceLength) - 1) / UInt64(pieceLength))
        var bitfield = [UInt8](repeating: 0, count: bitfieldLength ?? (pieces + 7) / 8)
        for index in complete { bitfield[index / 8] |= 0x80 >> UInt8(index % 8) }
        if extraBits { bitfield[bitfield.count - 1] |= 1 }
        var bytes = be(version) + be(UInt32(0)) + be(UInt32(infoHash.count)) + infoHash
        bytes += be(pieceLength) + be(total) + be(UInt64(0)) + be(UInt32(bitfield.count)) + bitfield
        bytes += be(UInt32(inFlight.count))
        for piece in inFlight {
            bytes += be(piece.index) + be(piece.length) + be(UInt32(2)) + [0xC0, 0x00]
        }
        return bytes
    }

    @Test func readsAria2sBitfieldMostSignificantBitFirst() throws {
        let bytes = Self.controlFile(
            pieceLength: 1 << 20, total: 10 * (1 << 20) + 5, complete: [0, 1, 2, 7, 10], inFlight: [(3, 1 << 20)])
        let file = try Aria2ControlFile(parsing: bytes)
        #expect(file.pieceLength == 1 << 20)
        #expect(file.totalLength == 10 * (1 << 20) + 5)
        #expect(file.complete.count == 11)
        // The last piece is 5 bytes long.
        let expected: [Range<Int64>] = [0..<(3 << 20), (7 << 20)..<(8 << 20), (10 << 20)..<(10 * (1 << 20) + 5)]
        #expect(file.completeRanges == expected)
    }

    @Test(arguments: [
        ("version 0", controlFile(pieceLength: 1 << 20, total: 4 << 20, complete: [0], version: 0), "version 0"),
        (
            "BitTorrent", controlFile(pieceLength: 1 << 20, total: 4 << 20, complete: [0], infoHash: [1, 2]),
            "BitTorrent"
        ),
        (
            "short bitfield", controlFile(pieceLength: 1 << 20, total: 16 << 20, complete: [0], bitfieldLength: 1),
            "bitfield"
        ),
        (
            "spare bits", controlFile(pieceLength: 1 << 20, total: 3 << 20, complete: [0], extraBits: true),
            "past the file"
        ),
        (
            "truncated", Array(controlFile(pieceLength: 1 << 20, total: 4 << 20, complete: [0]).dropLast(2)),
            "ends inside"
        ),
        ("trailing", controlFile(pieceLength: 1 << 20, total: 4 << 20, complete: [0]) + [0], "follow"),
        ("zero piece length", controlFile(pieceLength: 0, total: 0, complete: [], bitfieldLength: 0), "piece length"),
        (
            "bad in-flight", controlFile(pieceLength: 1 << 20, total: 2 << 20, complete: [], inFlight: [(9, 1)]),
            "out of range"
        ),
    ])
    func refusesDamagedControlFiles(_ name: String, _ bytes: [UInt8], _ why: String) {
        do {
            _ = try Aria2ControlFile(parsing: bytes)
            Issue.record("\(name): accepted")
        } catch {
            #expect(error.why.contains(why), "\(name): \(error.why)")
        }
    }

    @Test func everyPrefixOfAControlFileIsRefused() {
        let bytes = Self.controlFile(pieceLength: 1 << 20, total: 20 << 20, complete: [0, 5], inFlight: [(6, 1 << 20)])
        #expect(throws: Never.self) { try Aria2ControlFile(parsing: bytes) }
        for count in 0..<bytes.count {
            #expect(throws: Aria2ControlFile.Problem.self) { try Aria2ControlFile(parsing: Array(bytes[0..<count])) }
        }
    }

    /// Segments tile the file, keep exactly the claimed bytes (up to the slot limit), and make a state that passes
    /// the reader's checks.
    @Test(
        arguments: [
            ([0..<100], 1000),  // a wget prefix
            ([0..<1000], 1000),  // complete
            ([200..<300, 500..<600], 1000),  // a leading gap, two runs
            ([0..<10, 900..<1000], 1000),  // ends complete
        ] as [([Range<Int64>], Int64)])
    func segmentsKeepWhatIsClaimed(_ claimed: [Range<Int64>], _ total: Int64) {
        let segments = Adoption.segments(claimed: claimed, total: total)
        var state = PartStoreTests.makeState(segments: segments, total: total)
        state.pieceSize = PieceLayout.pieceSize(forTotal: total)
        #expect(state.problem() == nil, "\(segments)")
        let kept = segments.filter { $0.durable > $0.start }.map { $0.start..<$0.durable }
        #expect(kept == claimed)
    }

    @Test func tooManyRunsGiveUpTheSmallest() {
        // 400 runs of complete pieces: more than the live record's slots.
        var claimed: [Range<Int64>] = []
        for index in 0..<400 {
            let start = Int64(index) * 10_000
            claimed.append(start..<(start + Int64(100 + index)))
        }
        let total: Int64 = 4_000_000
        let segments = Adoption.segments(claimed: claimed, total: total)
        #expect(segments.count == LiveRecord.slotCount)
        var state = PartStoreTests.makeState(segments: segments, total: total)
        state.pieceSize = PieceLayout.pieceSize(forTotal: total)
        #expect(state.problem() == nil)
        let kept = Set(segments.filter { $0.durable > $0.start }.map { $0.start..<$0.durable })
        #expect(kept.isSubset(of: Set(claimed)))
        // The first run always stays (nothing before it to merge into); of the rest, the largest ones stay.
        #expect(kept.contains(claimed[0]))
        #expect(kept.contains(claimed[399]) && !kept.contains(claimed[1]))
    }

    @Test func samplesSpreadOverTheClaimedBytesWithBothEnds() {
        let claimed: [Range<Int64>] = [0..<(3 << 20), (7 << 20)..<(8 << 20), (10 << 20)..<((10 << 20) + 5)]
        let samples = Adoption.samples(of: claimed)
        #expect(samples.count >= Adoption.minimumSamples && samples.count <= Adoption.maximumSamples + 2)
        #expect(samples.first?.lowerBound == 0)
        let lastPiece: Range<Int64> = (10 << 20)..<((10 << 20) + 5)
        #expect(samples.last == lastPiece)
        for sample in samples {
            #expect(claimed.contains { $0.contains(sample.lowerBound) && sample.upperBound <= $0.upperBound })
            #expect(sample.count <= Adoption.sampleBytes * 2)
        }
        for (a, b) in zip(samples, samples.dropFirst()) { #expect(a.upperBound < b.lowerBound) }
        // A wget prefix: its last 64 KiB are always compared.
        let prefix = Adoption.samples(of: [0..<(5 << 20) + 17])
        let prefixEnd: Range<Int64> = ((5 << 20) + 17 - Adoption.sampleBytes)..<((5 << 20) + 17)
        #expect(prefix.last == prefixEnd)
        // A small partial is compared whole.
        let small = Adoption.samples(of: [0..<300_000])
        #expect(small.reduce(0) { $0 + $1.count } == 300_000)
        // A large one gets more samples, up to the maximum.
        #expect(Adoption.samples(of: [0..<(4 << 30)]).count == Adoption.maximumSamples)
    }

    /// The take-over: the state first (inert while no part file exists), then the rename, then the control file
    /// goes; a state without a part file is what `inspect` finds foreign again (an adoption cut short).
    @Test func takeOverOrderAndAnAdoptionCutShort() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/f.bin")
        let bytes = ServedFile.randomBytes(count: 3 << 20, seed: 5)
        try Data(bytes).write(to: URL(fileURLWithPath: paths.destination))
        let control = Self.controlFile(pieceLength: 1 << 20, total: 4 << 20, complete: [0, 2])
        try Data(control).write(to: URL(fileURLWithPath: ForeignPartial.controlFile(of: paths.destination)))
        guard case .found(let foreign) = try ForeignPartial.inspect(paths) else {
            Issue.record("not found")
            return
        }
        #expect(foreign.origin == .aria2(pieceLength: 1 << 20, totalLength: 4 << 20))
        #expect(foreign.claimed == [0..<(1 << 20), (2 << 20)..<(3 << 20)])

        var state = PartStoreTests.makeState(
            segments: Adoption.segments(claimed: foreign.claimed, total: 4 << 20), total: 4 << 20)
        state.pieceSize = PieceLayout.pieceSize(forTotal: 4 << 20)
        try ForeignPartial.takeOver(paths, state: state)
        #expect(!fileExists(paths.destination) && !fileExists(paths.destination + ".aria2"))
        #expect(try StateFile.read(paths.state) == state)
        #expect(readBytes(paths.part) == bytes)
        #expect(try ForeignPartial.inspect(paths) == .nothing, "now Stitch's own partial")

        // Cut short after the state was written, before the rename (reconstructed by renaming back; the control
        // file is gone here, so the file is found as a prefix): found again, not hidden by the inert state.
        #expect(rename(paths.part, paths.destination) == 0)
        guard case .found(let again) = try ForeignPartial.inspect(paths) else {
            Issue.record("a state without its part file hid the partial")
            return
        }
        #expect(again.origin == .prefix && again.claimed == [0..<(3 << 20)])
        try ForeignPartial.discardInertState(paths)
        #expect(!fileExists(paths.state) && fileExists(paths.destination))
    }

    @Test func aDamagedControlFileLeavesEverythingAsItIs() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/f.bin")
        try Data([1, 2, 3]).write(to: URL(fileURLWithPath: paths.destination))
        let control = Array(Self.controlFile(pieceLength: 1 << 20, total: 4 << 20, complete: [0]).dropLast())
        try Data(control).write(to: URL(fileURLWithPath: paths.destination + ".aria2"))
        do {
            _ = try ForeignPartial.inspect(paths)
            Issue.record("accepted")
        } catch {
            #expect(error.code == .unusableState && error.message.contains("not a usable aria2 control file"))
        }
        // A control file claiming bytes beyond the file's end (the file was cut) is refused too.
        let beyond = Self.controlFile(pieceLength: 1 << 20, total: 4 << 20, complete: [3])
        try Data(beyond).write(to: URL(fileURLWithPath: paths.destination + ".aria2"))
        #expect(throws: DownloadError.self) { try ForeignPartial.inspect(paths) }
        #expect(readBytes(paths.destination) == [1, 2, 3])
        #expect(readBytes(paths.destination + ".aria2") == beyond)
    }
}

private func readBytes(_ path: String) -> [UInt8]? {
    FileManager.default.contents(atPath: path).map(Array.init)
}
