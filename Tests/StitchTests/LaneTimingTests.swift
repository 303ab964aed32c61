import Foundation
import StitchLocks
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// The executor's timing on a clock the test moves (``ManualClock``) and an in-memory server whose bodies come at
/// scripted rates of that clock (``ScriptedTransport``): what the lanes decide depends on virtual time only, not on
/// how loaded the machine is.
@Suite struct LaneTimingTests {
    static let fast = 8.0 * 1024 * 1024

    /// Steps `clock` by `step` until `done()`: before each step, waits until something sleeps on the clock and every
    /// response the transport has answered sleeps on it between two chunks (none is being decided on, written, or
    /// about to be received), for a run of consecutive looks, so that virtual time never runs ahead of the lanes; waits up to 10 s
    /// of real time for that (the engine's disk work, on a loaded machine) before stepping anyway. Gives up after
    /// `limit` virtual seconds.
    static func drive(
        _ clock: ManualClock, _ transport: ScriptedTransport, step: Double, limit: Double, startAfter: Int = 0,
        until done: @Sendable () -> Bool
    ) async {
        // No virtual time passes until the transport has seen `startAfter` requests: each lane's first request is
        // made before any other lane's body is paced (a lane whose task a loaded machine ran late would otherwise
        // start after the others had run for a while, and its connection be judged or cut by then).
        let bound = ContinuousClock.now + .seconds(120)
        while !done(), transport.requests.count < startAfter {
            guard ContinuousClock.now < bound else {
                Issue.record("only \(transport.requests.count) of \(startAfter) requests were made with the clock stopped")
                break
            }
            try? await Task.sleep(for: .milliseconds(1))
        }
        let start = clock.uptime()
        while !done(), clock.uptime() - start < limit {
            var quiet = 0
            let patience = ContinuousClock.now + .seconds(10)
            while quiet < 50, ContinuousClock.now < patience, !done() {
                await Task.yield()
                quiet = transport.allResponsesAsleep && clock.sleeping > 0 ? quiet + 1 : 0
                if quiet == 0 { try? await Task.sleep(for: .microseconds(200)) }
            }
            clock.advance(by: step)
        }
    }

    /// What ``run(_:options:)`` saw.
    struct Run {
        var result: Result<DownloadResult, DownloadError>
        var events: [(time: Double, event: DownloadEvent)]
        /// Virtual seconds from the start to the end.
        var ended: Double
        /// The file at the destination afterwards.
        var bytes: [UInt8]?

        var notices: [(time: Double, text: String)] {
            events.compactMap {
                if case .notice(let text) = $0.event { return ($0.time, text) }
                return nil
            }
        }
    }

    /// Downloads the transport's file on a fresh ``ManualClock``, stepping it by 10 ms (``drive``).
    /// No virtual time passes before `startAfter` requests are made (by default the whole file's and each lane's).
    static func run(_ transport: ScriptedTransport, options: DownloadOptions, startAfter: Int? = nil) async throws -> Run {
        let clock = ManualClock()
        let events = Locked<[(time: Double, event: DownloadEvent)]>([])
        let directory = try TemporaryDirectory()
        let destination = directory.path + "/file.bin"
        let request = DownloadRequest(url: "http://scripted.test/file.bin", destination: .file(destination))
        let result = Locked<Result<DownloadResult, DownloadError>?>(nil)
        let task = Task {
            let outcome: Result<DownloadResult, DownloadError>
            do {
                outcome = .success(
                    try await Downloader(transport: transport, clock: clock).download(request, options: options) {
                        event in events.withLock { $0.append((clock.uptime(), event)) }
                    })
            } catch let error as DownloadError {
                outcome = .failure(error)
            } catch {
                outcome = .failure(DownloadError(.cancelled, "\(error)"))
            }
            result.withLock { $0 = outcome }
        }
        // The request for the whole file, then one per lane.
        await drive(clock, transport, step: 0.01, limit: 300, startAfter: startAfter ?? 1 + (options.connections ?? 1)) {
            result.withLock { $0 != nil }
        }
        _ = await task.result
        let outcome = try #require(result.withLock { $0 })
        return Run(
            result: outcome, events: events.withLock { $0 }, ended: clock.uptime(),
            bytes: try? readFile(destination))
    }

    /// A script whose first request of `lane` gets `first`, every other request a fast body.
    static func firstOfLane(_ lane: Int, _ first: ScriptedTransport.Answer) -> @Sendable (TransportRequest, Int)
        -> ScriptedTransport.Answer
    {
        let served = Locked(false)
        return { request, _ in
            let isFirst = request.lane == lane && served.withLock { served in
                defer { served = true }
                return !served
            }
            return isFirst ? first : .serve(chunks: 65_536...65_536, rate: Self.fast)
        }
    }

