import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
import StitchLocks

/// What a daemon needs of the manager (issue 11): settings that change while downloads run, aria2's queue
/// positions, adding a download it already holds, progress that lasts across pauses, and a manager whose list
/// lives in memory. Against the fault-injecting loopback server; faults fire on byte counts and explicit
/// signals, never after a sleep.
@Suite struct ManagerDaemonReadinessTests {
    // MARK: Queue positions

    /// aria2's `changePosition` over the waiting queue (queued and paused downloads): `POS_SET`, `POS_CUR` and
    /// `POS_END` with places before the front and past the end clamped, the new place returned — the same table
    /// as aria2's own test of its queue. The order survives a new manager on the same catalog.
    @Test func positionsAsAria2CountsThem() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        var added: [DownloadID] = []
        for name in ["a", "b", "c", "d", "e"] {
            var options = DownloadManager.AddOptions(out: "\(name).bin")
            options.paused = true
            added.append(try await manager.add(f.server.url("/\(name).bin"), options: options))
        }
        let (a, b, c, d, e) = (added[0], added[1], added[2], added[3], added[4])
        func queue() async -> [DownloadID] { await manager.waitingQueue() }
        #expect(await queue() == [a, b, c, d, e])
        #expect(try await manager.move(d, to: .fromStart(0)) == 0)
        #expect(await queue() == [d, a, b, c, e])
        #expect(try await manager.move(d, to: .fromStart(99)) == 4)
        #expect(await queue() == [a, b, c, e, d])
        #expect(try await manager.move(a, to: .fromCurrent(2)) == 2)
        #expect(await queue() == [b, c, a, e, d])
        #expect(try await manager.move(a, to: .fromCurrent(-1)) == 1)
        #expect(await queue() == [b, a, c, e, d])
        #expect(try await manager.move(c, to: .fromCurrent(Int.min)) == 0)
        #expect(await queue() == [c, b, a, e, d])
        #expect(try await manager.move(c, to: .fromEnd(0)) == 4)
        #expect(await queue() == [b, a, e, d, c])
        #expect(try await manager.move(c, to: .fromEnd(-1)) == 3)
        #expect(await queue() == [b, a, e, c, d])
        #expect(try await manager.move(b, to: .fromEnd(-10)) == 0)
        #expect(await queue() == [b, a, e, c, d])

        // A download of a higher priority moved behind lower ones takes their priority: the order is the one asked.
        try await manager.setPriority(d, 9)
        #expect(await queue().first == d)
        #expect(try await manager.move(d, to: .fromEnd(0)) == 4)
        #expect(await queue() == [b, a, e, c, d])
        #expect(await manager.download(d)?.priority == 0)
        await manager.close()

