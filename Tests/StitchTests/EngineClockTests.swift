import Dispatch
import Foundation
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore

/// The shared clock of progress ticks and timed checkpoints (``EngineClock``), and the checkpointer's stop that
/// needs no other thread when no checkpoint runs.
@Suite struct EngineClockTests {
    /// Counts ticks and lets a test wait for the n-th one.
    final class Ticks: Sendable {
        private let count = Atomic<Int>(0)
        private let signal = DispatchSemaphore(value: 0)
        var value: Int { count.load(ordering: .acquiring) }
        func tick() {
            count.add(1, ordering: .releasing)
            signal.signal()
        }
        /// Waits for `n` more ticks; false after 30 s.
        func wait(_ n: Int) -> Bool {
            (0..<n).allSatisfy { _ in signal.wait(timeout: .now() + 30) == .success }
        }
    }

    /// Timers repeat until cancelled; a short timer registered while the clock sleeps for a far one still fires
    /// (the registration wakes it); a cancelled timer never starts again.
    @Test func timersRepeatWakeTheClockAndStopWhenCancelled() async throws {
        let clock = EngineClock()
        let far = Ticks()
        let farTimer = clock.every(3_600) { far.tick() }
        defer { farTimer.cancel() }
        let near = Ticks()
        let nearTimer = clock.every(0.005) { near.tick() }
        #expect(await blocking { near.wait(3) }, "a 5 ms timer registered beside a 1 h one did not fire")
        let cancelled = Ticks()
        let cancelledTimer = clock.every(0.002) { cancelled.tick() }
        #expect(await blocking { cancelled.wait(2) })
        cancelledTimer.cancel()
        // A tick already taken when it was cancelled may still run once; none after the near timer's next two.
        let atCancel = cancelled.value
        #expect(await blocking { near.wait(2) })
        let settled = cancelled.value
        #expect(settled <= atCancel + 1)
        #expect(await blocking { near.wait(2) })
        #expect(cancelled.value == settled, "a cancelled timer fired again")
        nearTimer.cancel()
        #expect(clock.count == 1)
        #expect(far.value == 0)
    }

    /// A checkpointer stopped while no checkpoint runs says so at once, so a finishing download needs no thread to
    /// wait on; a checkpoint that ran before the stop is complete when the blocking stop returns.
    @Test func idleCheckpointerStopsWithoutWaiting() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: Validators(etag: "\"e\"", lastModified: nil, date: nil, totalLength: 100_000, acceptRanges: true))
        defer { store.unlock() }
        let idle = Checkpointer(store: store, interval: 3_600)
        #expect(idle.stopIfIdle())
        #expect(idle.stopIfIdle())
        idle.stop()
        #expect(!fileExists(paths.state), "a small download's state is written at its first checkpoint only")

        let poked = Checkpointer(store: store, interval: 3_600)
        poked.poke()
        poked.stop()
        // The poke either ran before the stop (and the state is there) or saw the stop; both are final now.
        let after = fileExists(paths.state)
        #expect(poked.stopIfIdle())
        #expect(fileExists(paths.state) == after)
    }
}
