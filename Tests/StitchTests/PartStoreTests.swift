import Foundation
import Glibc
import StitchLocks
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore

/// Crash-consistency of the storage layer: the state file's atomic replacement, the live record, and how much of
/// a part file `PartStore.reopen` trusts after a process crash (same boot) or a reboot (other boot).
@Suite struct PartStoreTests {

    // MARK: StateFile

    @Test func stateRoundTripsAndMissingIsNil() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        #expect(try StateFile.read(path) == nil)
        let state = makeState(durable: 123, total: 1000)
        try StateFile.write(state, to: path)
        #expect(try StateFile.read(path) == state)
        #expect(!fileExists(path + ".tmp"))

        // Several segments, out of offset order (slot order), with recorded and missing piece checksums.
        var segmented = makeState(
            segments: [
                Segment(start: 0, end: 1 << 20, durable: 1 << 20),
                Segment(start: 2 << 20, end: 3 << 20, durable: (2 << 20) + 5),
                Segment(start: 1 << 20, end: 2 << 20, durable: 1 << 20),
            ], total: 3 << 20)
        segmented.pieces = [0xDEAD_BEEF, nil, 7]
        try StateFile.write(segmented, to: path)
        let read = try #require(try StateFile.read(path))
        #expect(read == segmented)
        #expect(read.schemaVersion == 3)
        #expect(read.durableBytes == (1 << 20) + 5)
        #expect(read.durablePrefix == 1 << 20)
    }

    /// `durableBytes` sums every segment; `durablePrefix` stops at the first gap.
    @Test func durableBytesAndPrefix() {
        var state = makeState(durable: 0, total: nil)
        #expect(state.durableBytes == 0 && state.durablePrefix == 0)
        state.segments = [Segment(start: 0, end: nil, durable: 500)]
        #expect(state.durableBytes == 500 && state.durablePrefix == 500)
        state.validators.totalLength = 3000
        state.segments = [
            Segment(start: 2000, end: 3000, durable: 2500),
            Segment(start: 0, end: 1000, durable: 1000),
            Segment(start: 1000, end: 2000, durable: 1200),
        ]
        #expect(state.durableBytes == 500 + 1000 + 200)
        #expect(state.durablePrefix == 1200)
        state.segments[2].durable = 2000
        #expect(state.durablePrefix == 2500)
        state.segments[1].durable = 999
        #expect(state.durablePrefix == 999)
    }

    /// A crash while writing the temporary file, or after writing it but before the rename, leaves `NAME.tmp`
    /// beside an intact state: readers ignore it and the next write replaces it.
    @Test(arguments: ["garbage", "", "{\"schemaVersion\": 2, \"url\": \"http://x/", "newer"])
    func leftoverTemporaryIsIgnored(_ leftover: String) throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        let old = makeState(durable: 100, total: 1000)
        try StateFile.write(old, to: path)
        var newer = old
        newer.segments[0].durable = 900
        let text = leftover == "newer" ? String(decoding: try JSONEncoder().encode(newer), as: UTF8.self) : leftover
        try writeFile(path + ".tmp", Array(text.utf8))

        #expect(try StateFile.read(path) == old)
        try StateFile.write(newer, to: path)
        #expect(try StateFile.read(path) == newer)
        #expect(!fileExists(path + ".tmp"))
    }

    static func validJSON() throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return String(decoding: try encoder.encode(makeState(durable: 10, total: 100)), as: UTF8.self)
    }

    @Test(arguments: [
        ("empty", ""),
        ("not JSON", "garbage"),
        ("binary", "\u{0}\u{1}\u{2}\u{ff}"),
        ("truncated", "TRUNCATED"),
        ("other format", "{\"schemaVersion\": 1}"),
        ("newer format", "{\"schemaVersion\": 4}"),
        ("format as a string", "{\"schemaVersion\": \"2\"}"),
        ("missing fields", "{\"schemaVersion\": 2, \"url\": \"http://x/\"}"),
        ("wrong type", "REPLACE:\"durable\":10=\"durable\":\"ten\""),
        ("negative length", "REPLACE:\"durable\":10=\"durable\":-1"),
        ("durable beyond total", "REPLACE:\"durable\":10=\"durable\":101"),
        ("segment beyond total", "REPLACE:\"end\":100=\"end\":101"),
        ("durable before start", "REPLACE:\"start\":0=\"start\":11"),
        ("a JSON array", "[1, 2, 3]"),
    ])
    func corruptStateIsUnusable(_ name: String, _ content: String) throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        var text = content
        if content == "TRUNCATED" {
            let valid = try Self.validJSON()
            text = String(valid.prefix(valid.count / 2))
        } else if content.hasPrefix("REPLACE:") {
            let parts = content.dropFirst(8).split(separator: "=", maxSplits: 1).map(String.init)
            text = try Self.validJSON().replacingOccurrences(of: parts[0], with: parts[1])
            #expect(text != (try Self.validJSON()), "the replacement must apply")
        }
        try writeFile(path, Array(text.utf8))
        let error = #expect(throws: DownloadError.self) { try StateFile.read(path) }
        #expect(error?.code == .unusableState)
        #expect(error?.message.contains(path) == true)
        #expect(error?.message.contains("\n") == false, "one line: \(error?.message ?? "")")
    }

    /// A state file of the previous format (one `durableLength`) is refused with its format named, not misread.
    @Test func formatOneStateIsRefused() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        let v1 = """
            {"schemaVersion": 1, "url": "http://example.com/file.bin", "headers": [], "validators":
            {"etag": "\\"v1\\"", "totalLength": 100, "acceptRanges": true}, "durableLength": 10,
            "bootID": "\(BootID.current)", "liveNonce": "1234abcd", "updatedAt": 1700000000}
            """
        try writeFile(path, Array(v1.utf8))
        let error = #expect(throws: DownloadError.self) { try StateFile.read(path) }
        #expect(error?.code == .unusableState)
        #expect(error?.message.contains("state format 1") == true, "\(error?.message ?? "")")
        #expect(error?.message.contains("format 3") == true, "\(error?.message ?? "")")
        #expect(error?.message.contains("format 2") == true, "\(error?.message ?? "")")
    }

    /// Well-formed JSON whose segments or pieces break an invariant a reader relies on: refused as corrupt, with
    /// the broken rule named.
    @Test(arguments: [
        "bad nonce", "no segments", "too many segments", "overlapping segments", "open segment beside others",
        "open segment with a length", "segment past the length", "durable before start", "durable past end",
        "negative start", "piece size not a power of two", "piece size too small", "too many pieces",
        "pieces without a length",
    ])
    func inconsistentStateIsUnusable(_ name: String) throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        var state = makeState(durable: 0, total: 3_000_000)
        let total: Int64 = 3_000_000
        switch name {
        case "bad nonce": state.liveNonce = "not hex"
        case "no segments": state.segments = []
        case "too many segments":
            state.segments = (0...Int64(LiveRecord.slotCount)).map {
                Segment(start: $0 * 10, end: $0 * 10 + 10, durable: $0 * 10)
            }
        case "overlapping segments":
            state.segments = [Segment(start: 0, end: 600, durable: 0), Segment(start: 500, end: total, durable: 500)]
        case "open segment beside others":
            state.validators.totalLength = nil
            state.segments = [Segment(start: 0, end: nil, durable: 0), Segment(start: 500, end: 1000, durable: 500)]
        case "open segment with a length": state.segments = [Segment(start: 0, end: nil, durable: 0)]
        case "segment past the length": state.segments = [Segment(start: 0, end: total + 1, durable: 0)]
        case "durable before start":
            state.segments = [Segment(start: 0, end: 500, durable: 0), Segment(start: 500, end: total, durable: 499)]
        case "durable past end": state.segments = [Segment(start: 0, end: 500, durable: 501)]
        case "negative start": state.segments = [Segment(start: -1, end: total, durable: 0)]
        case "piece size not a power of two": state.pieceSize = 3 << 20
        case "piece size too small": state.pieceSize = PieceLayout.minimumPieceSize / 2
        case "too many pieces": state.pieces = [1, 2, 3, 4]  // 3 MB in 1 MiB pieces is 3 pieces
        default:
            state.validators.totalLength = nil
            state.segments = [Segment(start: 0, end: nil, durable: 0)]
            state.pieces = [1]
        }
        #expect(state.problem() != nil)
        try StateFile.write(state, to: path)
        let error = #expect(throws: DownloadError.self) { try StateFile.read(path) }
        #expect(error?.code == .unusableState)
        #expect(error?.message.contains(path) == true)
        #expect(error?.message.contains("corrupt (\(state.problem() ?? "-"))") == true, "\(error?.message ?? "")")
    }

    @Test func oversizedStateIsUnusable() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        try writeFile(path, [UInt8](repeating: 0x20, count: StateFile.maximumSize + 1))
        let error = #expect(throws: DownloadError.self) { try StateFile.read(path) }
        #expect(error?.code == .unusableState)
        #expect(error?.message.contains("too large") == true)
    }

    // MARK: LiveRecord

    @Test func liveRecordTrustsOnlyItsOwnNonce() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch-live"
        #expect(LiveRecord.size == (4 + 256) * 8)
        #expect(LiveRecord.read(at: path, nonce: 7) == nil)
        let last = LiveRecord.slotCount - 1
        do {
            let record = try LiveRecord(creatingAt: path, nonce: 7, written: [10, 20])
            #expect(LiveRecord.read(at: path, nonce: 7) == Self.slots([10, 20]))
            record.store(slot: 0, written: 123_456_789)
            record.store(slot: last, written: 42)
            #expect(record.load(slot: 0) == 123_456_789 && record.load(slot: 1) == 20 && record.load(slot: last) == 42)
            // Seen by another reader at once: the page cache is shared, no sync needed within a boot.
            var expected = Self.slots([123_456_789, 20])
            expected[last] = 42
            #expect(LiveRecord.read(at: path, nonce: 7) == expected)
            #expect(LiveRecord.read(at: path, nonce: 8) == nil)
            record.reset(nonce: 9, written: [5])
            #expect(LiveRecord.read(at: path, nonce: 7) == nil)
            // A new generation starts clean: every slot past the given ones is zero again.
            #expect(LiveRecord.read(at: path, nonce: 9) == Self.slots([5]))
            #expect(record.load(slot: 1) == 0 && record.load(slot: last) == 0)
        }
        // Still readable after the mapping is gone (a crashed process).
        #expect(LiveRecord.read(at: path, nonce: 9) == Self.slots([5]))
        #expect(try readFile(path).count == LiveRecord.size)
    }

    /// A damaged live record never raises trust above the state file: a broken header makes it unreadable, and a
    /// slot holding an impossible (negative) value is never more than a durable extent.
    @Test(arguments: [
        "truncated", "zeros", "bad magic", "bad version", "bad slot count", "format 1 record", "huge value",
    ])
    func damagedLiveRecordIsIgnored(_ damage: String) throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 400_000, seed: 6)
        try writeFile(paths.part, data)
        let state = makeState(durable: 100_000, total: 1_000_000)
        try StateFile.write(state, to: paths.state)
        _ = try LiveRecord(creatingAt: paths.live, nonce: state.nonce, written: [300_000])
        #expect(LiveRecord.read(at: paths.live, nonce: state.nonce) == Self.slots([300_000]))
        var bytes = try readFile(paths.live)
        switch damage {
        case "truncated": bytes.removeLast(1)
        case "zeros": bytes = [UInt8](repeating: 0, count: LiveRecord.size)
        case "bad magic": bytes[0] ^= 0xFF
        case "bad version": bytes[8] = 1  // the previous format's version
        case "bad slot count": bytes[24] ^= 0x01
        case "format 1 record":
            // magic | version 1 | nonce | written: what the previous format wrote.
            let words: [UInt64] = [LiveRecord.magic, 1, state.nonce, 300_000]
            bytes = words.flatMap { word in (0..<8).map { UInt8(truncatingIfNeeded: word >> (8 * $0)) } }
        default: bytes[32 + 7] = 0x80  // slot 0 > Int64.max as unsigned: a negative offset
        }
        try writeFile(paths.live, bytes)
        if damage != "huge value" {
            #expect(LiveRecord.read(at: paths.live, nonce: state.nonce) == nil)
        }
        let (store, point) = try PartStore.reopen(paths: paths, state: state)
        #expect(point.bytes == 100_000 && point.prefix == 100_000)
        #expect(store.written(0) == 100_000)
        #expect(try StateFile.read(paths.state)?.segments == [Segment(start: 0, end: 1_000_000, durable: 100_000)])
    }

    // MARK: PartStore.reopen

    struct ReopenCase: Sendable, CustomTestStringConvertible {
        var name: String
        var partSize: Int
        var durable: Int64
        var total: Int64? = 1_000_000
        var sameBoot = true
        /// The live record's extent, or nil for no live record.
        var live: Int64?
        var liveNonceMatches = true
        var expected: Int64
        var expectNote = false
        var testDescription: String { name }
    }

    static let reopenCases: [ReopenCase] = [
        ReopenCase(name: "same boot: live record ahead", partSize: 400_000, durable: 100_000, live: 300_000,
            expected: 300_000),
        ReopenCase(name: "same boot: live record behind durable", partSize: 400_000, durable: 100_000,
            live: 50_000, expected: 100_000),
        ReopenCase(name: "same boot: no live record", partSize: 400_000, durable: 100_000, live: nil,
            expected: 100_000),
        ReopenCase(name: "same boot: live record of another generation", partSize: 400_000, durable: 100_000,
            live: 300_000, liveNonceMatches: false, expected: 100_000),
        ReopenCase(name: "same boot: live record beyond the part", partSize: 200_000, durable: 100_000,
            live: 300_000, expected: 200_000),
        ReopenCase(name: "same boot: live record beyond the length", partSize: 1_200_000, durable: 100_000,
            live: 1_100_000, expected: 1_000_000),
        ReopenCase(name: "other boot: durable only", partSize: 400_000, durable: 100_000, sameBoot: false,
            live: 300_000, expected: 100_000, expectNote: true),
        ReopenCase(name: "other boot: nothing beyond durable", partSize: 100_000, durable: 100_000,
            sameBoot: false, live: 100_000, expected: 100_000),
        ReopenCase(name: "part shorter than durable", partSize: 50_000, durable: 100_000, live: 300_000,
            expected: 0, expectNote: true),
        ReopenCase(name: "part missing", partSize: -1, durable: 100_000, live: 100_000, expected: 0,
            expectNote: true),
        ReopenCase(name: "unknown length", partSize: 400_000, durable: 100_000, total: nil, live: 300_000,
            expected: 300_000),
        ReopenCase(name: "unknown length, other boot", partSize: 400_000, durable: 100_000, total: nil,
            sameBoot: false, live: 300_000, expected: 100_000, expectNote: true),
    ]

    @Test(arguments: reopenCases)
    func reopenTrusts(_ c: ReopenCase) throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: max(0, c.partSize), seed: 5)
        if c.partSize >= 0 { try writeFile(paths.part, data) }
        var state = makeState(durable: c.durable, total: c.total)
        if !c.sameBoot {
            state.bootID = "another-boot"
            // The proofs its last checkpoint wrote: after the reboot they are read back and hold.
            state = Self.proven(state, data)
        }
        try StateFile.write(state, to: paths.state)
        if let live = c.live {
            _ = try LiveRecord(creatingAt: paths.live, nonce: c.liveNonceMatches ? state.nonce : state.nonce &+ 1,
                written: [live])
        }

        let (store, point) = try PartStore.reopen(paths: paths, state: state)
        #expect(point.bytes == c.expected)
        #expect(point.prefix == c.expected)
        #expect((point.note != nil) == c.expectNote, "\(point.note ?? "no note")")
        #expect(store.written(0) == c.expected)
        #expect(store.writtenBytes == c.expected)
        #expect(store.durable.load(ordering: .relaxed) == c.expected)
        let trusted = [Segment(start: 0, end: c.total, durable: c.expected)]
        #expect(store.writtenSegments == trusted)
        if c.total == nil {
            // With no known length the file ends where the data ends: the untrusted tail is gone, the trusted
            // prefix untouched.
            #expect(try readFile(paths.part) == Array(data.prefix(Int(c.expected))))
        } else {
            // With a known length nothing is cut: untrusted bytes are fetched again over themselves, so the
            // file (and with it the trusted prefix) is untouched.
            #expect(try readFile(paths.part) == data)
        }
        // The state now vouches for exactly the trusted bytes, in this boot, durably.
        let saved = try #require(try StateFile.read(paths.state))
        #expect(saved.bootID == BootID.current)
        #expect(saved.segments == trusted)
        #expect(saved.durableBytes == c.expected && saved.durablePrefix == c.expected)
        #expect(saved.liveNonce == state.liveNonce)
        #expect(LiveRecord.read(at: paths.live, nonce: state.nonce) == Self.slots([c.expected]))
    }

    /// Each segment is trusted on its own: its live slot within the same boot (never past its end or the part
    /// file), only its durable extent after a reboot; a part file shorter than any durable extent restarts all.
    @Test(arguments: ["same boot", "same boot, clamped", "other boot", "part shorter than a segment"])
    func reopenTrustsEachSegment(_ name: String) throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let total: Int64 = 3_000_000
        // Slot order is not offset order: slot 2 was split off slot 1 (or 0) after slot 1 was.
        var state = makeState(
            segments: [
                Segment(start: 0, end: 1_000_000, durable: 400_000),
                Segment(start: 2_000_000, end: 3_000_000, durable: 2_100_000),
                Segment(start: 1_000_000, end: 2_000_000, durable: 1_500_000),
            ], total: total)
        state.pieces = [nil, 0xC0FFEE, nil]
        var live: [Int64] = [700_000, 2_900_000, 1_200_000]  // two ahead of durable, one behind
        var partSize = Int(total)
        let expected: [Segment]
        var expectedPieces = state.pieces
        var note: String?
        switch name {
        case "same boot":
            expected = [
                Segment(start: 0, end: 1_000_000, durable: 700_000),
                Segment(start: 2_000_000, end: 3_000_000, durable: 2_900_000),
                Segment(start: 1_000_000, end: 2_000_000, durable: 1_500_000),
            ]
        case "same boot, clamped":
            live[0] = 1_100_000  // past its segment's end
            partSize = 2_800_000  // slot 1's live extent is past the end of the file
            expected = [
                Segment(start: 0, end: 1_000_000, durable: 1_000_000),
                Segment(start: 2_000_000, end: 3_000_000, durable: 2_800_000),
                Segment(start: 1_000_000, end: 2_000_000, durable: 1_500_000),
            ]
        case "other boot":
            state.bootID = "another-boot"
            expected = state.segments
            note = "restarted"
        default:
            partSize = 2_050_000  // short of slot 1's durable 2 100 000
            expected = [Segment(start: 0, end: total, durable: 0)]
            expectedPieces = []
            note = "starting over"
        }
        let data = ServedFile.randomBytes(count: partSize, seed: 11)
        if name == "other boot" {
            // After a reboot reopen re-checks every recorded piece before it writes: piece 1's checksum must hold.
            var crc = CRC32C()
            Array(data[(1 << 20)..<(2 << 20)]).withUnsafeBytes { crc.update($0) }
            state.pieces[1] = crc.value
            // And the proofs of the durable bytes no recorded piece covers.
            state = Self.proven(state, data)
            expectedPieces = state.pieces
        }
        if name == "same boot, clamped" {
            // Piece 0 is now all durable (its two segments' parts): its checksum is recorded, from the bytes.
            expectedPieces[0] = CRC32C.checksum(Array(data[0..<(1 << 20)]))
        }
        try writeFile(paths.part, data)
        try StateFile.write(state, to: paths.state)
        _ = try LiveRecord(creatingAt: paths.live, nonce: state.nonce, written: live)

        let (store, point) = try PartStore.reopen(paths: paths, state: state)
        var reference = state
        reference.segments = expected
        #expect(point.bytes == reference.durableBytes)
        #expect(point.prefix == reference.durablePrefix)
        if let note {
            #expect(point.note?.contains(note) == true, "\(point.note ?? "no note")")
        } else {
            #expect(point.note == nil, "\(point.note ?? "")")
        }
        for (slot, segment) in expected.enumerated() { #expect(store.written(slot) == segment.durable, "slot \(slot)") }
        #expect(store.written(expected.count) == 0)
        #expect(store.writtenSegments == expected)
        #expect(store.durable.load(ordering: .relaxed) == reference.durableBytes)
        #expect(try readFile(paths.part) == data)  // a known length: nothing is cut

        let saved = try #require(try StateFile.read(paths.state))
        #expect(saved.bootID == BootID.current)
        #expect(saved.segments == expected)
        #expect(saved.pieces == expectedPieces)
        #expect(saved.liveNonce == state.liveNonce)
        #expect(LiveRecord.read(at: paths.live, nonce: state.nonce) == Self.slots(expected.map(\.durable)))

        // The figures for the cases, worked out by hand.
        switch name {
        case "same boot": #expect(point.bytes == 700_000 + 900_000 + 500_000 && point.prefix == 700_000)
        case "same boot, clamped": #expect(point.bytes == 1_000_000 + 800_000 + 500_000 && point.prefix == 1_500_000)
        case "other boot": #expect(point.bytes == 400_000 + 100_000 + 500_000 && point.prefix == 400_000)
        default: #expect(point.bytes == 0 && point.prefix == 0)
        }
    }

    // MARK: Splitting a segment

    /// A new part file `file.bin` in `dir` for a file of `total` bytes, nothing written.
    func newStore(in dir: TemporaryDirectory, total: Int64) throws -> PartStore {
        try PartStore.create(
            paths: DownloadPaths(destination: dir.path + "/file.bin"), url: "http://x/file.bin", headers: [],
            checksum: nil, validators: makeState(durable: 0, total: total).validators)
    }

    /// A checkpoint held in its data sync (a slow disk) does not hold up a split, which the engine makes under
    /// its lanes' lock; the checkpoint then takes the split in: it records what it had synced in the victim's
    /// shortened segment and keeps the new one, which the next checkpoint writes. (Before, the checkpoint held the
    /// state lock through its syncs, and the split, with every lane behind it, waited for the disk.)
    @Test func aSplitDoesNotWaitForACheckpointsSync() async throws {
        let dir = try TemporaryDirectory()
        let total: Int64 = 4_000_000
        let data = ServedFile.randomBytes(count: Int(total), seed: 13)
        let store = try newStore(in: dir, total: total)
        let paths = store.paths
        try write(store, data, 0..<500_000)
        let inSync = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        store.beforeCheckpointSync.withLock {
            $0 = {
                inSync.signal()
                release.wait()
            }
        }
        // On threads of their own: both block (the checkpoint in its sync; the split, before the fix, on the lock).
        let checkpointed = Locked<Result<Void, DownloadError>?>(nil)
        let checkpointDone = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let result = Result { () throws(DownloadError) in try store.checkpoint() }
            checkpointed.withLock { $0 = result }
            checkpointDone.signal()
        }
        #expect(await blocking { inSync.wait(timeout: .now() + 60) == .success }, "the checkpoint never synced")
        let slot = Locked<Int?>(nil)
        let splitDone = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let made = store.split(0, at: 2_000_000)
            slot.withLock { $0 = made }
            splitDone.signal()
        }
        // A bound, not a pace: with the state lock held through the sync, the split waits until the release below.
        let splitReturned = await blocking { splitDone.wait(timeout: .now() + 60) == .success }
        #expect(splitReturned, "the split waited for the checkpoint's sync")
        release.signal()
        store.beforeCheckpointSync.withLock { $0 = nil }
        #expect(await blocking { checkpointDone.wait(timeout: .now() + 60) == .success })
        if !splitReturned { _ = await blocking { splitDone.wait(timeout: .now() + 60) } }
        try checkpointed.withLock { $0 }?.get()
        #expect(slot.withLock { $0 } == 1)
        let segments = [
            Segment(start: 0, end: 2_000_000, durable: 500_000),
            Segment(start: 2_000_000, end: total, durable: 2_000_000),
        ]
        #expect(store.snapshot.segments == segments)
        #expect(store.durable.load(ordering: .relaxed) == 500_000)
        // On disk the segment as it was when the checkpoint read it; the next checkpoint writes the split.
        #expect(try StateFile.read(paths.state)?.segments == [Segment(start: 0, end: total, durable: 500_000)])
        try write(store, data, 2_000_000..<2_100_000, slot: 1)
        try store.checkpoint()
        #expect(try StateFile.read(paths.state)?.segments == [
            Segment(start: 0, end: 2_000_000, durable: 500_000),
            Segment(start: 2_000_000, end: total, durable: 2_100_000),
        ])
    }

    /// `split` changes only memory: until a checkpoint the state file keeps the victim's longer segment, whose
    /// written extent stays short of the split point, and the new slot is beyond the state's list. A crash then
    /// trusts the victim up to what it wrote and none of the new segment; after a checkpoint both are recorded.
    @Test func splitIsSafeBeforeAndAfterACheckpoint() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let total: Int64 = 4_000_000
        let data = ServedFile.randomBytes(count: Int(total), seed: 12)
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: total).validators)
        try write(store!, data, 0..<500_000)
        try store!.checkpoint()
        let stateBeforeSplit = try readFile(paths.state)

        // Refused: at or below what the victim has written, at or past its end, of a slot with nothing to split.
        #expect(store!.split(0, at: 500_000) == nil)
        #expect(store!.split(0, at: 100) == nil)
        #expect(store!.split(0, at: total) == nil)
        #expect(store!.split(0, at: total + 1) == nil)
        let slot = try #require(store!.split(0, at: 2_000_000))
        #expect(slot == 1)
        #expect(store!.end(0) == 2_000_000 && store!.end(1) == total)
        #expect(store!.written(1) == 2_000_000)
        let afterSplit = [
            Segment(start: 0, end: 2_000_000, durable: 500_000),
            Segment(start: 2_000_000, end: total, durable: 2_000_000),
        ]
        #expect(store!.writtenSegments == afterSplit)
        #expect(store!.snapshot.segments == afterSplit)
        #expect(store!.split(0, at: 2_000_000) == nil)  // now its end

        try write(store!, data, 500_000..<900_000, slot: 0)
        try write(store!, data, 2_000_000..<2_600_000, slot: 1)
        #expect(store!.writtenBytes == 900_000 + 600_000)
        #expect(store!.durable.load(ordering: .relaxed) == 500_000)
        // No checkpoint since the split: the state file is as it was before it.
        #expect(try readFile(paths.state) == stateBeforeSplit)
        store = nil  // the process dies

        try writeFile(paths.state, stateBeforeSplit)  // (unchanged: restored only to make the premise explicit)
        let onDisk = try #require(try StateFile.read(paths.state))
        #expect(onDisk.segments == [Segment(start: 0, end: total, durable: 500_000)])
        let checkpointed: DownloadState
        do {
            let (reopened, point) = try PartStore.reopen(paths: paths, state: onDisk)
            // The victim's slot up to its written extent (short of the split point); the new slot is ignored.
            #expect(point.bytes == 900_000 && point.prefix == 900_000)
            #expect(point.note == nil)
            let trusted = [Segment(start: 0, end: total, durable: 900_000)]
            #expect(reopened.snapshot.segments == trusted)
            #expect(try StateFile.read(paths.state)?.segments == trusted)
            #expect(LiveRecord.read(at: paths.live, nonce: onDisk.nonce) == Self.slots([900_000]))
            #expect(reopened.written(1) == 0)
            let part = try readFile(paths.part)
            #expect(part.count == 2_600_000)  // nothing cut: the new segment's bytes are fetched again over themselves
            #expect(Array(part.prefix(900_000)) == Array(data.prefix(900_000)))

            // Split again, write both, checkpoint: both segments are in the state file.
            #expect(reopened.split(0, at: 2_000_000) == 1)
            try write(reopened, data, 900_000..<1_000_000, slot: 0)
            try write(reopened, data, 2_000_000..<2_600_000, slot: 1)
            try reopened.checkpoint()
            checkpointed = try #require(try StateFile.read(paths.state))
            let both = [
                Segment(start: 0, end: 2_000_000, durable: 1_000_000),
                Segment(start: 2_000_000, end: total, durable: 2_600_000),
            ]
            #expect(checkpointed.segments == both)
            #expect(checkpointed.durableBytes == 1_000_000 + 600_000 && checkpointed.durablePrefix == 1_000_000)
            #expect(reopened.durable.load(ordering: .relaxed) == 1_600_000)

            // More in both, then a crash.
            try write(reopened, data, 1_000_000..<1_200_000, slot: 0)
            try write(reopened, data, 2_600_000..<3_000_000, slot: 1)
        }
        do {
            // The same boot trusts both slots' written extents.
            let (again, sameBoot) = try PartStore.reopen(paths: paths, state: checkpointed)
            #expect(sameBoot.bytes == 1_200_000 + 1_000_000 && sameBoot.prefix == 1_200_000)
            let written = [
                Segment(start: 0, end: 2_000_000, durable: 1_200_000),
                Segment(start: 2_000_000, end: total, durable: 3_000_000),
            ]
            #expect(again.snapshot.segments == written)
            #expect(LiveRecord.read(at: paths.live, nonce: onDisk.nonce) == Self.slots([1_200_000, 3_000_000]))
        }

        // A reboot after the checkpoint instead: both segments at their checkpointed extents.
        var rebooted = checkpointed
        rebooted.bootID = "before-the-reboot"
        try StateFile.write(rebooted, to: paths.state)
        let (_, afterReboot) = try PartStore.reopen(paths: paths, state: rebooted)
        #expect(afterReboot.bytes == 1_600_000 && afterReboot.prefix == 1_000_000)
        #expect(afterReboot.note != nil)
        #expect(try StateFile.read(paths.state)?.segments == checkpointed.segments)
    }

    /// Every split takes a new slot; when all are taken a split is refused, and the full list is a valid state.
    @Test func splitStopsAtTheLastSlot() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let total: Int64 = 4_000_000
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: total).validators)
        for slot in 1..<LiveRecord.slotCount {
            #expect(store.split(slot - 1, at: Int64(slot) * 1000) == slot)
        }
        #expect(store.split(LiveRecord.slotCount - 1, at: total - 1) == nil)
        #expect(store.end(LiveRecord.slotCount - 1) == total)
        try store.checkpoint(force: true)
        let saved = try #require(try StateFile.read(paths.state))
        #expect(saved.segments.count == LiveRecord.slotCount)
        #expect(saved.durableBytes == 0)

        // A segment of unknown end cannot be split.
        let other = DownloadPaths(destination: dir.path + "/open.bin")
        let open = try PartStore.create(
            paths: other, url: "http://x/open.bin", headers: [], checksum: nil, validators: .none)
        #expect(open.split(0, at: 1000) == nil)
        #expect(open.end(0) == nil)
    }

    /// A writer claims its chunk (up to the segment's end) before it writes it: claimed bytes are never split off,
    /// and a claim after a split stops at the new end.
    @Test func aClaimedChunkIsNeverSplitOff() throws {
        let dir = try TemporaryDirectory()
        let total: Int64 = 1_000_000
        let data = ServedFile.randomBytes(count: Int(total), seed: 13)
        let store = try newStore(in: dir, total: total)
        try write(store, data, 0..<100_000)
        #expect(store.claim(0, upTo: 116_384) == total)
        #expect(store.split(0, at: 110_000) == nil, "inside the claimed chunk")
        #expect(store.end(0) == total)
        #expect(store.split(0, at: 116_384) == 1, "at the claim's end")
        try write(store, data, 100_000..<116_384)
        // Split first: the next claim sees the new end, and the write stops there.
        #expect(store.split(1, at: 200_000) == 2)
        #expect(store.claim(1, upTo: 216_384) == 200_000)
        #expect(store.writtenSegments.map(\.end) == [116_384, 200_000, total])
    }

    /// One writer in chunks, moving to the segment that starts where its own ended (as a thief's lane does), and a
    /// splitter cutting the writer's segment just ahead of it as fast as it can, over several rounds: every byte is
    /// written once, no segment is written past its end, and the file is the data.
    @Test func splitsRacingAWriterNeverMakeItWriteAByteTwice() throws {
        let dir = try TemporaryDirectory()
        let total: Int64 = 2 << 20
        let chunk: Int64 = 4 << 10
        let data = ServedFile.randomBytes(count: Int(total), seed: 14)
        final class Shared: Sendable {
            let slot = Atomic<Int>(0)
            let done = Atomic<Bool>(false)
            let splits = Atomic<Int>(0)
        }
        var splits = 0
        for round in 0..<16 {
            let paths = DownloadPaths(destination: dir.path + "/file\(round).bin")
            let store = try PartStore.create(
                paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
                validators: makeState(durable: 0, total: total).validators)
            let shared = Shared()
            let splitter = DispatchGroup()
            DispatchQueue.global().async(group: splitter) {
                while !shared.done.load(ordering: .acquiring) {
                    let slot = shared.slot.load(ordering: .acquiring)
                    let written = store.written(slot)
                    guard let end = store.end(slot), end - written > 2 else { continue }
                    if store.split(slot, at: written + Int64.random(in: 1...min(chunk, end - written - 1))) != nil {
                        shared.splits.add(1, ordering: .relaxed)
                    }
                }
            }
            while shared.splits.load(ordering: .acquiring) == 0 {}  // the splitter is running
            var slot = 0
            var offset: Int64 = 0
            var counted: Int64 = 0
            var lost = false
            while offset < total {
                let want = min(chunk, total - offset)
                guard let end = store.claim(slot, upTo: offset + want) else { break }
                let count = min(want, end - offset)
                guard count > 0 else {
                    // This segment is done: on to the one a split made from its end.
                    let segments = store.writtenSegments
                    guard let next = segments.indices.first(where: { segments[$0].start == offset }) else {
                        lost = true
                        break
                    }
                    slot = next
                    shared.slot.store(slot, ordering: .releasing)
                    continue
                }
                try write(store, data, Int(offset)..<Int(offset + count), slot: slot)
                offset += count
                counted += count
            }
            shared.done.store(true, ordering: .releasing)
            splitter.wait()
            splits += shared.splits.load(ordering: .relaxed)
            #expect(!lost, "round \(round): the writer passed a segment's end at \(offset)")
            #expect(counted == total, "round \(round)")
            let segments = store.writtenSegments
            #expect(segments.allSatisfy { $0.durable == $0.end }, "round \(round): \(segments)")
            let same = try readFile(paths.part) == data
            #expect(same, "round \(round)")
        }
        #expect(splits >= 16)
        print("PartStoreTests.splitsRacingAWriter: \(splits) splits over 16 rounds")
    }

    // MARK: Checkpoints and restarts

    /// Bytes written but not checkpointed are trusted after a process crash (live record) and not after a reboot.
    @Test func crashBetweenCheckpoints() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        // Above the small-file limit, so the store has a state file and live record from the start.
        let total = Int(PartStore.smallFileLimit) + 400_000
        let data = ServedFile.randomBytes(count: total, seed: 9)
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: Int64(total)).validators)
        #expect(fileExists(paths.state) && fileExists(paths.live))
        try write(store!, data, 0..<300_000)
        try store!.checkpoint()
        #expect(
            try StateFile.read(paths.state)?.segments == [Segment(start: 0, end: Int64(total), durable: 300_000)])
        try write(store!, data, 300_000..<350_000)  // never checkpointed
        store = nil  // the process dies

        let state = try #require(try StateFile.read(paths.state))
        #expect(state.segments == [Segment(start: 0, end: Int64(total), durable: 300_000)])

        // Same boot: the live record vouches for 350 000.
        let sameBoot = try PartStore.reopen(paths: paths, state: state).1
        #expect(sameBoot.bytes == 350_000 && sameBoot.prefix == 350_000)

        // A reboot instead (simulated: another boot id in the state written before the crash).
        var rebooted = state
        rebooted.bootID = "before-the-reboot"
        try StateFile.write(rebooted, to: paths.state)
        try writeFile(paths.part, Array(data[0..<350_000]))
        let (afterRebootStore, afterReboot) = try PartStore.reopen(paths: paths, state: rebooted)
        #expect(afterReboot.bytes == 300_000 && afterReboot.prefix == 300_000)
        #expect(afterReboot.note != nil)
        #expect(afterRebootStore.written(0) == 300_000)
        // Only 300 000 are vouched for, durably; the rest stays in the file, to be fetched again over itself.
        #expect(
            try StateFile.read(paths.state)?.segments == [Segment(start: 0, end: Int64(total), durable: 300_000)])
        #expect(LiveRecord.read(at: paths.live, nonce: state.nonce) == Self.slots([300_000]))
        #expect(try readFile(paths.part) == Array(data[0..<350_000]))
    }

    /// A store that goes away releases its lock even while another copy of its descriptor is open — as in a
    /// child being spawned by another thread between its fork and its exec (the cause of a flaky
    /// "being downloaded by another stitch run" in this suite under load).
    @Test func releasedStoreUnlocksDespiteACopiedDescriptor() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let total = Int(PartStore.smallFileLimit) + 400_000
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: Int64(total)).validators)
        try store!.checkpoint(force: true)
        let copy = dup(store!.fd)  // what a forked child holds until it execs
        #expect(copy >= 0)
        defer { close(copy) }
        store = nil
        let state = try #require(try StateFile.read(paths.state))
        let reopened = try PartStore.reopen(paths: paths, state: state)
        #expect(reopened.1.bytes == 0)
    }

    /// A file up to the small-file limit starts with only its part file: no state file, no live record (stale
    /// ones from an earlier run are removed). Its first checkpoint writes the state file with what is durable; a
    /// crash after it resumes from there (no live record: only the durable extent); finishing leaves only the file.
    @Test func smallFileHasNoStateUntilItsFirstCheckpoint() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/small.bin")
        let total = Int(PartStore.smallFileLimit)
        let data = ServedFile.randomBytes(count: total, seed: 21)
        try writeFile(paths.state, Array("stale".utf8))
        try writeFile(paths.live, Array("stale".utf8))
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/small.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: Int64(total)).validators)
        #expect(fileExists(paths.part))
        #expect(!fileExists(paths.state) && !fileExists(paths.live), "a small download starts with its part only")
        try write(store!, data, 0..<200_000)
        #expect(store!.written(0) == 200_000)
        #expect(!fileExists(paths.state), "nothing is claimed before a checkpoint")
        try store!.checkpoint()
        let state = try #require(try StateFile.read(paths.state))
        #expect(state.segments == [Segment(start: 0, end: Int64(total), durable: 200_000)])
        try write(store!, data, 200_000..<300_000)  // never checkpointed
        store = nil  // the process dies

        // The written record was in memory only: the durable extent is what counts.
        let (reopened, point) = try PartStore.reopen(paths: paths, state: state)
        #expect(point.bytes == 200_000)
        try write(reopened, data, 200_000..<total)
        try reopened.finish(url: "http://x/small.bin", length: Int64(total))
        #expect(try readFile(paths.destination) == data)
        #expect(!fileExists(paths.part) && !fileExists(paths.state) && !fileExists(paths.live))
    }

    /// Finished before any checkpoint: the file appears, and no state file or live record was ever created.
    @Test func smallFileFinishedBeforeACheckpointLeavesOnlyTheFile() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/tiny.bin")
        let data = ServedFile.randomBytes(count: 100_000, seed: 22)
        let store = try PartStore.create(
            paths: paths, url: "http://x/tiny.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 100_000).validators)
        try write(store, data, 0..<100_000)
        try store.finish(url: "http://x/tiny.bin", length: 100_000)
        #expect(try readFile(paths.destination) == data)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path) == ["tiny.bin"])
    }

    /// A small download created at a path its choice found vacant takes the empty part file without looking for
    /// leftovers beside it; they are removed before its first state write. Until then nothing reads them: a kill
    /// leaves a part file without a state (the next run starts over); after it no previous generation of another
    /// download stands in for this state, damaged.
    @Test func aVacantSmallDownloadRemovesLeftoversBeforeItsFirstState() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/vacant.bin")
        let total = 300_000
        let data = ServedFile.randomBytes(count: total, seed: 23)
        let validators = makeState(durable: 0, total: Int64(total)).validators
        // Left by another download of this name (no state file, no part file: the path is vacant): a previous
        // generation that proves 200,000 bytes of other data, a temporary and a live record.
        let stale = Self.proven(makeState(durable: 200_000, total: Int64(total)), ServedFile.randomBytes(count: total, seed: 24))
        try StateFile.write(stale, to: paths.previousState)
        try writeFile(paths.state + ".tmp", Array("stale".utf8))
        try writeFile(paths.state + ".lnk", Array("stale".utf8))
        try writeFile(paths.live, Array("stale".utf8))
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/vacant.bin", headers: [], checksum: nil, validators: validators, vacant: true)
        #expect(fileExists(paths.previousState), "looked for at the creation (the lookups vacant spares)")
        try write(store!, data, 0..<150_000)
        guard case .none = PartialDownload(paths).saved else { Issue.record("a state appeared"); return }
        try store!.checkpoint(force: true)
        for leftover in [paths.previousState, paths.state + ".tmp", paths.state + ".lnk", paths.live] {
            #expect(!fileExists(leftover), "\(leftover) kept beside the first state")
        }
        let state = try #require(try StateFile.read(paths.state))
        #expect(state.durableBytes == 150_000)
        store = nil
        // The state damaged now: nothing stands in for it.
        try writeFile(paths.state, Array("garbage".utf8))
        guard case .unusable(_, let previous) = PartialDownload(paths).saved else { Issue.record("not unusable"); return }
        #expect(previous == nil)
    }

    /// What another process did between the lookups that found the path vacant and the part file's lock is seen
    /// under the lock, and ends the call with "run again", touching none of it: a state file it left beside an
    /// empty part file, a part file with bytes, a file it finished at the destination (the empty part file the
    /// call made beside that one is removed).
    @Test func aVacantChoiceIsCheckedAgainUnderTheLock() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/late.bin")
        let validators = makeState(durable: 0, total: 100_000).validators
        func create() throws(DownloadError) -> PartStore {
            try PartStore.create(
                paths: paths, url: "http://x/late.bin", headers: [], checksum: nil, validators: validators, vacant: true)
        }
        func expectRunAgain(_ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
            let error = #expect(throws: DownloadError.self, sourceLocation: sourceLocation) { _ = try create() }
            #expect(
                error?.isResumable == true && error?.message.contains("run again") == true,
                "\(what): \(String(describing: error))", sourceLocation: sourceLocation)
        }
        // A run of another process made its state and stopped before any data.
        #expect(FileManager.default.createFile(atPath: paths.part, contents: Data()))
        let other = makeState(durable: 0, total: 5 << 20)
        try StateFile.write(other, to: paths.state)
        try writeFile(paths.live, Array("other".utf8))
        expectRunAgain("a state file")
        #expect(try StateFile.read(paths.state) == other && fileExists(paths.live) && fileExists(paths.part))
        unlink(paths.state)
        unlink(paths.live)

        // A part file with bytes (no state: a small download of another process, stopped).
        try writeFile(paths.part, Array(repeating: 7, count: 4096))
        expectRunAgain("a part file with bytes")
        #expect(try readFile(paths.part) == Array(repeating: 7, count: 4096))
        unlink(paths.part)

        // Another process finished the file there.
        try writeFile(paths.destination, Array("finished elsewhere".utf8))
        expectRunAgain("a finished file")
        #expect(try readFile(paths.destination) == Array("finished elsewhere".utf8))
        #expect(!fileExists(paths.part), "an empty part file left beside the finished file")
        unlink(paths.destination)

        // Nothing there: taken.
        let store = try create()
        #expect(fileExists(paths.part) && !fileExists(paths.state))
        _ = store
    }

    /// Directory syncs are shared: many threads finishing in one folder all return, with at most one sync each
    /// (and, run one after another, exactly one each: a sync covers only renames made before it started).
    @Test func directorySyncsAreSharedBetweenConcurrentCallers() async throws {
        let dir = try TemporaryDirectory()
        let sync = DirectorySync()
        for _ in 0..<3 { try sync.sync(dir.path) }
        #expect(sync.syncCount.load(ordering: .relaxed) == 3)
        let callers = 32
        let path = dir.path
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<callers {
                group.addTask { try await offloaded { () throws(DownloadError) in try sync.sync(path) } }
            }
            try await group.waitForAll()
        }
        let shared = sync.syncCount.load(ordering: .relaxed) - 3
        #expect(shared >= 1 && shared <= callers)
        print("PartStoreTests: \(callers) concurrent directory syncs took \(shared) fsyncs")
        #expect(throws: DownloadError.self) { try sync.sync(dir.path + "/missing") }
    }

    /// The engine's folder syncs wait without a thread and are shared as the blocking ones are: 31 tasks that call while
    /// a sync runs are all covered by the next one (two syncs for 32 callers); each returns only once a sync that
    /// started after its call has finished; a failed sync's error reaches exactly the callers it covered.
    @Test(.timeLimit(.minutes(1))) func suspendedDirectorySyncsAreSharedAndCoverEveryCaller() async throws {
        let folders = FolderSyncs()
        let first = await folders.round(waiters: 31, failing: false)
        #expect(first.count == 32 && !first.contains { $0.failed })
        #expect(folders.sync.syncCount.load(ordering: .relaxed) == 2)
        // The sync covering the ten waiters fails: they fail, the first caller (covered by the held one) does not.
        let second = await folders.round(waiters: 10, failing: true)
        #expect(second.count == 11 && second.filter(\.failed).count == 10)
        #expect(second.first { $0.first }?.failed == false, "the first caller was covered by the held sync, which worked")
        #expect(folders.sync.syncCount.load(ordering: .relaxed) == 4)
        #expect(folders.sync.waiters(FolderSyncs.folder) == 0)
        #expect(folders.syncs.log.withLock { $0.peak } == 1, "two syncs of one folder ran at once")
        // Nothing running: a caller leads at once, and a real folder is synced.
        try await DirectorySync().suspendingSync(FileManager.default.temporaryDirectory.path)
        await #expect(throws: DownloadError.self) { try await DirectorySync().suspendingSync("/nonexistent/folder") }
    }

    /// A caller that found a sync running, but whose folder's sync ended (and left the table) before it could join
    /// the waiters, runs the next sync itself: it neither waits for a sync no one will run nor returns uncovered.
    @Test(.timeLimit(.minutes(1))) func aCallerWhoseSyncEndedBeforeItWaitedLeadsTheNext() async throws {
        let syncs = FolderSyncs.Syncs()
        syncs.log.withLock { $0.held = [1] }
        let between = DispatchSemaphore(value: 0)
        let go = DispatchSemaphore(value: 0)
        let sync = DirectorySync(
            syncing: { _ throws(DownloadError) in try syncs.sync() },
            betweenLooks: {
                between.signal()
                go.wait()
            })
        let folder = FolderSyncs.folder
        let first = Task { try await sync.suspendingSync(folder) }
        while syncs.log.withLock({ $0.started }) < 1 { await Task.yield() }  // the first caller's sync runs, held
        // The second caller runs on a thread of its own, which its stop between the two looks may block.
        let second = Task(executorPreference: OwnThreadExecutor()) { () async throws -> (before: Int, after: Int) in
            let before = syncs.log.withLock { $0.started }
            try await sync.suspendingSync(folder)
            return (before, syncs.log.withLock { $0.finished })
        }
        try await offloaded { () throws(DownloadError) in between.wait() }
        syncs.gate.signal()
        try await first.value  // the held sync ended; its folder left the table
        #expect(sync.waiters(folder) == 0)
        go.signal()
        let (before, after) = try await second.value
        #expect(before == 1 && after == 2, "the second caller returned without a sync that started after its call")
        #expect(sync.syncCount.load(ordering: .relaxed) == 2)
        #expect(syncs.log.withLock { $0.peak } == 1)
    }

    /// `restart` writes the new state (new nonce, nothing durable) before it touches the live record or the part
    /// file, so a crash at any point after it never trusts the previous generation's bytes.
    @Test func restartNeverTrustsTheOldGeneration() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 3_000_000, seed: 3)
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 3_000_000).validators)
        // Two segments, so the restart must also fold them back into one.
        #expect(store!.split(0, at: 2_000_000) == 1)
        try write(store!, data, 0..<200_000)
        try write(store!, data, 2_000_000..<2_100_000, slot: 1)
        try store!.checkpoint()
        let old = try #require(try StateFile.read(paths.state))
        #expect(old.segments.count == 2)
        let oldNonce = old.nonce
        let oldLive = try readFile(paths.live)
        let oldPart = try readFile(paths.part)
        #expect(LiveRecord.read(at: paths.live, nonce: oldNonce) == Self.slots([200_000, 2_100_000]))

        try store!.restart(validators: .none)
        let restarted = try #require(try StateFile.read(paths.state))
        #expect(restarted.segments == [Segment(start: 0, end: nil, durable: 0)])
        #expect(restarted.durableBytes == 0)
        #expect(restarted.pieces.isEmpty)
        #expect(restarted.validators == .none)
        #expect(restarted.nonce != oldNonce)
        #expect(LiveRecord.read(at: paths.live, nonce: oldNonce) == nil)
        #expect(LiveRecord.read(at: paths.live, nonce: restarted.nonce) == Self.slots([0]))
        #expect(try readFile(paths.part).isEmpty)
        #expect(store!.written(0) == 0 && store!.written(1) == 0)
        #expect(store!.writtenSegments == [Segment(start: 0, end: nil, durable: 0)])
        #expect(store!.durable.load(ordering: .relaxed) == 0)
        store = nil

        // A crash right after the new state was renamed into place: live record and part still old.
        try writeFile(paths.live, oldLive)
        try writeFile(paths.part, oldPart)
        let point = try PartStore.reopen(paths: paths, state: restarted).1
        #expect(point.bytes == 0 && point.prefix == 0)
        #expect(try readFile(paths.part).isEmpty)
    }

    /// One partial download, one writer: a second store on the same files is refused before it changes anything,
    /// and leftovers are not removed from under a running download.
    @Test func oneWriterAtATime() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 100_000, seed: 8)
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 100_000).validators)
        try write(store, data, 0..<100_000)
        try store.checkpoint()
        let state = try #require(try StateFile.read(paths.state))

        for attempt in ["reopen", "create", "remove"] {
            let error = #expect(throws: DownloadError.self, "\(attempt)") {
                switch attempt {
                case "reopen": _ = try PartStore.reopen(paths: paths, state: state)
                case "create":
                    _ = try PartStore.create(
                        paths: paths, url: "http://x/", headers: [], checksum: nil, validators: .none)
                default: try PartStore.removeLeftovers(at: paths)
                }
            }
            #expect(error?.code == .io)
            #expect(error?.message.contains("another") == true)
            #expect(try readFile(paths.part) == data)
            #expect(try StateFile.read(paths.state) == state)
        }

        store.unlock()
        let (second, point) = try PartStore.reopen(paths: paths, state: state)
        #expect(point.bytes == 100_000 && point.prefix == 100_000)
        second.unlock()
        try PartStore.removeLeftovers(at: paths)
        #expect(!fileExists(paths.part) && !fileExists(paths.state) && !fileExists(paths.live))
    }

    @Test func createReplacesAStalePart() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        try writeFile(paths.part, [1, 2, 3])
        let store = try PartStore.create(
            paths: paths, url: "http://x/", headers: ["X-A: b"], checksum: "sha-256=00",
            validators: .none)
        #expect(try readFile(paths.part).isEmpty)
        let state = try #require(try StateFile.read(paths.state))
        #expect(state.segments == [Segment(start: 0, end: nil, durable: 0)])
        #expect(state.bootID == BootID.current && state.headers == ["X-A: b"])
        #expect(state.schemaVersion == 3 && state.pieceSize == PieceLayout.minimumPieceSize && state.pieces.isEmpty)
        #expect(state.proofs.isEmpty)
        #expect(LiveRecord.read(at: paths.live, nonce: state.nonce) == Self.slots([0]))
        _ = store
    }

    @Test func finishRenamesAndMarks() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 10_000, seed: 4)
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 10_000).validators)
        try write(store, data, 0..<10_000)
        // Bytes past the end (an untrusted tail left in place by a resume) are cut by finish.
        let tail = [UInt8](repeating: 0xA5, count: 2_000)
        #expect(tail.withUnsafeBytes { store.write($0, at: 10_000) } == nil)
        #expect(fileSize(paths.part) == 12_000)
        try store.finish(url: "http://x/file.bin", length: 10_000)
        #expect(try readFile(paths.destination) == data)
        #expect(!fileExists(paths.part) && !fileExists(paths.state) && !fileExists(paths.live))
        let mark = try #require(CompletionMark.read(at: paths.destination))
        #expect(mark.url == "http://x/file.bin" && mark.length == 10_000 && mark.etag == "\"v1\"")
    }

    /// The one inspection of what is on disk for a destination, as a download leaves it at each stage: nothing;
    /// a partial (its state, a part file another run holds while the store lives); a damaged state with the
    /// previous generation standing in; a finished file, whose mark counts only while its length is the marked one.
    @Test func partialDownloadSeesEachStage() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let nothing = PartialDownload(paths)
        guard case .none = nothing.saved else { Issue.record("\(nothing.saved)"); return }
        #expect(nothing.state == nil && !nothing.destinationExists && !nothing.partExists)
        #expect(!nothing.partIsHeldByAnotherRun && nothing.completion == nil)

        let total = Int(PartStore.smallFileLimit) + 100_000
        let data = ServedFile.randomBytes(count: total, seed: 9)
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: Int64(total)).validators)
        try write(store!, data, 0..<200_000)
        try store!.checkpoint(force: true)
        try write(store!, data, 200_000..<300_000)
        try store!.checkpoint(force: true)  // now a previous generation exists too
        let partial = PartialDownload(paths)
        guard case .state(let state) = partial.saved else { Issue.record("\(partial.saved)"); return }
        #expect(state.durableBytes == 300_000 && partial.state == state)
        #expect(partial.partExists && !partial.destinationExists)
        #expect(partial.partIsHeldByAnotherRun, "the live store holds the part file")
        store = nil
        #expect(!PartialDownload(paths).partIsHeldByAnotherRun)

        try writeFile(paths.state, Array("garbage".utf8))
        let damaged = PartialDownload(paths)
        guard case .unusable(let error, let previous) = damaged.saved else { Issue.record("\(damaged.saved)"); return }
        #expect(error.code == .unusableState)
        #expect(previous?.durableBytes == 200_000 && damaged.state == previous, "the previous generation stands in")

        try PartStore.removeLeftovers(at: paths)
        let finished = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: Int64(total)).validators)
        try write(finished, data, 0..<total)
        try finished.finish(url: "http://x/file.bin", length: Int64(total))
        let done = PartialDownload(paths)
        #expect(done.destinationExists && !done.partExists && done.state == nil)
        #expect(done.completion?.url == "http://x/file.bin" && done.completion?.length == Int64(total))
        // Changed since: the mark no longer describes the file.
        let fd = open(paths.destination, O_WRONLY | O_APPEND | O_CLOEXEC)
        #expect(fd >= 0 && Glibc.write(fd, "x", 1) == 1)
        close(fd)
        #expect(PartialDownload(paths).completion == nil)
    }

    @Test func discardRemovesEverything() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let store = try PartStore.create(
            paths: paths, url: "http://x/", headers: [], checksum: nil, validators: .none)
        try write(store, [1, 2, 3], 0..<3)
        store.discard()
        #expect(!fileExists(paths.part) && !fileExists(paths.state) && !fileExists(paths.live))
        #expect(!fileExists(paths.destination))
    }

    /// A restart whose state write fails (disk full) must not leave the new validators in memory beside the old
    /// bytes: a later checkpoint would record them as a pair and a resume would splice two versions.
    @Test func failedRestartStopsEveryLaterCheckpoint() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 100_000, seed: 8)
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 100_000).validators)
        try write(store, data, 0..<60_000)
        try store.checkpoint()

        // The temporary state file cannot be created while a directory has its name.
        #expect(mkdir(paths.state + ".tmp", 0o755) == 0)
        var changed = makeState(durable: 0, total: 100_000).validators
        changed.etag = "\"v2\""
        #expect(throws: DownloadError.self) { try store.restart(validators: changed) }
        #expect(rmdir(paths.state + ".tmp") == 0)

        #expect(throws: DownloadError.self) { try store.checkpoint(force: true) }
        #expect(throws: DownloadError.self) { try store.update(validators: changed) }
        #expect(throws: DownloadError.self) { try store.finish(url: "http://x/file.bin", length: 60_000) }
        let onDisk = try #require(try StateFile.read(paths.state))
        #expect(onDisk.validators.etag == "\"v1\"")
        #expect(onDisk.segments == [Segment(start: 0, end: 100_000, durable: 60_000)])
        #expect(!fileExists(paths.destination))
    }

    /// Validators learnt from a later response are in the state file before any of that response's bytes can be
    /// vouched for by the live record; a length learnt closes the single open segment.
    @Test func updatedValidatorsAreDurableAtOnce() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil, validators: .none)
        var learnt = makeState(durable: 0, total: 5_000).validators
        learnt.etag = "\"fresh\""
        try store.update(validators: learnt)
        let saved = try #require(try StateFile.read(paths.state))
        #expect(saved.validators == learnt)
        #expect(saved.segments == [Segment(start: 0, end: 5_000, durable: 0)])
        #expect(store.end(0) == 5_000)
    }

    /// The state is read before the lock is taken; if another run changed it in between, reopening refuses
    /// instead of resuming from a stale picture.
    @Test func reopenRefusesAStateChangedUnderIt() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let seen = makeState(durable: 0, total: 1_000)
        try StateFile.write(seen, to: paths.state)
        try writeFile(paths.part, [])
        var changed = seen
        changed.liveNonce = "99"
        try StateFile.write(changed, to: paths.state)
        let error = #expect(throws: DownloadError.self) { try PartStore.reopen(paths: paths, state: seen) }
        #expect(error?.isResumable == true)
    }

    /// A response with another length when nothing was kept (e.g. after a reboot dropped every byte): the file
    /// is laid out anew for the new length, so the state stays readable and the segments tile it.
    @Test func anotherLengthWithNothingKeptRelaysTheFile() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 3 << 20).validators)
        var grown = makeState(durable: 0, total: 5 << 20).validators
        grown.etag = "\"v2\""
        try store.update(validators: grown)
        let state = try #require(try StateFile.read(paths.state))
        #expect(state.segments == [Segment(start: 0, end: 5 << 20, durable: 0)])
        #expect(state.validators == grown)
        #expect(store.end(0) == 5 << 20)
    }

    // MARK: Helpers

    /// A single-segment state: `0..<durable` of `0..<total` on stable storage.
    static func makeState(durable: Int64, total: Int64?) -> DownloadState {
        makeState(segments: [Segment(start: 0, end: total, durable: durable)], total: total)
    }

    static func makeState(segments: [Segment], total: Int64?) -> DownloadState {
        DownloadState(
            url: "http://example.com/file.bin", headers: [], checksum: nil,
            validators: Validators(
                etag: "\"v1\"", lastModified: nil, date: nil, totalLength: total, acceptRanges: true),
            segments: segments, bootID: BootID.current, liveNonce: "1234abcd", updatedAt: 1_700_000_000)
    }

    func makeState(durable: Int64, total: Int64?) -> DownloadState { Self.makeState(durable: durable, total: total) }

    func makeState(segments: [Segment], total: Int64?) -> DownloadState {
        Self.makeState(segments: segments, total: total)
    }

    /// `state` with the piece checksums and proofs a checkpoint writes for its durable bytes, `data` being the part
    /// file's bytes.
    static func proven(_ state: DownloadState, _ data: [UInt8]) -> DownloadState {
        var state = state
        do {
            try Proofs.update(&state, previous: [], pending: [:]) { (start, end, crc) throws(DownloadError) in
                var running = CRC32C(value: crc)
                data[Int(start)..<Int(end)].withUnsafeBytes { running.update($0) }
                return running.value
            }
        } catch {
            Issue.record("cannot prove \(state): \(error)")
        }
        return state
    }

    /// A whole live record's slots: `values`, then zeros.
    static func slots(_ values: [Int64]) -> [Int64] {
        values + [Int64](repeating: 0, count: LiveRecord.slotCount - values.count)
    }

    // MARK: The page cache

    /// A checkpoint drops what it made durable from the page cache (clean pages that nothing reads back), so a
    /// download larger than the cache costs no reclaim on the receive path and evicts nothing else; what is
    /// written but not yet durable stays cached. The bytes are the same either way.
    @Test func checkpointDropsWhatItMadeDurableFromTheCache() throws {
        let dir = try TemporaryDirectory()
        let mib = 1 << 20
        let pages = mib / Int(sysconf(Int32(_SC_PAGESIZE)))  // per MiB
        // Only where the page cache holds a file's pages and the advice drops them (not tmpfs, ZFS, FUSE with
        // direct I/O, …): probed on a file of its own first.
        guard try adviceDropsPages(in: dir.path) else {
            print("SKIP checkpointDropsWhatItMadeDurableFromTheCache: \(try filesystemType(of: dir.path)) at "
                + "\(dir.path) keeps its pages whatever the advice")
            return
        }
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let total = 16 * mib
        let data = ServedFile.randomBytes(count: total, seed: 31)
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: Int64(total)).validators)
        #expect(store.cacheKeptBelow.load(ordering: .relaxed) == 1 << 30, "a download's first GiB stays cached")
        store.cacheKeptBelow.store(Int64(2 * mib), ordering: .relaxed)  // here: the first 2 MiB
        func resident(_ range: Range<Int>) throws -> Int { try residentPages(paths.part, range) }

        try write(store, data, 0..<(8 * mib))
        #expect(try resident(0..<(8 * mib)) > 7 * pages, "just written: in the cache")
        try store.checkpoint()
        #expect(store.durable.load(ordering: .relaxed) == Int64(8 * mib))
        #expect(try resident(0..<(2 * mib)) > 2 * pages * 9 / 10, "the first 2 MiB are kept")
        #expect(try resident((2 * mib)..<(8 * mib)) < pages / 4, "durable beyond them: dropped")
        // One write of 8–12 MiB (its folios may span 11 MiB), made durable in two steps: to 11 MiB, then to 12.
        // The second drop starts 2 MiB-aligned below 11 MiB, so a folio across it goes too.
        let chunk = data[(8 * mib)..<(12 * mib)].withUnsafeBytes { store.write($0, at: Int64(8 * mib)) }
        #expect(chunk == nil)
        store.noteWritten(0, Int64(11 * mib))
        try store.checkpoint()
        #expect(try resident((11 * mib)..<(12 * mib)) > pages / 2, "written, not yet durable: kept (mostly)")
        store.noteWritten(0, Int64(12 * mib))
        try store.checkpoint()
        let left = try resident((8 * mib)..<(12 * mib))
        #expect(left < pages / 4, "everything durable beyond the first 2 MiB dropped, boundaries too (\(left) left)")
        #expect(try readFile(paths.part).prefix(12 * mib) == data.prefix(12 * mib)[...], "the bytes, from the disk")
    }

    /// Whether `POSIX_FADV_DONTNEED` frees a synced file's pages in `folder`.
    func adviceDropsPages(in folder: String) throws -> Bool {
        let path = folder + "/probe.bin"
        let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        try #require(fd >= 0)
        defer {
            close(fd)
            unlink(path)
        }
        let bytes = [UInt8](repeating: 7, count: 4 << 20)
        try #require(pwrite(fd, bytes, bytes.count, 0) == bytes.count && fdatasync(fd) == 0)
        guard try residentPages(path, 0..<bytes.count) > 0 else { return false }  // not cached at all
        _ = posix_fadvise(fd, 0, off_t(bytes.count), POSIX_FADV_DONTNEED)
        return try residentPages(path, 0..<bytes.count) == 0
    }

    /// The type of the file system holding `path` (the longest mount point of /proc/mounts above it).
    func filesystemType(of path: String) throws -> String {
        let mounts = String(decoding: try readFile("/proc/mounts"), as: UTF8.self)
        var best: (point: String, type: String) = ("", "")
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 2 else { continue }
            let point = String(fields[1])
            let inside = point == "/" || path == point || path.hasPrefix(point + "/")
            if inside, point.count > best.point.count { best = (point, String(fields[2])) }
        }
        return best.type
    }

    /// How many of the pages of `range` of the file at `path` are in the page cache (`mincore`).
    func residentPages(_ path: String, _ range: Range<Int>) throws -> Int {
        let fd = open(path, O_RDONLY)
        try #require(fd >= 0)
        defer { close(fd) }
        let mapped = mmap(nil, range.count, PROT_READ, MAP_SHARED, fd, off_t(range.lowerBound))
        try #require(mapped != MAP_FAILED, "mmap")
        defer { munmap(mapped, range.count) }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        var vector = [UInt8](repeating: 0, count: (range.count + page - 1) / page)
        try #require(mincore(mapped, range.count, &vector) == 0, "mincore")
        return vector.filter { $0 & 1 == 1 }.count
    }

    func write(_ store: PartStore, _ data: [UInt8], _ range: Range<Int>, slot: Int = 0) throws {
        let error = data[range].withUnsafeBytes { store.write($0, at: Int64(range.lowerBound)) }
        #expect(error == nil)
        store.noteWritten(slot, Int64(range.upperBound))
    }
}

