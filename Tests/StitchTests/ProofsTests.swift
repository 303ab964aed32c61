import Foundation
import Glibc
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore
import StitchLocks

/// State format 3's proofs (``Proofs``): every durable byte lies in a recorded piece or in exactly one proof, each
/// proof within one piece and one segment's durable extent; a state write reads only bytes no earlier checksum
/// covers; a reader checks them; the whole file's CRC is joined from them.
@Suite struct ProofsTests {
    static let mib: Int64 = 1 << 20

    /// A reader over `data` that counts the bytes it reads.
    final class Reader: Sendable {
        let data: [UInt8]
        private let count = Atomic<Int64>(0)

        init(_ data: [UInt8]) { self.data = data }

        var bytesRead: Int64 { count.load(ordering: .relaxed) }

        func read(_ start: Int64, _ end: Int64, _ crc: UInt32) throws(DownloadError) -> UInt32 {
            guard end <= Int64(data.count) else { throw DownloadError(.io, "past the end") }
            count.add(end - start, ordering: .relaxed)
            var running = CRC32C(value: crc)
            data[Int(start)..<Int(end)].withUnsafeBytes { running.update($0) }
            return running.value
        }
    }

    static func state(_ segments: [Segment], total: Int64?) -> DownloadState {
        var state = PartStoreTests.makeState(segments: segments, total: total)
        state.pieceSize = PieceLayout.pieceSize(forTotal: total)
        return state
    }

