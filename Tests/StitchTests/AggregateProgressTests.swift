import Foundation
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// `TransferProgress.fractionCompleted` at its edges, and `AggregateProgress`: what it counts from snapshots, and
/// `DownloadManager.aggregateProgress()` over real downloads in every status (held by the server at known byte
/// counts, so each download's bytes are known exactly).
@Suite struct AggregateProgressTests {

    // MARK: fractionCompleted

    /// (bytes, total, expected fraction).
    static let fractions: [(Int64, Int64?, Double?)] = [
        (0, nil, nil),  // length unknown
        (500, nil, nil),
        (0, 0, 1),  // a zero-byte file
        (0, 1000, 0),
        (250, 1000, 0.25),
        (1000, 1000, 1),
        (1500, 1000, 1),  // more bytes than a wrong total: clamped
        (-1, 1000, 0),  // never below 0
        (5, -1, nil),  // a nonsense length is no length
    ]

    @Test(arguments: fractions)
    func fractionCompleted(_ bytes: Int64, _ total: Int64?, _ expected: Double?) {
        let progress = TransferProgress(bytes: bytes, total: total)
        #expect(progress.fractionCompleted == expected, "\(bytes) of \(String(describing: total))")
    }

    // MARK: Counting snapshots

    /// Queued, running, paused, completed, failed.
    static func counts(_ aggregate: AggregateProgress) -> [Int] {
        [aggregate.queued, aggregate.running, aggregate.paused, aggregate.completed, aggregate.failed]
    }

    static func snapshot(_ status: DownloadStatus, bytes: Int64, total: Int64?, speed: Double = 0) -> DownloadSnapshot {
        DownloadSnapshot(
            id: DownloadID.random(), url: "http://example.com/x", headers: HTTPHeaders(), destination: .file("/x"),
            path: "/x", status: status,
            progress: TransferProgress(bytes: bytes, total: total, bytesPerSecond: speed), priority: 0, position: 1,
            checksum: nil, addedAt: 0)
    }

    /// Every status counted; failed downloads are left out of the bytes, lengths and fraction; a download of unknown
    /// length adds its bytes but not to the fraction; only running downloads add their speed; a download beyond its
    /// length adds no more than its length to the fraction.
    @Test func countsEveryStatusAndLeavesFailedOutOfTheBytes() {
        let aggregate = AggregateProgress([
            Self.snapshot(.completed, bytes: 1000, total: 1000),
            Self.snapshot(.running, bytes: 300, total: 1000, speed: 50),
            Self.snapshot(.running, bytes: 700, total: nil, speed: 25),
            Self.snapshot(.paused, bytes: 200, total: 2000, speed: 99),  // a paused download's last speed: not summed
            Self.snapshot(.queued, bytes: 0, total: nil),
            Self.snapshot(.failed(.cancelled), bytes: 400, total: 4000, speed: 10),
            Self.snapshot(.failed(DownloadFailure(code: .httpStatus, message: "404")), bytes: 0, total: nil),
            Self.snapshot(.completed, bytes: 1200, total: 1000),  // more than its (wrong) length
            Self.snapshot(.removed, bytes: 5, total: 5),  // gone: not counted at all
        ])
        #expect(aggregate.count == 8)
        #expect(Self.counts(aggregate) == [1, 2, 1, 2, 2])
        #expect(aggregate.active == 3)
        #expect(aggregate.bytes == 1000 + 300 + 700 + 200 + 0 + 1200)
        #expect(aggregate.totalBytes == 1000 + 1000 + 2000 + 1000)
        #expect(aggregate.bytesOfKnownTotal == 1000 + 300 + 200 + 1000)
        #expect(aggregate.unknownTotalCount == 2)
        #expect(aggregate.bytesPerSecond == 75)
        #expect(aggregate.fractionCompleted == 2500.0 / 5000.0)
    }

    /// No downloads, or none of known length: no fraction. Only zero-byte files: done. Only failed ones: no
    /// fraction either.
    @Test func fractionAtTheEdges() {
        #expect(AggregateProgress().fractionCompleted == nil)
        #expect(AggregateProgress([]).count == 0)
        #expect(AggregateProgress([Self.snapshot(.queued, bytes: 0, total: nil)]).fractionCompleted == nil)
        #expect(AggregateProgress([Self.snapshot(.completed, bytes: 0, total: 0)]).fractionCompleted == 1)
        #expect(AggregateProgress([Self.snapshot(.failed(.cancelled), bytes: 10, total: 100)]).fractionCompleted == nil)
    }

    // MARK: Over a manager