        let reopened = try f.open()
        #expect(await reopened.waitingQueue() == [b, a, e, c, d])
        await reopened.close()
    }

    /// An add at a place (aria2's `addUri` position) is one step: the new download is in the waiting queue where
    /// asked, never first at the end, in a batch too; the places are kept by one catalog transaction, so a new
    /// manager on the same catalog sees the same order. A download returned by `reuseExisting` keeps its place.
    @Test func anAddAtAPlaceIsOneStep() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        func paused(_ name: String, _ position: DownloadManager.QueuePosition? = nil) -> DownloadManager.AddOptions {
            var options = DownloadManager.AddOptions(out: "\(name).bin")
            options.paused = true
            options.position = position
            return options
        }
        var ids: [DownloadID] = []
        for name in ["a", "b", "c"] { ids.append(try await manager.add(f.server.url("/\(name).bin"), options: paused(name))) }
        let (a, b, c) = (ids[0], ids[1], ids[2])
        // The manager's events: the new download's first event is its add, at its place already.
        let events = await manager.events()
        let d = try await manager.add(f.server.url("/d.bin"), options: paused("d", .fromStart(1)))
        #expect(await manager.waitingQueue() == [a, d, b, c])
        var iterator = events.makeAsyncIterator()
        if case .added(let snapshot)? = await iterator.next() {
            #expect(snapshot.id == d)
            #expect(snapshot.position > (await manager.download(a)?.position ?? .max), "added at its place")
            #expect(snapshot.position < (await manager.download(b)?.position ?? .min), "added at its place")
        } else {
            Issue.record("the add was not the first event")
        }
        let batch = try await manager.add([
            (f.server.url("/e.bin"), paused("e", .fromStart(0))), (f.server.url("/g.bin"), paused("g")),
            (f.server.url("/h.bin"), paused("h", .fromEnd(-1))),
        ])
        let (e, g, h) = (batch[0], batch[1], batch[2])
        #expect(await manager.waitingQueue() == [e, a, d, b, c, h, g])
        let again = paused("b", .fromStart(0))
        #expect(try await manager.add(f.server.url("/b.bin"), options: again) == b)
        #expect(await manager.waitingQueue() == [e, a, d, b, c, h, g], "a held download keeps its place")
        let positions = await manager.downloads().map(\.position)
        #expect(Set(positions).count == positions.count, "no two at one position: \(positions)")
        // A batch that names one new download twice: the item that made it places it; the later one finds it there.
        let twice = try await manager.add([
            (f.server.url("/k.bin"), paused("k", .fromStart(0))), (f.server.url("/k.bin"), paused("k", .fromEnd(0))),
        ])
        #expect(twice[0] == twice[1])
        #expect(await manager.waitingQueue() == [twice[0], e, a, d, b, c, h, g], "placed once, at the front")
        await manager.close()

        let reopened = try f.open()
        #expect(await reopened.waitingQueue() == [twice[0], e, a, d, b, c, h, g])
        await reopened.close()
    }

    /// A move renumbers only the waiting downloads, with the positions they had: one that is not waiting (a
    /// cancelled one) keeps its position, no two downloads share one, and the order of everything is determined.
    @Test func moveLeavesOthersInPlace() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        var paused = DownloadManager.AddOptions()
        paused.paused = true
        var ids: [DownloadID] = []
        for name in ["a", "b", "r", "c"] {
            paused.out = "\(name).bin"
            ids.append(try await manager.add(f.server.url("/\(name).bin"), options: paused))
        }
        let (a, b, r, c) = (ids[0], ids[1], ids[2], ids[3])
        try await manager.cancel(r)
        let before = await manager.download(r)?.position
        #expect(try await manager.move(a, to: .fromEnd(0)) == 2)
        #expect(await manager.waitingQueue() == [b, c, a])
        #expect(await manager.download(r)?.position == before, "not waiting: untouched")
        let positions = await manager.downloads().map(\.position)
        #expect(Set(positions).count == positions.count, "no two at one position: \(positions)")
        #expect(await manager.downloads().map(\.id) == [b, c, r, a])
        await manager.close()
    }

    /// Only waiting downloads have a place in the waiting queue: a running one is refused by name.
    @Test func runningDownloadsHaveNoQueuePlace() async throws {
        let f = try ManagerFixture()
        f.server.serve("/hold.bin", file: .random(size: 64 << 10, seed: 90), faults: .onRequest(0, .stallBeforeHeaders()))
        let manager = try f.open()
        let hold = try await manager.add(f.server.url("/hold.bin"))
        let server = f.server
        try #require(await blocking { server.waitForStall() })
        do {
            try await manager.move(hold, to: .fromStart(0))
            Issue.record("a running download was moved")
        } catch {
            guard error.isInvalidRequest else {
                Issue.record("\(error)")
                return
            }
        }
        #expect(await manager.waitingQueue().isEmpty)
        server.releaseStalls()
        await manager.waitUntilIdle()
        await manager.close()
    }

    // MARK: Adding what the manager already holds

    /// By default (`reuseExisting`), adding a URL the manager holds for the same place returns that download (also
    /// within one batch, and by a former URL), as an app that adds its downloads at every launch needs; another
    /// place, or `reuseExisting` off, is a new download.
    @Test func addingAHeldDownloadReturnsIt() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        var reuse = DownloadManager.AddOptions()
        reuse.paused = true
        #expect(reuse.reuseExisting, "the default")
        let url = f.server.url("/same.bin")
        let first = try await manager.add(url, options: reuse)
        #expect(try await manager.add(url, options: reuse) == first)
        #expect(try await manager.add(URL(string: url)!) == first, "with the default options, by URL")
        var copy = DownloadManager.AddOptions()
        copy.paused = true
        copy.reuseExisting = false
        let second = try await manager.add(url, options: copy)
        #expect(second != first, "reuseExisting off: a second download")
        var elsewhere = reuse
        elsewhere.directory = f.downloads + "/other"
        #expect(try await manager.add(url, options: elsewhere) != first)

        var named = reuse
        named.out = "named.bin"
        let batch = try await manager.add([(url, named), (url, named), (url, reuse)])
        #expect(batch[0] == batch[1], "the batch's own earlier item")
        #expect(batch[2] == first)
        let moved = f.server.url("/moved.bin")
        try await manager.updateSource(first, url: moved)
        #expect(try await manager.add(moved, options: reuse) == first)
        // `second` still fetches `url` itself: it is the one that URL finds now; `first` only had it.
        var secondPlace = reuse
        secondPlace.paused = true
        #expect(try await manager.add(url, options: secondPlace) == second, "the current URL before a former one")
        try await manager.remove(second)
        #expect(try await manager.add(url, options: reuse) == first, "then by a former URL")
        // The folder however it is written.
        var spelled = reuse
        spelled.directory = f.downloads + "/./other/"
        #expect(try await manager.add(url, options: spelled) == (try await manager.add(url, options: elsewhere)))
        // A held download asked for with another checksum is refused, not returned unverified.
        var checked = reuse
        checked.checksum = try ExpectedChecksum(parsing: "sha-256=" + String(repeating: "ab", count: 32))
        await #expect(throws: DownloadManagerError.self) { try await manager.add(url, options: checked) }
        #expect(await manager.downloads().count == 3)
        await manager.close()
    }

    // MARK: Settings that change while downloads run

    /// Raising the concurrency starts queued downloads at once; lowering it stops none; bad values are refused.
    @Test func concurrencyChangesWhileRunning() async throws {
        let f = try ManagerFixture()
        for name in ["a", "b", "c"] {
            f.server.serve(
                "/\(name).bin", file: .random(size: 64 << 10, seed: 91, etag: "\"\(name)\""),
                faults: .onRequest(0, .stallBeforeHeaders()))
        }
        let manager = try f.open { $0.maxConcurrentDownloads = 1 }
        let server = f.server
        let ids = try await manager.add(["a", "b", "c"].map { (f.server.url("/\($0).bin"), .init(out: "\($0).bin")) })
        try #require(await blocking { server.waitForStall() })
        #expect(server.requests.count == 1)
        try await manager.setMaxConcurrentDownloads(3)
        // Every stall reached before any is released (a stall reached after the release would hold its request).
        for _ in 0..<2 { #expect(await blocking { server.waitForStall(timeout: .seconds(30)) }, "raised: the others start") }
        #expect(server.requests.count == 3)
        try await manager.setMaxConcurrentDownloads(1)
        #expect(await manager.configuration.maxConcurrentDownloads == 1)
        #expect(await manager.downloads().filter { $0.status == .running }.count == 3, "lowered: none is stopped")
        await #expect(throws: DownloadManagerError.self) { try await manager.setMaxConcurrentDownloads(0) }
        await #expect(throws: DownloadManagerError.self) { try await manager.setRateLimit(0) }
        await #expect(throws: DownloadManagerError.self) { try await manager.setMaxConnectionsPerHost(0) }
        server.releaseStalls()
        await manager.waitUntilIdle()
        for id in ids { #expect(await manager.download(id)?.status == .completed) }
        await manager.close()
    }

    /// A limit set while a download runs applies to it: 640 KiB at 256 KiB/s cannot take less than two
    /// seconds (a lower bound only; a loaded machine only makes it longer). Without a limit set the manager's
    /// limiter lets everything through.
    @Test func rateLimitSetWhileRunning() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 640 << 10, seed: 92, etag: "\"r\"")
        f.server.serve("/r.bin", file: file, faults: .onRequest(0, .stallAfter(64 << 10)))
        let manager = try f.open()
        #expect(await manager.configuration.rateLimit == nil)
        let id = try await manager.add(f.server.url("/r.bin"), options: .init(out: "r.bin"))
        let server = f.server
        try #require(await blocking { server.waitForStall() })
        try await manager.setRateLimit(256 << 10)
        #expect(await manager.configuration.rateLimit == 256 << 10)
        let started = ContinuousClock.now
        server.releaseStalls()
        await manager.waitUntilIdle()
        let elapsed = ContinuousClock.now - started
        #expect(await manager.download(id)?.status == .completed)
        expectFile(f.path("r.bin"), file.data)
        // 576 KiB left, less the bucket's 64 KiB burst, at 256 KiB/s: at least two seconds.
        #expect(elapsed >= .seconds(1.9), "took \(elapsed)")
        try await manager.setRateLimit(nil)
        #expect(await manager.configuration.rateLimit == nil)
        await manager.close()
    }

    /// The limiter switched off lets every chunk through at once; switched on again it limits from a full bucket
    /// at most; the rate can change while it is off.
    @Test func limiterSwitchesOffAndOn() {
        let limiter = RateLimiter(bytesPerSecond: 1000, burst: 1000)
        #expect(limiter.take(1000, now: 0) == nil)
        #expect(limiter.take(500, now: 0) != nil, "the bucket is empty")
        limiter.isEnabled = false
        for _ in 0..<100 { #expect(limiter.take(1 << 20, now: 0) == nil) }
        limiter.bytesPerSecond = 2000
        limiter.isEnabled = true
        #expect(limiter.take(500, now: 0) != nil, "on again: still empty at the same instant")
        #expect(limiter.take(500, now: 0.25) == nil, "refilled at the new rate")
        // Off for a long time, then on: at most a full bucket (the burst follows the new rate: 64 KiB).
        limiter.isEnabled = false
        limiter.isEnabled = true
        #expect(limiter.take(Int(limiter.burst), now: 1000) == nil)
        #expect(limiter.take(1, now: 1000) != nil, "more than a full bucket after the pause")
    }

    /// A limiter nested within another passes a chunk only when both have room; when the outer one has none, the
    /// inner one's tokens go back (no byte is counted twice against it).
    @Test func nestedLimiterNeedsRoomInBoth() {
        let all = RateLimiter(bytesPerSecond: 1000, burst: 1000)
        let one = RateLimiter(bytesPerSecond: 10_000, burst: 10_000, within: all)
        #expect(one.isLimiting)
        #expect(one.take(1000, now: 0) == nil)
        #expect(one.take(500, now: 0) != nil, "the outer bucket is empty")
        all.isEnabled = false
        #expect(one.take(9000, now: 0) == nil, "the refused 500 bytes went back to the inner bucket")
        #expect(one.take(1, now: 0) != nil, "and now it is empty")
        one.isEnabled = false
        #expect(!one.isLimiting)
        #expect(one.take(1 << 20, now: 0) == nil)
        all.isEnabled = true
        #expect(one.isLimiting, "the outer limit still applies")
        #expect(one.take(1 << 20, now: 0) != nil)
    }

    /// One download's own limit, set while it runs, applies to it (a lower bound on the time only) and is kept in
    /// the catalog; a limit given when added is too.
    @Test func perDownloadLimitSetWhileRunning() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 640 << 10, seed: 96, etag: "\"d\"")
        f.server.serve("/d.bin", file: file, faults: .onRequest(0, .stallAfter(64 << 10)))
        let manager = try f.open()
        let id = try await manager.add(f.server.url("/d.bin"), options: .init(out: "d.bin"))
        var limited = DownloadManager.AddOptions(out: "other.bin")
        limited.rateLimit = 1 << 20
        limited.paused = true
        let other = try await manager.add(f.server.url("/other.bin"), options: limited)
        let server = f.server
        try #require(await blocking { server.waitForStall() })
        try await manager.setRateLimit(id, 256 << 10)
        #expect(await manager.configuration.rateLimit == nil, "the manager's own limit is untouched")
        let started = ContinuousClock.now
        server.releaseStalls()
        await manager.waitUntilIdle()
        let elapsed = ContinuousClock.now - started
        #expect(await manager.download(id)?.status == .completed)
        expectFile(f.path("d.bin"), file.data)
        #expect(elapsed >= .seconds(1.9), "took \(elapsed)")
        await #expect(throws: DownloadManagerError.self) { try await manager.setRateLimit(id, -1) }
        var bad = DownloadManager.AddOptions(out: "bad.bin")
        bad.rateLimit = 0
        await #expect(throws: DownloadManagerError.self) { try await manager.add(f.server.url("/bad.bin"), options: bad) }
        await manager.close()

        let reopened = try f.open()
        #expect(await reopened.download(id)?.rateLimit == 256 << 10)
        #expect(await reopened.download(other)?.rateLimit == 1 << 20)
        await reopened.close()
    }

    /// A per-host cap lowered while a download runs: that download keeps its connection, and the next one on the
    /// host, wanting four, gets no more than the cap leaves it (its first connection: one request).
    @Test func perHostCapLoweredWhileRunning() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 4 << 20, seed: 93, etag: "\"p\"")
        f.server.serve("/p.bin", file: file)
        f.server.serve("/hold.bin", file: .random(size: 64 << 10, seed: 97), faults: .onRequest(0, .stallAfter(1000)))
        let manager = try f.open {
            $0.minimumSplitSize = 256 << 10
            $0.singleConnectionRate = nil
        }
        let hold = try await manager.add(f.server.url("/hold.bin"), options: .init(out: "hold.bin"))
        let server = f.server
        try #require(await blocking { server.waitForStall() })
        try await manager.setMaxConnectionsPerHost(2)
        #expect(await manager.configuration.maxConnectionsPerHost == 2)
        var options = DownloadManager.AddOptions(out: "p.bin")
        options.connections = 4
        let id = try await manager.add(f.server.url("/p.bin"), options: options)
        await manager.observe(id) { _ in } completion: { _ in }.finished()
        #expect(await eventually { await manager.download(id)?.status == .completed })
        expectFile(f.path("p.bin"), file.data)
        #expect(f.server.requests(for: "/p.bin").count == 1, "one connection: \(f.server.requests.map(\.askedRange))")
        #expect(await manager.download(hold)?.status == .running, "the held download kept its connection")
        server.releaseStalls()
        await manager.waitUntilIdle()
        #expect(await manager.download(hold)?.status == .completed)
        await manager.close()
    }

    // MARK: Progress across pauses

    /// `observe` keeps calling across a pause and a resume and ends only when the download completes.
    @Test func progressLastsAcrossPauseAndResume() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 512 << 10, seed: 94, etag: "\"q\"")
        f.server.serve("/q.bin", file: file, faults: .onRequest(0, .stallAfter(128 << 10)))
        let manager = try f.open()
        let id = try await manager.add(f.server.url("/q.bin"), options: .init(out: "q.bin"))
        let seen = Locked<[Int64]>([])
        let outcome = Locked<DownloadOutcome?>(nil)
        let subscription = await manager.observe(id) { progress in
            seen.withLock { $0.append(progress.bytes) }
        } completion: { result in
            outcome.withLock { $0 = result }
        }
        let server = f.server
        try #require(await blocking { server.waitForStall() })
        try await manager.pause(id)
        server.releaseStalls()
        let pausedAt = seen.withLock { $0.count }
        try await manager.resume(id)
        await subscription.finished()  // ends by itself at completion
        #expect(await manager.download(id)?.status == .completed)
        #expect(try outcome.withLock { $0 }?.get().path == f.path("q.bin"))
        let all = seen.withLock { $0 }
        #expect(all.count > pausedAt, "progress after the resume: \(all)")
        #expect(all.last == Int64(file.data.count))
        expectFile(f.path("q.bin"), file.data)
        await manager.close()
    }

    // MARK: A list in memory

    /// A manager without a directory writes no catalog anywhere; its downloads still keep their state files, so
    /// another in-memory manager adding the same URL to the same place finds the finished file.
    @Test func inMemoryManagerLeavesOnlyTheDownloads() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 100_000, seed: 95, etag: "\"m\"")
        f.server.serve("/m.bin", file: file)
        let manager = try DownloadManager(configuration: f.configuration())
        let id = try await manager.add(f.server.url("/m.bin"), options: .init(out: "m.bin"))
        await manager.waitUntilIdle()
        #expect(await manager.download(id)?.status == .completed)
        await manager.close()
        expectFile(f.path("m.bin"), file.data)
        #expect(!fileExists(f.managerDirectory), "no catalog directory")
        #expect(try FileManager.default.contentsOfDirectory(atPath: f.downloads) == ["m.bin"])

        let again = try DownloadManager(configuration: f.configuration())
        #expect(await again.downloads().isEmpty, "nothing remembered")
        let second = try await again.add(f.server.url("/m.bin"), options: .init(out: "m.bin"))
        await again.waitUntilIdle()
        #expect(await again.download(second)?.status == .completed)
        #expect(f.server.requests(for: "/m.bin").count == 1, "already complete: not fetched again")
        await again.close()
    }
}