    /// Four lanes; the last quarter's first connection brings 128 KiB/s while the others bring 8 MiB/s. The monitor,
    /// sampling on the clock, replaces that connection while the fast lanes are still running, and the download
    /// ends byte-exact in a few virtual seconds, not the two minutes the slow one would need.
    @Test func aSlowConnectionIsReplacedWhileItsPeersRun() async throws {
        let file = ServedFile.random(size: 64 << 20, seed: 31, etag: "\"lane\"")
        let transport = ScriptedTransport(
            file: file, script: Self.firstOfLane(3, .serve(chunks: 4096...4096, rate: 128 * 1024)))
        var options = DownloadOptions()
        options.connections = 4
        let run = try await Self.run(transport, options: options)

        let done = try run.result.get()
        let same = run.bytes == file.data
        #expect(same)
        #expect(done.bytes == Int64(file.data.count))
        let replaced = run.notices.filter { $0.text.contains("replacing a slow connection") }
        #expect(replaced.count == 1, "\(replaced.map(\.time))")
        // The fast lanes need 16 MiB / 8 MiB/s (2 s): the replacement comes well before, from the monitor's samples
        // (two in a row over half-second windows), not from the end game once the fast lanes are done.
        #expect(replaced.first.map { $0.time > 0.2 && $0.time < 1.2 } == true, "\(replaced.map(\.time))")
        #expect(run.ended < 5, "the download took \(run.ended) virtual seconds")
        #expect(transport.requests.filter { $0.range != nil }.count >= 5, "\(transport.requests.map(\.range))")
        print("LaneTimingTests.slow: replaced at \(replaced.map(\.time)), ended at \(run.ended) virtual s")
    }

    /// The end game on a stalled connection: lane 0 stalls after 100,000 bytes while the other three bring their
    /// 3 MiB at 8 MiB/s. Its connection is cut and the rest of its segment taken from exactly where its bytes stop,
    /// in well under a second of virtual time (the stall timeout is a minute); no byte is delivered twice.
    @Test func aStalledSegmentIsTakenOverFromWhereItsBytesStop() async throws {
        let size = 12 << 20
        let file = ServedFile.random(size: size, seed: 32, etag: "\"stall\"")
        let transport = ScriptedTransport(file: file, script: Self.firstOfLane(0, .stall(after: 100_000, rate: Self.fast)))
        var options = DownloadOptions()
        options.connections = 4
        options.minimumSplitSize = 256 << 10
        options.transport.stallTimeout = 60
        let run = try await Self.run(transport, options: options)

        let done = try run.result.get()
        let same = run.bytes == file.data
        #expect(same)
        #expect(done.bytes == Int64(size))
        #expect(run.ended < 1.5, "the download took \(run.ended) virtual seconds")
        let requests = transport.requests
        // The whole-file request is answered at its head (the split), the stalled one gave 100,000 bytes.
        let stalled = try #require(requests.first { $0.range?.hasPrefix("bytes=0-") == true })
        #expect(stalled.delivered == 100_000)
        #expect(requests.contains { $0.range?.hasPrefix("bytes=100000-") == true }, "\(requests.map(\.range))")
        #expect(transport.bytesDelivered == size, "\(transport.bytesDelivered) bytes delivered for \(size)")
        #expect(done.bytesTransferred == Int64(size))
        print("LaneTimingTests.stall: ended at \(run.ended) virtual s, \(requests.count) requests")
    }