    /// Six downloads with one slot: one completed (64 KiB), one cancelled at 64 KiB of 256 KiB (failed), one paused
    /// at 128 KiB of 512 KiB, one running and held at 256 KiB of 1 MiB, one queued behind it and one added paused
    /// (neither with a length yet). The aggregate counts each status and adds the bytes and lengths of all but the
    /// failed one; once everything is paused, no speed and nothing active.
    @Test func aggregateOverDownloadsInEveryStatus() async throws {
        let f = try ManagerFixture()
        let sizes = ["done": 64 << 10, "cancelled": 256 << 10, "paused": 512 << 10, "running": 1 << 20]
        let holds = ["cancelled": 64 << 10, "paused": 128 << 10, "running": 256 << 10]
        for (name, size) in sizes {
            f.server.serve(
                "/\(name).bin", file: .random(size: size, seed: UInt64(size), etag: "\"\(name)\""),
                faults: holds[name].map { .always(.stallAfter($0, then: .close)) } ?? .none)
        }
        f.server.serve("/later.bin", file: .random(size: 64 << 10, seed: 5))
        let manager = try f.open { $0.maxConcurrentDownloads = 1 }
        let server = f.server

        func add(_ name: String, paused: Bool = false) async throws -> DownloadID {
            var options = DownloadManager.AddOptions(out: name + ".out")
            options.connections = 1
            options.paused = paused
            return try await manager.add(
                f.server.url("/\(name == "queued" || name == "new" ? "later" : name).bin"), options: options)
        }
        /// Adds `name` and waits until it runs, held by the server, with exactly the bytes held reported.
        func addHeld(_ name: String) async throws -> DownloadID {
            let id = try await add(name)
            try #require(await blocking { server.waitForStall() }, "\(name) never reached its stall")
            let held = Int64(holds[name]!)
            let reported = await eventually(timeout: 60) { await manager.download(id)?.progress.bytes == held }
            let progress = await manager.download(id)?.progress
            try #require(reported, "\(name): \(String(describing: progress))")
            return id
        }

        let done = try await add("done")
        await manager.waitUntilIdle()
        try #require(await manager.download(done)?.status == .completed)
        let cancelled = try await addHeld("cancelled")
        try await manager.cancel(cancelled)
        let paused = try await addHeld("paused")
        try await manager.pause(paused)
        let running = try await addHeld("running")
        let queued = try await add("queued")
        let new = try await add("new", paused: true)

        let statuses = await manager.downloads().map(\.status)
        #expect(statuses.count == 6)
        #expect(await manager.download(cancelled)?.status == .failed(.cancelled))
        #expect(await manager.download(paused)?.status == .paused)
        #expect(await manager.download(running)?.status == .running)
        #expect(await manager.download(queued)?.status == .queued)
        #expect(await manager.download(new)?.status == .paused)

        let aggregate = await manager.aggregateProgress()
        #expect(aggregate.count == 6)
        #expect(Self.counts(aggregate) == [1, 1, 2, 1, 1], "\(aggregate)")
        #expect(aggregate.active == 2)
        let bytes = Int64((64 << 10) + (128 << 10) + (256 << 10))
        #expect(aggregate.bytes == bytes)
        #expect(aggregate.bytesOfKnownTotal == bytes)
        #expect(aggregate.totalBytes == Int64((64 << 10) + (512 << 10) + (1 << 20)))
        #expect(aggregate.unknownTotalCount == 2)
        #expect(aggregate.fractionCompleted == Double(bytes) / Double((64 << 10) + (512 << 10) + (1 << 20)))
        // The same sums from the list of downloads (read by a second call: the speed of the held download may have
        // moved in between, so it is left out here).
        var listed = AggregateProgress(await manager.downloads())
        var summed = aggregate
        listed.bytesPerSecond = 0
        summed.bytesPerSecond = 0
        #expect(summed == listed, "aggregateProgress \(aggregate), from the list \(listed)")

        try await manager.pauseAll()
        let rest = await manager.aggregateProgress()
        #expect(Self.counts(rest) == [0, 0, 4, 1, 1], "\(rest)")
        #expect(rest.bytesPerSecond == 0)
        #expect(rest.active == 0)
        #expect(rest.bytes == bytes)

        try await manager.remove(cancelled)
        try await manager.remove(done)
        let fewer = await manager.aggregateProgress()
        #expect(fewer.count == 4 && fewer.failed == 0 && fewer.completed == 0)
        #expect(fewer.bytes == bytes - (64 << 10))
        await manager.close()
    }
}