// MARK: - File helpers shared by the engine tests

/// A fresh directory under /tmp, removed (with its contents) when the value is released.
final class TemporaryDirectory: Sendable {
    let path: String

    init() throws {
        var template = Array("/tmp/stitch-test-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw Errno(rawValue: errno)
        }
        path = String(cString: made)
    }

    deinit {
        BackgroundRemoval.remove(path)  // off the concurrency pool: it may be a Fixture's last reference
    }
}

func fileExists(_ path: String) -> Bool { access(path, F_OK) == 0 }

func fileSize(_ path: String) -> Int64? {
    var info = stat()
    return stat(path, &info) == 0 ? Int64(info.st_size) : nil
}

func readFile(_ path: String) throws -> [UInt8] {
    guard let data = FileManager.default.contents(atPath: path) else { throw Errno(rawValue: ENOENT) }
    return [UInt8](data)
}

/// Replaces the contents of `path` in place (same inode, as a crashed process's leftovers would be).
func writeFile(_ path: String, _ bytes: [UInt8]) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw Errno(rawValue: errno) }
    defer { close(fd) }
    var done = 0
    while done < bytes.count {
        let n = bytes[done...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { throw Errno(rawValue: errno) }
        done += n
    }
}

/// A ``DirectorySync`` whose syncs are counted, held until the test lets them go, or failed, by number.
private final class FolderSyncs: Sendable {
    struct Log {
        var started = 0
        var finished = 0
        var held: Set<Int> = []
        var failing: Set<Int> = []
        /// Callers that returned.
        var returned = 0
        /// Syncs running now, and the most at once.
        var running = 0
        var peak = 0
    }

