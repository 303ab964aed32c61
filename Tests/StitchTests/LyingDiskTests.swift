import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// Issue 30, items 3 and 4: a disk that acknowledges a sync but drops the data costs a refetch, never a wrong file
/// (every durable byte is proven by a checksum after a reboot, state format 3); a state file written by the format 2
/// stitch still resumes; and a cut between the final sync and the rename into place fetches nothing again (the
/// completion mark carries the whole file's CRC32C).
///
/// The tests use only what the code before format 3 had too, so that they can be run against it: there the zeroed
/// bytes were trusted after the reboot, the fixture's unproven bytes were kept after a reboot, a part file finished
/// but not renamed was fetched again (whole when small, from the last checkpoint after a reboot), and a changed
/// byte in such a file was kept (a wrong file). The same-boot fixture resume and the checksum test passed there too.
@Suite struct LyingDiskTests {
    static let mib = 1 << 20

    // MARK: A disk that drops acknowledged writes

    /// A download written partly over three segments — a split inside piece 2, piece 3 partial, piece 4 resumed in
    /// a second run mid-piece (its hasher never saw the piece's first byte) — and checkpointed. Then the disk
    /// "loses" durable bytes of pieces 2, 3 and 4 (zeros where the data was, as a disk that acknowledged the sync
    /// but dropped the data leaves them), and the machine restarts (another boot id). Reopening must not trust any
    /// zeroed byte: every byte the reopened state counts as durable is the source's, the damaged pieces are cut,
    /// the rest kept, and the finished file is byte-exact.
    @Test func zeroedDurableBytesAreFetchedAgainAfterAReboot() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let mib = Int64(Self.mib)
        let total = 6 * mib
        let data = ServedFile.randomBytes(count: Int(total), seed: 0x1D1E_D15C)
        let url = "http://x/file.bin"
        var store: PartStore? = try PartStore.create(
            paths: paths, url: url, headers: [], checksum: nil,
            validators: PartStoreTests.makeState(durable: 0, total: total).validators)
        // Three segments: [0, 2.5M) [2.5M, 4M) [4M, 6M): the first split is inside piece 2.
        #expect(store!.split(0, at: 5 * mib / 2) == 1)
        #expect(store!.split(1, at: 4 * mib) == 2)
        try Self.lane(store!, data, slot: 0, segmentStart: 0, 0..<(23 * mib / 10))  // pieces 0, 1; piece 2 begun
        try Self.lane(store!, data, slot: 1, segmentStart: 5 * mib / 2, (5 * mib / 2)..<(36 * mib / 10))
        try Self.lane(store!, data, slot: 2, segmentStart: 4 * mib, (4 * mib)..<(44 * mib / 10))
        try store!.checkpoint()
        store = nil  // the run ends

        // The next run, in the same boot, continues piece 4 mid-piece.
        let first = try #require(try StateFile.read(paths.state))
        do {
            let (again, point) = try PartStore.reopen(paths: paths, state: first)
            #expect(point.bytes == 23 * mib / 10 + 11 * mib / 10 + 4 * mib / 10)
            try Self.lane(again, data, slot: 2, segmentStart: 4 * mib, (44 * mib / 10)..<(49 * mib / 10))
            try again.checkpoint()
        }
        let saved = try #require(try StateFile.read(paths.state))
        #expect(saved.segments.map(\.durable) == [23 * mib / 10, 36 * mib / 10, 49 * mib / 10])
        #expect(saved.pieces.indices.filter { saved.pieces[$0] != nil } == [0, 1], "only whole pieces have CRCs")

        // The disk kept the size but dropped durable bytes of the partial and shared pieces.
        let lost: [Range<Int64>] = [
            (21 * mib / 10)..<(22 * mib / 10),  // piece 2, the first segment's part
            (26 * mib / 10)..<(27 * mib / 10),  // piece 2, the second segment's part
            (32 * mib / 10)..<(33 * mib / 10),  // piece 3
            (45 * mib / 10)..<(46 * mib / 10),  // piece 4, written after the resume
        ]
        for range in lost { try Self.zero(paths.part, range) }
        // And the machine restarted.
        var rebooted = saved
        rebooted.bootID = "stitch-test-another-boot"
        try StateFile.write(rebooted, to: paths.state)