    /// Checks the invariant of a state a checkpoint writes, and that every checksum matches `data`.
    static func expectInvariant(
        _ state: DownloadState, _ data: [UInt8], sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(state.problem() == nil, "\(state.problem() ?? "")", sourceLocation: sourceLocation)
        #expect(state.schemaVersion == 3, sourceLocation: sourceLocation)
        let size = state.pieceSize
        var cover = [UInt8](repeating: 0, count: data.count)
        for (piece, crc) in state.pieces.enumerated() {
            guard let crc else { continue }
            let range = Int(Int64(piece) * size)..<Int(min(Int64(piece + 1) * size, Int64(data.count)))
            #expect(CRC32C.checksum(Array(data[range])) == crc, "piece \(piece)", sourceLocation: sourceLocation)
            for index in range { cover[index] &+= 1 }
        }
        for proof in state.proofs {
            let range = Int(proof.start)..<Int(proof.end)
            #expect(CRC32C.checksum(Array(data[range])) == proof.crc, "proof \(proof)", sourceLocation: sourceLocation)
            if state.validators.totalLength != nil {
                #expect(proof.start / size == (proof.end - 1) / size, "within one piece", sourceLocation: sourceLocation)
                let piece = Int(proof.start / size)
                #expect(piece >= state.pieces.count || state.pieces[piece] == nil, sourceLocation: sourceLocation)
            }
            #expect(
                state.segments.contains { $0.start <= proof.start && proof.end <= $0.durable },
                "proof \(proof) within one segment's durable bytes", sourceLocation: sourceLocation)
            for index in range { cover[index] &+= 1 }
        }
        for segment in state.segments {
            for index in Int(segment.start)..<Int(segment.durable) where cover[index] != 1 {
                Issue.record("durable byte \(index) is covered \(cover[index]) times", sourceLocation: sourceLocation)
                return
            }
        }
    }

    /// Durable extents that grow over several writes: pieces shared between segments (splits inside them), partial
    /// pieces, pieces completed with and without their writer's checksum. After each write the invariant holds, and
    /// the bytes read are exactly the new durable bytes no checksum covered — none when nothing changed.
    @Test func updateProvesEveryDurableByteReadingOnlyNewBytes() throws {
        let mib = Self.mib
        let total = 7 * mib + 777
        let data = ServedFile.randomBytes(count: Int(total), seed: 0x9F00F)
        let ends: [Int64] = [5 * mib / 2, 4 * mib, total]
        let starts: [Int64] = [0, 5 * mib / 2, 4 * mib]
        // Durable extents per step, for the three segments [0, 2.5M) [2.5M, 4M) [4M, end).
        let steps: [[Int64]] = [
            [300_000, 5 * mib / 2, 4 * mib],
            [1_500_000, 2_800_000, 4 * mib + 100],
            [1_500_000, 2_800_000, 4 * mib + 100],  // nothing new
            [5 * mib / 2, 4 * mib, 6 * mib + 5],
            [5 * mib / 2, 4 * mib, total],
        ]
        let reader = Reader(data)
        var previous = Self.state(
            zip(starts, ends).map { Segment(start: $0, end: $1, durable: $0) }, total: total)
        var lastDurable: [Int64] = starts
        for (step, durable) in steps.enumerated() {
            var next = previous
            for index in next.segments.indices { next.segments[index].durable = durable[index] }
            // The writers' checksums: piece 0 (written from its first byte); none for the rest, read back instead.
            let pending: [Int: UInt32] = [0: CRC32C.checksum(Array(data[0..<Int(mib)]))]
            let before = reader.bytesRead
            try Proofs.update(&next, previous: previous.proofs, pending: pending, read: reader.read)
            Self.expectInvariant(next, data)
            let grown = zip(durable, lastDurable).reduce(Int64(0)) { $0 + ($1.0 - $1.1) }
            let piece0New = max(0, min(durable[0], mib) - min(lastDurable[0], mib))
            let read = reader.bytesRead - before
            if previous.pieces.first.flatMap({ $0 }) == nil && durable[0] >= mib {
                // Piece 0's checksum came from its writer: its new bytes were not read.
                #expect(read == grown - piece0New, "step \(step): read \(read) of \(grown) new bytes")
            } else {
                #expect(read == grown, "step \(step): read \(read), \(grown) new bytes")
            }
            previous = next
            lastDurable = durable
        }
        // All durable: every piece recorded, no proof left.
        #expect(previous.proofs.isEmpty)
        #expect(previous.pieces.count == 8 && previous.pieces.allSatisfy { $0 != nil })
    }

    /// With an unknown length the durable prefix is proven in chunks of a piece, at most 4,096 of them; past 4 GiB the
    /// chunk doubles, the proofs joining pairwise without a byte read again, and the state stays under its limit.
    @Test func unknownLengthProofsCoarsenWithoutReadingAgain() throws {
        let mib = Self.mib
        // Zeros, "read" through the CRC of zero runs (joined by doubling) instead of 4 GiB of memory.
        let counted = Atomic<Int64>(0)
        let read: Proofs.Reader = { (start, end, crc) throws(DownloadError) in
            counted.add(end - start, ordering: .relaxed)
            return CRC32C.combine(crc, Self.zerosCRC(end - start), length2: end - start)
        }
        var state = Self.state([Segment(start: 0, end: nil, durable: 4096 * mib)], total: nil)
        try Proofs.update(&state, previous: [], pending: [:], read: read)
        #expect(state.proofs.count == 4096)
        #expect(state.proofs.allSatisfy { $0.end - $0.start == mib && $0.crc == Self.zerosCRC(mib) })
        #expect(counted.load(ordering: .relaxed) == 4096 * mib)
        #expect(state.problem() == nil)

        var grown = state
        grown.segments[0].durable = 4096 * mib + mib + 7
        try Proofs.update(&grown, previous: state.proofs, pending: [:], read: read)
        #expect(counted.load(ordering: .relaxed) == 4096 * mib + mib + 7, "only the new bytes are read")
        #expect(grown.proofs.count == 2049)
        #expect(grown.proofs.dropLast().allSatisfy { $0.end - $0.start == 2 * mib && $0.crc == Self.zerosCRC(2 * mib) })
        #expect(grown.proofs.last == Proof(start: 4096 * mib, end: 4097 * mib + 7, crc: Self.zerosCRC(mib + 7)))
        #expect(grown.problem() == nil)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        let size = try encoder.encode(state).count
        #expect(size < StateFile.maximumSize / 2, "4,096 proofs: \(size) bytes of state")
        #expect(Proofs.chunkSize(pieceSize: mib, durable: 0) == mib)
        #expect(Proofs.chunkSize(pieceSize: mib, durable: 4096 * mib) == mib)
        #expect(Proofs.chunkSize(pieceSize: mib, durable: 4096 * mib + 1) == 2 * mib)
        #expect(Proofs.chunkSize(pieceSize: mib, durable: Int64.max) > 0)

        // The length learnt: the chunks' proofs join into pieces (of 2 MiB for this size) without reading.
        var known = grown
        known.validators.totalLength = 5000 * mib
        known.segments[0].end = 5000 * mib
        known.pieceSize = PieceLayout.pieceSize(forTotal: 5000 * mib)
        #expect(known.pieceSize == 2 * mib)
        try Proofs.update(&known, previous: grown.proofs, pending: [:], read: read)
        #expect(counted.load(ordering: .relaxed) == 4096 * mib + mib + 7)
        #expect(known.pieces.count == 2048 && known.pieces.allSatisfy { $0 == Self.zerosCRC(2 * mib) })
        #expect(known.proofs == [Proof(start: 4096 * mib, end: 4097 * mib + 7, crc: Self.zerosCRC(mib + 7))])
        #expect(known.problem() == nil)
    }

    /// The CRC32C of `count` zero bytes, joined from halves (remembered).
    static func zerosCRC(_ count: Int64) -> UInt32 {
        if count == 0 { return 0 }
        if let known = zerosCRCs.withLock({ $0[count] }) { return known }
        let crc: UInt32
        if count <= 4096 {
            crc = CRC32C.checksum([UInt8](repeating: 0, count: Int(count)))
        } else {
            let half = count / 2
            crc = CRC32C.combine(zerosCRC(half), zerosCRC(count - half), length2: count - half)
        }
        zerosCRCs.withLock { $0[count] = crc }
        return crc
    }

    static let zerosCRCs = Locked<[Int64: UInt32]>([:])

    /// The check after a reboot: recorded pieces and proofs that no longer match are damaged, durable bytes with no
    /// checksum (a format 2 state) are unproven; with an unknown length, proven up to the first chunk that fails.
    @Test func checkFindsDamagedAndUnprovenPieces() throws {
        let mib = Self.mib
        let total = 5 * mib
        var data = ServedFile.randomBytes(count: Int(total), seed: 0xC4EC)
        let segments = [
            Segment(start: 0, end: 5 * mib / 2, durable: 5 * mib / 2),
            Segment(start: 5 * mib / 2, end: total, durable: 4 * mib + 10),
        ]
        var state = Self.state(segments, total: total)
        try Proofs.update(&state, previous: [], pending: [:], read: Reader(data).read)
        #expect(state.pieces.count == 4 && state.pieces.allSatisfy { $0 != nil }, "pieces 0-3 all durable")
        #expect(state.proofs == [Proof(start: 4 * mib, end: 4 * mib + 10, crc: CRC32C.checksum(Array(data[Int(4 * mib)..<Int(4 * mib + 10)])))])
        #expect(Proofs.check(state, read: Reader(data).read) == Proofs.Check(checked: 5))

        data[Int(mib) + 5] ^= 1  // piece 1 (recorded)
        data[Int(4 * mib) + 3] ^= 1  // piece 4 (its proof)
        let found = Proofs.check(state, read: Reader(data).read)
        #expect(found.damaged == [1, 4] && found.unproven.isEmpty && found.checked == 5)

        // Format 2: no proofs, so piece 4's durable bytes are unproven; a piece recorded by no one is too.
        var old = state
        old.schemaVersion = 2
        old.proofs = []
        old.pieces[2] = nil
        let unproven = Proofs.check(old, read: Reader(data).read)
        #expect(unproven.damaged == [1] && unproven.unproven == [2, 4] && unproven.cut == [1, 2, 4])

        // One prefix of unknown length: proven up to the chunk that fails.
        var prefix = Self.state([Segment(start: 0, end: nil, durable: 3 * mib + 5)], total: nil)
        let clean = ServedFile.randomBytes(count: Int(4 * mib), seed: 0xC4ED)
        try Proofs.update(&prefix, previous: [], pending: [:], read: Reader(clean).read)
        #expect(prefix.proofs.map(\.start) == [0, mib, 2 * mib, 3 * mib])
        #expect(Proofs.check(prefix, read: Reader(clean).read).provenEnd == 3 * mib + 5)
        var damaged = clean
        damaged[Int(2 * mib) + 1] ^= 1
        #expect(Proofs.check(prefix, read: Reader(damaged).read).provenEnd == 2 * mib)
        prefix.proofs = []
        #expect(Proofs.check(prefix, read: Reader(clean).read).provenEnd == 0, "nothing proven without proofs")
    }

    /// The whole file's CRC joined from the pieces' and the proofs' checksums, reading only what none covers.
    @Test func wholeFileChecksumReadsOnlyWhatNoChecksumCovers() throws {
        let mib = Self.mib
        let total = 4 * mib + 999
        let data = ServedFile.randomBytes(count: Int(total), seed: 0x401E)
        let reader = Reader(data)
        func crc(_ range: Range<Int64>) -> UInt32 { CRC32C.checksum(Array(data[Int(range.lowerBound)..<Int(range.upperBound)])) }
        let pieces: [Int: UInt32] = [0: crc(0..<mib), 2: crc(2 * mib..<3 * mib), 4: crc(4 * mib..<total)]
        let proofs = [Proof(start: mib, end: mib + 1000, crc: crc(mib..<mib + 1000))]
        let whole = try Proofs.wholeFile(length: total, pieceSize: mib, pieces: pieces, ranges: proofs, read: reader.read)
        #expect(whole == CRC32C.checksum(data))
        #expect(reader.bytesRead == (mib - 1000) + mib, "the rest of piece 1, and piece 3")
        #expect(try Proofs.wholeFile(length: 0, pieceSize: mib, pieces: [:], ranges: [], read: reader.read) == 0)
    }

    /// A format 3 state's proofs are checked like its segments: refused when impossible.
    @Test(arguments: [
        "impossible proof", "proof outside the durable bytes", "proof across pieces", "too many proofs",
        "missing proofs",
    ])
    func impossibleProofsAreRefused(_ name: String) throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        let mib = Self.mib
        var state = Self.state([Segment(start: 0, end: 3 * mib, durable: 2 * mib + 10)], total: 3 * mib)
        state.proofs = [Proof(start: 0, end: 10, crc: 1)]
        #expect(state.problem() == nil)
        switch name {
        case "impossible proof": state.proofs = [Proof(start: 20, end: 10, crc: 1)]
        case "proof outside the durable bytes": state.proofs = [Proof(start: 2 * mib, end: 2 * mib + 11, crc: 1)]
        case "proof across pieces": state.proofs = [Proof(start: mib - 1, end: mib + 1, crc: 1)]
        case "too many proofs":
            state.proofs = (0..<Int64(Proofs.maximumCount + 1)).map { Proof(start: $0, end: $0 + 1, crc: 0) }
        default: break
        }
        if name == "missing proofs" {
            let encoder = JSONEncoder()
            var object = try #require(
                try JSONSerialization.jsonObject(with: try encoder.encode(state)) as? [String: Any])
            object["proofs"] = nil
            try JSONSerialization.data(withJSONObject: object).write(to: URL(fileURLWithPath: path))
        } else {
            #expect(state.problem() == name)
            try StateFile.write(state, to: path)
        }
        let error = #expect(throws: DownloadError.self) { try StateFile.read(path) }
        #expect(error?.code == .unusableState)
        #expect(error?.message.contains(name == "missing proofs" ? "missing proofs" : name) == true, "\(error?.message ?? "")")
    }

    // MARK: Through the store

    /// The store keeps the invariant at every state write: checkpoints over segments that split inside pieces,
    /// a reopen, a repair (`invalidate`), and the first checkpoint after a format 2 state (its upgrade). The finish
    /// marks the file with its whole CRC32C.
    @Test func storeKeepsEveryDurableByteProven() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let mib = Self.mib
        let total = 5 * mib + 4321
        let data = ServedFile.randomBytes(count: Int(total), seed: 0x5707E)
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: PartStoreTests.makeState(durable: 0, total: total).validators)
        #expect(store!.split(0, at: 3 * mib / 2) == 1)
        #expect(store!.split(1, at: 3 * mib + 12_345) == 2)
        try LyingDiskTests.lane(store!, data, slot: 0, segmentStart: 0, 0..<(mib + 5))
        try LyingDiskTests.lane(store!, data, slot: 1, segmentStart: 3 * mib / 2, (3 * mib / 2)..<(2 * mib + 7))
        try store!.checkpoint()
        Self.expectInvariant(try #require(try StateFile.read(paths.state)), data)
        try LyingDiskTests.lane(store!, data, slot: 0, segmentStart: 0, (mib + 5)..<(3 * mib / 2))
        try LyingDiskTests.lane(store!, data, slot: 2, segmentStart: 3 * mib + 12_345, (3 * mib + 12_345)..<(4 * mib))
        try store!.checkpoint()
        let second = try #require(try StateFile.read(paths.state))
        Self.expectInvariant(second, data)
        // Piece 1, shared by the first two segments, is all durable now: its checksum joined from their parts'.
        #expect(second.pieces[0] != nil && second.pieces[1] != nil && second.pieces.count == 2)

        // A repair of piece 3: the rest stays proven.
        try store!.invalidate(pieces: [3])
        Self.expectInvariant(try #require(try StateFile.read(paths.state)), data)
        store = nil

        // A format 2 state of the same bytes: the first write upgrades it, proving what no piece covers.
        var old = try #require(try StateFile.read(paths.state))
        old.schemaVersion = 2
        old.proofs = []
        try StateFile.write(old, to: paths.state)
        let (reopened, point) = try PartStore.reopen(paths: paths, state: old)
        #expect(point.bytes == old.durableBytes)
        let upgraded = try #require(try StateFile.read(paths.state))
        #expect(upgraded.schemaVersion == 3 && !upgraded.proofs.isEmpty)
        Self.expectInvariant(upgraded, data)

        for (slot, segment) in reopened.writtenSegments.enumerated() {
            guard let end = segment.end, segment.durable < end else { continue }
            try LyingDiskTests.lane(reopened, data, slot: slot, segmentStart: segment.start, segment.durable..<end)
        }
        try reopened.finish(url: "http://x/file.bin", length: total)
        let finished = try readFile(paths.destination) == data
        #expect(finished, "the finished file differs from the source")
        let mark = try #require(CompletionMark.read(at: paths.destination))
        #expect(mark.crc32c == CRC32C.checksum(data) && mark.length == total)
    }

    /// `Downloader.verify(at:)` on a download of unknown length (one prefix, proven in chunks): a changed byte in the
    /// third chunk is reported from that chunk's start to the durable end, the download cut there (state, live
    /// record and part file), and the next check finds nothing.
    @Test func verifyCutsAPrefixOfUnknownLengthAtTheFirstFailingChunk() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/stream.bin")
        let mib = Self.mib
        let data = ServedFile.randomBytes(count: Int(3 * mib + 5000), seed: 0x57E4)
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/stream.bin", headers: [], checksum: nil, validators: .none)
        try LyingDiskTests.lane(store!, data, slot: 0, segmentStart: 0, 0..<Int64(data.count))
        try store!.checkpoint()
        let saved = try #require(try StateFile.read(paths.state))
        #expect(saved.proofs.map(\.start) == [0, mib, 2 * mib, 3 * mib] && saved.pieces.isEmpty)
        store = nil
        #expect(try Downloader.verify(at: paths.destination).damagedPieces.isEmpty)

        try SegmentedTests.flipByte(in: paths.part, at: 2 * mib + 77)
        let report = try Downloader.verify(at: paths.destination)
        #expect(report.damagedPieces == [DamagedPiece(index: 2, bytes: (2 * mib)..<Int64(data.count))], "\(report)")
        #expect(report.piecesChecked == 3, "chunks 0 and 1 held, 2 failed")
        let cut = try #require(try StateFile.read(paths.state))
        #expect(cut.segments == [Segment(start: 0, end: nil, durable: 2 * mib)])
        #expect(cut.proofs.map(\.start) == [0, mib])
        #expect(LiveRecord.read(at: paths.live, nonce: cut.nonce)?.first == 2 * mib)
        #expect(fileSize(paths.part) == 2 * mib)
        let again = try Downloader.verify(at: paths.destination)
        #expect(again.damagedPieces.isEmpty && again.piecesChecked == 2, "\(again)")
    }

    /// A mark written before the CRC existed still reads (its `crc32c` absent), and gives no part file a finish.
    @Test func markWithoutChecksumStillReads() throws {
        let old = try JSONDecoder().decode(
            CompletionMark.self, from: Data(#"{"url":"http://x/f","length":5,"etag":"\"e\""}"#.utf8))
        #expect(old == CompletionMark(url: "http://x/f", length: 5, etag: "\"e\"", crc32c: nil))
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/f")
        try writeFile(paths.part, [1, 2, 3, 4, 5])
        let fd = open(paths.part, O_RDWR)
        #expect(fd >= 0)
        old.write(fd: fd)
        close(fd)
        guard case .none = try PartStore.finishMarkedPart(at: paths, matching: { _ in true }, verify: { _ in }) else {
            Issue.record("a mark without a CRC finished a part file")
            return
        }
        #expect(fileExists(paths.part) && !fileExists(paths.destination))
    }
}
