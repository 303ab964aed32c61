import Foundation
import StitchLocks
import StitchTestSupport
import Testing

@testable import Stitch

/// The executor's timing on a clock the test moves (``ManualClock``) and an in-memory server whose bodies come at
/// scripted rates of that clock (``ScriptedTransport``): what the lanes decide depends on virtual time only, not on
/// how loaded the machine is.
@Suite struct LaneTimingTests {
    /// Steps `clock` by `step` until `done()`: before each step, waits (yielding) until every body in flight sleeps
    /// on the clock, so that virtual time never runs ahead of the lanes. Gives up after `limit` virtual seconds.
    static func drive(
        _ clock: ManualClock, _ transport: ScriptedTransport, step: Double, limit: Double,
        until done: @Sendable () -> Bool
    ) async {
        let start = clock.uptime()
        while !done(), clock.uptime() - start < limit {
            // Quiet: as many sleepers as bodies in flight (and one at least), for a run of consecutive looks.
            var quiet = 0
            var looks = 0
            while quiet < 20, looks < 20_000, !done() {
                await Task.yield()
                looks += 1
                let sleeping = clock.sleeping
                quiet = sleeping > 0 && sleeping >= transport.bodiesInFlight ? quiet + 1 : 0
            }
            clock.advance(by: step)
        }
    }

    /// Four lanes; the last quarter's first connection brings 128 KiB/s while the others bring 8 MiB/s. The monitor,
    /// sampling on the clock, replaces that connection while the fast lanes are still running, and the download
    /// ends byte-exact in a few virtual seconds, not the two minutes the slow one would need.
    @Test func aSlowConnectionIsReplacedWhileItsPeersRun() async throws {
        let file = ServedFile.random(size: 64 << 20, seed: 31, etag: "\"lane\"")
        let slowServed = Locked(false)
        let transport = ScriptedTransport(file: file) { request, _ in
            let slow = request.lane == 3 && slowServed.withLock { served in
                defer { served = true }
                return !served
            }
            return slow
                ? .serve(chunks: 4096...4096, rate: 128 * 1024) : .serve(chunks: 65_536...65_536, rate: 8 * 1024 * 1024)
        }
        let clock = ManualClock()
        let events = Locked<[(time: Double, event: DownloadEvent)]>([])
        var options = DownloadOptions()
        options.connections = 4
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
        await Self.drive(clock, transport, step: 0.01, limit: 120) { result.withLock { $0 != nil } }
        _ = await task.result

        let outcome = try #require(result.withLock { $0 })
        let done = try outcome.get()
        let same = try readFile(destination) == file.data
        #expect(same)
        #expect(done.bytes == Int64(file.data.count))
        let replaced = events.withLock { $0 }.filter {
            if case .notice(let text) = $0.event { return text.contains("replacing a slow connection") }
            return false
        }
        let ended = clock.uptime()
        #expect(replaced.count == 1, "\(replaced.map(\.time))")
        // The fast lanes need 16 MiB / 8 MiB/s (2 s): the replacement comes well before, from the monitor's samples
        // (two in a row over half-second windows), not from the end game once the fast lanes are done.
        #expect(replaced.first.map { $0.time > 0.2 && $0.time < 1.2 } == true, "\(replaced.map(\.time))")
        #expect(ended < 5, "the download took \(ended) virtual seconds")
        let laneThree = transport.requests.filter { $0.range != nil }.count
        #expect(laneThree >= 5, "\(transport.requests.map { $0.range ?? "-" })")
        print("LaneTimingTests.slow: replaced at \(replaced.map(\.time)), ended at \(ended) virtual s")
    }
}