        let (checked, point) = try PartStore.reopen(paths: paths, state: rebooted)
        let part = try readFile(paths.part)
        let segments = checked.snapshot.segments
        for segment in segments where segment.durable > segment.start {
            let range = Int(segment.start)..<Int(segment.durable)
            let same = part[range].elementsEqual(data[range])  // (not the arrays: a failure would print megabytes)
            #expect(same, "bytes \(range) are counted as durable but are not the source's")
        }
        for range in lost {
            #expect(
                !segments.contains { $0.start < range.upperBound && range.lowerBound < $0.durable },
                "the zeroed bytes \(range) are trusted: \(segments)")
        }
        #expect(point.damagedPieces == [2, 3, 4], "\(point)")
        #expect(point.bytes == 2 * mib, "pieces 0 and 1 are kept: \(point)")

        // Fetching what is not durable (here: written from the source) finishes the file byte-exact.
        for (slot, segment) in checked.writtenSegments.enumerated() {
            guard let end = segment.end, segment.durable < end else { continue }
            try Self.lane(checked, data, slot: slot, segmentStart: segment.start, segment.durable..<end)
        }
        try checked.finish(url: url, length: total)
        let finished = try readFile(paths.destination) == data
        #expect(finished, "the finished file differs from the source")
    }

    /// Writes `range` of `data` as a lane of the engine does: in chunks, its piece hasher beside it, each chunk
    /// noted in the live record.
    static func lane(
        _ store: PartStore, _ data: [UInt8], slot: Int, segmentStart: Int64, _ range: Range<Int64>
    ) throws {
        var hasher = PieceHasher(pieceSize: store.pieceSize, total: Int64(data.count))
        hasher.start(at: range.lowerBound, segmentStart: segmentStart, store: store)
        var at = range.lowerBound
        while at < range.upperBound {
            let end = min(at + 100_000, range.upperBound)
            try data[Int(at)..<Int(end)].withUnsafeBytes { chunk in
                if let error = store.write(chunk, at: at) { throw error }
                hasher.consume(chunk, at: at, store: store)
            }
            store.noteWritten(slot, end)
            at = end
        }
    }

    /// Overwrites `range` of the file at `path` with zeros, in place.
    static func zero(_ path: String, _ range: Range<Int64>) throws {
        let fd = open(path, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { throw Errno(rawValue: errno) }
        defer { close(fd) }
        let zeros = [UInt8](repeating: 0, count: range.count)
        guard pwrite(fd, zeros, zeros.count, off_t(range.lowerBound)) == zeros.count else { throw Errno(rawValue: errno) }
    }

    // MARK: A state file of format 2

    /// A state file the format 2 stitch wrote (commit 283e295), verbatim but for the port in its URL: the engine
    /// (`Downloader`, four connections, `minimumSplitSize` 512 KiB) fetched ``fixtureFile`` from the test server,
    /// whose ranged responses stalled the second segment after 700 KiB and the third after 300 KiB, and the task
    /// was cancelled once the live record showed every lane where it stopped (the interruption's checkpoint wrote
    /// it). Four segments: [0, 1M) and [2.5M, end) whole, so pieces 0 and 3 have CRCs; piece 1 is partial, and
    /// piece 2 is shared by the third and fourth segments (a split inside it). The part file was 3,248,128 bytes:
    /// the source's bytes where they were written (``fixturePart(dropUnproven:)`` rebuilds it from the seed).
    static let fixtureV2 = """
        {
          "bootID" : "9515b65f-ed78-440e-9fc8-5cc90f1318c7",
          "headers" : [

          ],
          "liveNonce" : "a7e40a34c6aad82d",
          "pieceSize" : 1048576,
          "pieces" : [
            484848337,
            null,
            null,
            1006861192
          ],
          "schemaVersion" : 2,
          "segments" : [
            {
              "durable" : 1048576,
              "end" : 1048576,
              "start" : 0
            },
            {
              "durable" : 1765376,
              "end" : 2097152,
              "start" : 1048576
            },
            {
              "durable" : 2404352,
              "end" : 2621440,
              "start" : 2097152
            },
            {
              "durable" : 3248128,
              "end" : 3248128,
              "start" : 2621440
            }
          ],
          "updatedAt" : 1796402328,
          "url" : "http://127.0.0.1:43323/file.bin",
          "validators" : {
            "acceptRanges" : true,
            "date" : "Fri, 04 Dec 2026 16:38:48 GMT",
            "etag" : "\\"fixture-v2\\"",
            "totalLength" : 3248128
          }
        }
        """

    /// The file the fixture's download was fetching.
    static let fixtureFile = ServedFile.random(size: 3_248_128, seed: 0x5717_0002_F1C5, etag: "\"fixture-v2\"")

    /// The fixture's durable ranges (by segment).
    static let fixtureDurable: [Range<Int>] = [
        0..<1_048_576, 1_048_576..<1_765_376, 2_097_152..<2_404_352, 2_621_440..<3_248_128,
    ]

    /// The part file beside the fixture: the source's bytes in the durable ranges; elsewhere junk. With
    /// `dropUnproven`, as a disk that dropped acknowledged writes leaves it: zeros in the durable bytes of the
    /// pieces no recorded CRC covers (1 and 2).
    static func fixturePart(dropUnproven: Bool) -> [UInt8] {
        var part = [UInt8](repeating: 0xA5, count: fixtureFile.data.count)
        for range in fixtureDurable { part[range] = fixtureFile.data[range] }
        if dropUnproven {
            for range in fixtureDurable {
                let unproven = max(range.lowerBound, 1_048_576)..<min(range.upperBound, 3_145_728)
                if !unproven.isEmpty { part.replaceSubrange(unproven, with: repeatElement(0, count: unproven.count)) }
            }
        }
        return part
    }

    /// Puts the fixture at the fixture's destination: its state (for this server's URL, written by `bootID`) and
    /// its part file.
    static func placeFixture(_ f: Fixture, bootID: String, dropUnproven: Bool) throws {
        let text = fixtureV2.replacingOccurrences(of: "http://127.0.0.1:43323/file.bin", with: f.url)
            .replacingOccurrences(of: "9515b65f-ed78-440e-9fc8-5cc90f1318c7", with: bootID)
        try writeFile(f.paths.state, Array(text.utf8))
        try writeFile(f.paths.part, fixturePart(dropUnproven: dropUnproven))
    }

    /// The format 2 state reads, and in the same boot resumes every durable byte: only the rest of the second and
    /// third segments is fetched, and the file is byte-exact.
    @Test func formatTwoStateResumesInTheSameBoot() async throws {
        let f = try Fixture()
        f.serve(Self.fixtureFile)
        try Self.placeFixture(f, bootID: BootID.current, dropUnproven: false)
        let read = try #require(try StateFile.read(f.paths.state))
        #expect(read.schemaVersion == 2 && read.durableBytes == 2_699_264)

        let result = try await f.download(f.request())
        try f.expectComplete(result, Self.fixtureFile.data)
        #expect(result.resumedFrom == 2_699_264)
        #expect(f.server.bodyBytesSent == 3_248_128 - 2_699_264, "only the bytes not durable are fetched")
    }

    /// After a reboot only what the fixture's piece CRCs prove is kept (pieces 0 and 3): the durable bytes of
    /// pieces 1 and 2 had no checksum in format 2. Here the disk dropped them (zeros); they are fetched again
    /// and the file is byte-exact.
    @Test func formatTwoStateAfterARebootKeepsOnlyWhatItsPieceChecksumsProve() async throws {
        let f = try Fixture()
        f.serve(Self.fixtureFile)
        try Self.placeFixture(f, bootID: "stitch-test-another-boot", dropUnproven: true)

        let result = try await f.download(f.request())
        try f.expectComplete(result, Self.fixtureFile.data)
        let kept = 1_048_576 + (3_248_128 - 3_145_728)  // pieces 0 and 3
        #expect(result.resumedFrom == Int64(kept))
        #expect(f.server.bodyBytesSent == 3_248_128 - kept, "pieces 1 and 2 are fetched again, nothing else")
        let note = f.watch.resumes.first?.note ?? ""
        #expect(note.contains("cannot be proven"), "resume note: \(note)")
    }

    // MARK: A cut between the final sync and the rename

    /// Runs a download to the point just before its rename into place: the destination is a directory with
    /// something in it, so `rename(2)` fails after the part file was truncated, marked and synced — what a power
    /// cut right then leaves on disk. The directory is then removed.
    static func downloadUpToTheRename(_ f: Fixture, _ file: ServedFile, checksum: ExpectedChecksum? = nil) async throws {
        f.watch.disarm()  // something is at the destination on purpose
        #expect(mkdir(f.dest, 0o755) == 0)
        try writeFile(f.dest + "/in-the-way", [1])
        // No timed checkpoint: the state vouches for what its first write did (nothing), as after a fast download.
        var options = DownloadOptions.testing
        options.checkpointInterval = 3600
        options.checkpointBytes = 1 << 40
        let error = await #expect(throws: DownloadError.self) {
            try await f.download(f.request(checksum: checksum, overwrite: true), options: options)
        }
        #expect(error?.message.contains("rename") == true, "\(String(describing: error))")
        #expect(unlink(f.dest + "/in-the-way") == 0 && rmdir(f.dest) == 0)
        let complete = try readFile(f.paths.part) == file.data
        #expect(complete, "the part file is complete")
        #expect(await blocking { f.server.waitUntilIdle(timeout: .seconds(30)) })
    }

    /// A small file (no state file): the rerun finds the finished part file and renames it into place, fetching
    /// nothing (the code before read a part file without a state as nothing, and fetched it all again).
    @Test func smallFileFinishedBeforeItsRenameIsNotFetchedAgain() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 300_000, seed: 0xF1_0001, etag: "\"small\"")
        f.serve(file)
        try await Self.downloadUpToTheRename(f, file)
        #expect(!fileExists(f.paths.state), "a small download has no state file")
        let sent = f.server.bodyBytesSent
        let requests = f.server.requests.count

        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.server.bodyBytesSent == sent, "no body byte fetched again")
        #expect(f.server.requests.count == requests, "no request at all")
        #expect(result.bytesTransferred == 0 && !result.alreadyComplete && result.resumedFrom == 300_000)
        let note = f.watch.resumes.last?.note ?? ""
        #expect(note.contains("had finished writing"), "resume note: \(note)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: f.directory.path) == ["file.bin"])
    }

    /// A file with a state file, after a reboot (another boot id in the state): the last timed checkpoint is all
    /// the state vouches for, but the part file's mark proves every byte — nothing is fetched again.
    @Test func fileFinishedBeforeItsRenameIsNotFetchedAgainAfterAReboot() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 3 * Self.mib + 12_345, seed: 0xF1_0002, etag: "\"big\"")
        f.serve(file)
        try await Self.downloadUpToTheRename(f, file)
        var state = try #require(try StateFile.read(f.paths.state))
        #expect(state.durableBytes < Int64(file.data.count), "the state vouches for less than the whole file")
        state.bootID = "stitch-test-another-boot"
        try StateFile.write(state, to: f.paths.state)
        let sent = f.server.bodyBytesSent

        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.server.bodyBytesSent == sent, "no body byte fetched again")
        #expect(result.bytesTransferred == 0 && result.resumedFrom == Int64(file.data.count))
        #expect(try FileManager.default.contentsOfDirectory(atPath: f.directory.path) == ["file.bin"])
    }

    /// Under `--checksum` the finished part file is hashed before its rename: a matching digest finishes it (and is
    /// reported verified); another expected digest deletes it, as a mismatch at the end of a download does.
    @Test func finishedPartFileIsCheckedAgainstAChecksum() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 * Self.mib, seed: 0xF1_0003, etag: "\"sum\"")
        f.serve(file)
        let right = try SegmentedTests.sha256(of: file.data)
        try await Self.downloadUpToTheRename(f, file, checksum: right)
        let wrong = try SegmentedTests.sha256(of: Array(file.data.dropFirst()))
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request(checksum: wrong)) }
        #expect(error?.code == .checksumMismatch, "\(String(describing: error))")
        #expect(!fileExists(f.dest) && !fileExists(f.paths.part), "the data is deleted, as after any mismatch")

        try await Self.downloadUpToTheRename(f, file, checksum: right)
        let sent = f.server.bodyBytesSent
        let result = try await f.download(f.request(checksum: right))
        try f.expectComplete(result, file.data)
        #expect(result.checksum == right)
        #expect(f.server.bodyBytesSent == sent, "no body byte fetched again")
    }

    /// A mark whose CRC the bytes do not match (a byte changed after the mark was set) is not trusted: the rerun
    /// removes it, checks what the state proves, fetches the rest, and the file is byte-exact — with a state file
    /// (same boot: its live record is not taken either) and without one (a small file: started over).
    @Test(arguments: [300_000, 3 * mib + 12_345])
    func markWhoseChecksumFailsIsNotTrusted(_ size: Int) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: size, seed: 0xF1_0004 + UInt64(size), etag: "\"bad\"")
        f.serve(file)
        try await Self.downloadUpToTheRename(f, file)
        try SegmentedTests.flipByte(in: f.paths.part, at: Int64(size / 2))

        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(result.bytesTransferred > 0, "the changed bytes were fetched again")
    }
}