    /// The end game on a slower, still moving connection: lane 3 brings 3 MiB/s while the other three bring their
    /// 4 MiB at 8 MiB/s, not slow enough next to them to be replaced. Once they are done (half a virtual second), it
    /// has more than half a second left, so idle lanes take over the end of its segment and the download ends well
    /// before the 1.33 s that lane alone would need. Each byte is written once; the cut request dropped at most the
    /// one chunk that crossed its new end.
    @Test func idleLanesTakeOverTheEndOfASlowerSegment() async throws {
        let size = 16 << 20
        let file = ServedFile.random(size: size, seed: 33, etag: "\"steal\"")
        let transport = ScriptedTransport(
            file: file, script: Self.firstOfLane(3, .serve(chunks: 65_536...65_536, rate: 3 * 1024 * 1024)))
        var options = DownloadOptions()
        options.connections = 4
        let run = try await Self.run(transport, options: options)

        let done = try run.result.get()
        let same = run.bytes == file.data
        #expect(same)
        #expect(!run.notices.contains { $0.text.contains("replacing a slow connection") }, "\(run.notices)")
        let quarter = size / 4
        let ranges = transport.requests.compactMap(\.range)
        let slow = try #require(transport.requests.first { $0.range?.hasPrefix("bytes=\(3 * quarter)-") == true })
        #expect(slow.delivered < quarter, "the slow request was not cut: \(slow.delivered) bytes")
        // Later requests inside the slow segment, from past where its bytes had got to.
        let steals = ranges.filter { range in
            guard let start = Int(range.dropFirst(6).prefix { $0 != "-" }) else { return false }
            return start > 3 * quarter + slow.delivered / 2 && start < size
        }
        #expect(!steals.isEmpty, "no steal: \(ranges)")
        #expect(run.ended < 1.2, "the download took \(run.ended) virtual seconds")
        #expect(done.bytesTransferred == Int64(size))
        #expect(done.bytesDiscarded <= 65_536 * Int64(steals.count), "\(done.bytesDiscarded) dropped")
        print("LaneTimingTests.steal: \(ranges), ended at \(run.ended) virtual s, \(done.bytesDiscarded) dropped")
    }

    /// A rate limit shared by four lanes: 16 MiB at 4 MiB/s takes four virtual seconds (less the limiter's burst),
    /// however fast each connection could go, and no connection is judged slow or replaced for it.
    @Test func aRateLimitHoldsEveryLaneToItsShare() async throws {
        let size = 16 << 20
        let rate: Int64 = 4 << 20
        let burst: Int64 = 256 << 10
        let file = ServedFile.random(size: size, seed: 34, etag: "\"rate\"")
        let transport = ScriptedTransport(file: file) { _, _ in .serve(chunks: 65_536...65_536, rate: Self.fast) }
        var options = DownloadOptions()
        options.connections = 4
        options.rateLimiter = RateLimiter(bytesPerSecond: rate, burst: burst)
        let run = try await Self.run(transport, options: options)

        let done = try run.result.get()
        let same = run.bytes == file.data
        #expect(same)
        let least = Double(Int64(size) - burst) / Double(rate)
        #expect(run.ended >= least - 0.05 && run.ended <= Double(size) / Double(rate) + 0.5,
            "16 MiB at 4 MiB/s took \(run.ended) virtual seconds")
        #expect(!run.notices.contains { $0.text.contains("replacing") }, "\(run.notices)")
        #expect(done.bytesTransferred == Int64(size))
        print("LaneTimingTests.rate: ended at \(run.ended) virtual s, \(transport.requests.count) requests")
    }

    /// One connection that stalls after 100,000 bytes: nothing else can take its bytes over, so the stall timeout
    /// (30 s of the clock) ends it, the engine says it retries and waits its backoff on the same clock, and the
    /// next request asks for the rest from exactly where the bytes stop. Byte-exact, in about 30 virtual seconds.
    @Test func aLoneStalledConnectionTimesOutAndResumes() async throws {
        let size = 2 << 20
        let file = ServedFile.random(size: size, seed: 35, etag: "\"lone\"")
        let transport = ScriptedTransport(file: file) { _, index in
            index == 0 ? .stall(after: 100_000, rate: Self.fast) : .serve(rate: Self.fast)
        }
        var options = DownloadOptions()
        options.connections = 1
        options.transport.stallTimeout = 30
        let run = try await Self.run(transport, options: options, startAfter: 1)

        let done = try run.result.get()
        let same = run.bytes == file.data
        #expect(same)
        let retries = run.events.compactMap { entry -> (Double, String)? in
            if case .retrying(_, _, _, let reason) = entry.event { return (entry.time, reason) }
            return nil
        }
        #expect(retries.count == 1, "\(retries)")
        if let (time, reason) = retries.first {
            #expect(time >= 30 && time < 30.5, "the stall was given up at \(time) virtual s")
            #expect(reason.contains("no byte in 30"), "\(reason)")
        }
        #expect(transport.requests.map(\.range) == [nil, "bytes=100000-"])
        #expect(transport.requests.first?.delivered == 100_000)
        #expect(run.ended >= 30 && run.ended < 40, "ended at \(run.ended) virtual s")
        #expect(done.bytesTransferred == Int64(size) && done.resumedFrom == 0)
        print("LaneTimingTests.lone stall: \(retries), ended at \(run.ended) virtual s")
    }
}
