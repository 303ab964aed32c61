import Dispatch
import Foundation
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore

/// ``BlockingSerialExecutor``, and the download manager that runs on it: an actor whose jobs block on the disk (the
/// catalog's synced commits) holds its own thread, never the cooperative pool that every other task needs; its jobs
/// still run one at a time, in the order they came.
@Suite struct BlockingExecutorTests {

    final class Counter: Sendable {
        let value = Atomic<Int>(0)
    }

    /// An actor on a ``BlockingSerialExecutor`` that records how many of its jobs ever ran at once.
    actor Recorder {
        let executor = BlockingSerialExecutor()
        nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
        let inside = Atomic<Int>(0)
        var most = 0
        var seen: [Int] = []

        func record(_ value: Int) {
            let now = inside.add(1, ordering: .acquiringAndReleasing).newValue
            most = max(most, now)
            // Give another thread the chance to run a job of this actor at the same time, if it could.
            for _ in 0..<200 { sched_yield() }
            seen.append(value)
            inside.subtract(1, ordering: .acquiringAndReleasing)
        }
    }

    @Test func jobsRunOneAtATimeAndInOrder() async {
        let recorder = Recorder()
        // From many tasks at once: never two jobs together.
        await withTaskGroup(of: Void.self) { group in
            for value in 0..<200 { group.addTask { await recorder.record(value) } }
        }
        #expect(await recorder.most == 1)
        #expect(await recorder.seen.count == 200)
        // From one task: in the order they were sent.
        let before = await recorder.seen.count
        for value in 1000..<1100 { await recorder.record(value) }
        #expect(await Array(recorder.seen.dropFirst(before)) == Array(1000..<1100))
    }

    /// More managers than the machine has cores, each held in a job as by a disk that takes its time over a sync:
    /// a task on the cooperative pool still runs while all of them wait. On the cooperative pool (the default
    /// executor) the held managers took every thread it has, and the task ran only after they were let go.
    @Test func managersHeldByTheDiskLeaveTheCooperativePoolFree() async throws {
        let count = ProcessInfo.processInfo.activeProcessorCount + 2
        let directory = try TemporaryDirectory()
        let managers = try (0..<count).map { _ in
            try DownloadManager(configuration: .init(downloadDirectory: directory.path))
        }
        let gate = DispatchSemaphore(value: 0)
        let held = Counter()
        let holders = managers.map { manager in
            Task.detached { await manager.holdForTest(gate, held: held) }
        }
        // All of them held, each in one of its jobs (a bound, not a pace: on the old executor this wait itself
        // could not run until the holds ran out).
        let deadline = ContinuousClock.now + .seconds(90)
        while held.value.load(ordering: .acquiring) < count, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(2))
        }
        let allHeld = held.value.load(ordering: .acquiring) == count
        let ranWhileHeld = await Task.detached { held.value.load(ordering: .acquiring) == count }.value
        for _ in 0..<count { gate.signal() }
        var timedOut = 0
        for holder in holders where await holder.value == false { timedOut += 1 }
        #expect(allHeld, "only \(held.value.load(ordering: .acquiring)) of \(count) managers were held at once")
        // `ranWhileHeld` is the check; a hold that ran out (its bound is longer than the wait for all of them, so
        // only a machine stalled for minutes gets there) would make it meaningless.
        #expect(ranWhileHeld, "a task on the cooperative pool waited for the held managers")
        #expect(timedOut == 0, "\(timedOut) holds ran out before all were held")
        for manager in managers { await manager.close() }
    }
}

extension DownloadManager {
    /// Holds this manager in one of its jobs until `gate` is signalled (or 120 s pass: false), as a slow disk sync
    /// would; counts itself in `held` meanwhile.
    fileprivate func holdForTest(_ gate: DispatchSemaphore, held: BlockingExecutorTests.Counter) -> Bool {
        held.value.add(1, ordering: .acquiringAndReleasing)
        let released = gate.wait(timeout: .now() + 120) == .success
        if !released { held.value.subtract(1, ordering: .acquiringAndReleasing) }
        return released
    }
}