    /// The stand-in for `fsync` of the folder.
    final class Syncs: Sendable {
        let log = Locked(Log())
        let gate = DispatchSemaphore(value: 0)

        func sync() throws(DownloadError) {
            let (number, hold, fail) = log.withLock { log in
                log.started += 1
                log.running += 1
                log.peak = max(log.peak, log.running)
                return (log.started, log.held.contains(log.started), log.failing.contains(log.started))
            }
            if hold { gate.wait() }
            log.withLock {
                $0.finished = number
                $0.running -= 1
            }
            if fail { throw DownloadError(.io, "sync \(number) failed") }
        }
    }

    static let folder = "/folder"
    let syncs = Syncs()
    let sync: DirectorySync

    init() {
        let syncs = self.syncs
        sync = DirectorySync(syncing: { _ throws(DownloadError) in try syncs.sync() })
    }

    /// Calls the sync as a finishing download does; true if it failed. Checks that a sync which started after the call
    /// had finished when it returned.
    func finish() async -> Bool {
        let before = syncs.log.withLock { $0.started }
        var failed = false
        do { try await sync.suspendingSync(Self.folder) } catch { failed = true }
        let finished = syncs.log.withLock {
            $0.returned += 1
            return $0.finished
        }
        #expect(finished > before, "returned before a sync that started after its call had finished")
        return failed
    }

    /// One caller whose sync (the next to start) runs until the others wait, `waiters` of them; the sync after it
    /// fails if `failing`. Whether each caller failed.
    func round(waiters: Int, failing: Bool) async -> [(first: Bool, failed: Bool)] {
        let held = syncs.log.withLock {
            $0.returned = 0
            $0.held = [$0.started + 1]
            $0.failing = failing ? [$0.started + 2] : []
            return $0.started + 1
        }
        return await withTaskGroup(of: (first: Bool, failed: Bool).self) { group in
            group.addTask { (true, await self.finish()) }
            while syncs.log.withLock({ $0.started }) < held { await Task.yield() }  // the first caller's sync runs
            for _ in 0..<waiters { group.addTask { (false, await self.finish()) } }
            // Every other caller waits (none returns while the held sync runs, whatever the implementation does).
            while sync.waiters(Self.folder) < waiters && syncs.log.withLock({ $0.started == held && $0.returned == 0 }) {
                await Task.yield()
            }
            syncs.gate.signal()
            var results: [(first: Bool, failed: Bool)] = []
            for await result in group { results.append(result) }
            return results
        }
    }
}

/// Runs each job of the tasks that prefer it on a new thread: a test's task may block there without holding one of
/// the few threads of the concurrency pool.
private final class OwnThreadExecutor: TaskExecutor {
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        Thread { job.runSynchronously(on: executor) }.start()
    }
}
