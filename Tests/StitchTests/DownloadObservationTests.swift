import Dispatch
import Foundation
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
import StitchLocks

/// `DownloadManager.observe(_:isolation:progress:completion:)`: the closures run on the actor the caller chose (its
/// own by default: an actor's, a global actor's, the main actor's; or one passed as `isolation:`), progress comes
/// in order and ends with the whole file, the completion comes exactly once with the file's path — or at once for a
/// download that has ended, with the failure for a cancelled, removed or unknown download or a closed manager — and
/// a cancelled observation makes no call afterwards. Each actor runs its jobs on an executor that marks its thread,
/// so every call checks where it ran.
@Suite struct DownloadObservationTests {

    /// An actor (the observing one by its own isolation) that records every call and where it ran.
    actor Watcher {
        let executor = MarkedExecutor("Watcher")
        nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

        var progress: [TransferProgress] = []
        var outcomes: [DownloadOutcome] = []
        /// For each call, in order: whether it ran on this actor's executor.
        var onActor: [Bool] = []

        /// Observes download `id` from this actor: the default isolation is this actor.
        func watch(_ manager: DownloadManager, _ id: DownloadID) async -> DownloadObservation {
            await manager.observe(id) { report in
                self.onActor.append(self.executor.isCurrent)
                self.assertIsolated()
                self.progress.append(report)
            } completion: { outcome in
                self.onActor.append(self.executor.isCurrent)
                self.assertIsolated()
                self.outcomes.append(outcome)
            }
        }

        var calls: Int { onActor.count }
    }

    /// The calls of an observation whose closures are not an actor's own (a global actor's, or an actor passed as
    /// `isolation:`), and where they ran.
    final class CallLog: Sendable {
        struct State {
            var progress: [TransferProgress] = []
            var outcomes: [DownloadOutcome] = []
            var onActor: [Bool] = []
        }
        private let state = Locked(State())

        func progress(_ report: TransferProgress, onActor: Bool) {
            state.withLock {
                $0.progress.append(report)
                $0.onActor.append(onActor)
            }
        }

        func completion(_ outcome: DownloadOutcome, onActor: Bool) {
            state.withLock {
                $0.outcomes.append(outcome)
                $0.onActor.append(onActor)
            }
        }

        var current: State { state.withLock { $0 } }
    }

    // MARK: Where the calls run

    /// From an actor's method, without saying where: every call runs on that actor; progress grows to the whole file
    /// (one report seen mid-way, while the server holds the rest back), and the one completion has the file.
    @Test func callsRunOnTheCallingActor() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 1 << 20, seed: 41, etag: "\"watched\"")
        f.server.serve("/watched.bin", file: file, faults: .onRequest(0, .stallAfter(400_000)))
        let manager = try f.open()
        var options = DownloadManager.AddOptions(out: "watched.bin")
        options.connections = 1
        let id = try await manager.add(f.server.url("/watched.bin"), options: options)
        let watcher = Watcher()
        let observation = await watcher.watch(manager, id)

        let server = f.server
        #expect(await blocking { server.waitForStall() }, "the server never reached the stall")
        let midway = await eventually(timeout: 60) {
            await watcher.progress.contains { $0.bytes > 0 && $0.bytes < Int64(file.data.count) }
        }
        let held = await watcher.progress.map(\.bytes)
        #expect(midway, "no progress report while the transfer was held: \(held)")
        server.releaseStalls()
        #expect(await eventually(timeout: 60) { await !watcher.outcomes.isEmpty }, "no completion")
        await observation.finished()

        let onActor = await watcher.onActor
        #expect(!onActor.isEmpty && onActor.allSatisfy { $0 }, "calls off the actor: \(onActor)")
        try await expectCompleted(
            progress: watcher.progress, outcomes: watcher.outcomes, path: f.path("watched.bin"), file: file)
        #expect(!observation.isCancelled)
        await manager.close()
    }

    /// From a function isolated to a global actor (with its own executor): every call runs on that global actor.
    @ObserverActor @Test func callsRunOnTheCallingGlobalActor() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 512 << 10, seed: 42, etag: "\"global\"")
        f.server.serve("/global.bin", file: file)
        f.server.throttle = 2_000_000
        let manager = try f.open()
        let id = try await manager.add(f.server.url("/global.bin"), options: .init(out: "global.bin"))
        let log = CallLog()
        let observation = await manager.observe(id) { report in
            log.progress(report, onActor: ObserverActor.shared.executor.isCurrent)
        } completion: { outcome in
            log.completion(outcome, onActor: ObserverActor.shared.executor.isCurrent)
        }
        #expect(await eventually(timeout: 60) { @Sendable in !log.current.outcomes.isEmpty }, "no completion")
        await observation.finished()
        let calls = log.current
        #expect(
            !calls.onActor.isEmpty && calls.onActor.allSatisfy { $0 }, "calls off the global actor: \(calls.onActor)")
        try expectCompleted(progress: calls.progress, outcomes: calls.outcomes, path: f.path("global.bin"), file: file)
        await manager.close()
    }

    /// From a nonisolated caller that names an actor as `isolation:`: every call runs on that actor.
    @Test func callsRunOnTheActorPassedAsIsolation() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 512 << 10, seed: 43, etag: "\"passed\"")
        f.server.serve("/passed.bin", file: file)
        f.server.throttle = 2_000_000
        let manager = try f.open()
        let id = try await manager.add(f.server.url("/passed.bin"), options: .init(out: "passed.bin"))
        let watcher = Watcher()
        let log = CallLog()
        let observation = await manager.observe(id, isolation: watcher) { report in
            log.progress(report, onActor: watcher.executor.isCurrent)
        } completion: { outcome in
            log.completion(outcome, onActor: watcher.executor.isCurrent)
        }
        #expect(await eventually(timeout: 60) { !log.current.outcomes.isEmpty }, "no completion")
        await observation.finished()
        let calls = log.current
        #expect(!calls.onActor.isEmpty && calls.onActor.allSatisfy { $0 }, "calls off the actor: \(calls.onActor)")
        try expectCompleted(progress: calls.progress, outcomes: calls.outcomes, path: f.path("passed.bin"), file: file)
        await manager.close()
    }

    /// From the main actor (a view model's case): every call runs on the main actor. `MainActor.assertIsolated()`
    /// traps off it (the main actor's jobs need not run on the main thread here, so `Thread.isMainThread` says
    /// nothing); the closures also touch the test's main-actor state without a hop.
    @MainActor @Test func callsRunOnTheMainActor() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 512 << 10, seed: 44, etag: "\"main\"")
        f.server.serve("/main.bin", file: file)
        f.server.throttle = 2_000_000
        let manager = try f.open()
        let id = try await manager.add(f.server.url("/main.bin"), options: .init(out: "main.bin"))
        var progress: [TransferProgress] = []
        var outcomes: [DownloadOutcome] = []
        let observation = await manager.observe(id) { report in
            MainActor.assertIsolated()
            progress.append(report)
        } completion: { outcome in
            MainActor.assertIsolated()
            outcomes.append(outcome)
        }
        await observation.finished()
        try expectCompleted(progress: progress, outcomes: outcomes, path: f.path("main.bin"), file: file)
        await manager.close()
    }

    // MARK: How observations end

    /// A download that has ended is reported at once: a completed one with its whole progress and its file, an
    /// unknown one as a `.cancelled` failure without any progress.
    @Test func endedDownloadsReportAtOnce() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 64 << 10, seed: 45, etag: "\"done\"")
        f.server.serve("/done.bin", file: file)
        let manager = try f.open()
        let id = try await manager.add(f.server.url("/done.bin"), options: .init(out: "done.bin"))
        await manager.waitUntilIdle()
        #expect(await manager.download(id)?.status == .completed)

        let done = Watcher()
        await done.watch(manager, id).finished()
        #expect(await done.progress.map(\.bytes) == [Int64(file.data.count)])
        try await expectCompleted(
            progress: done.progress, outcomes: done.outcomes, path: f.path("done.bin"), file: file)

        let unknown = Watcher()
        await unknown.watch(manager, DownloadID(rawValue: 0x5eed)).finished()
        #expect(await unknown.progress.isEmpty)
        let outcomes = await unknown.outcomes
        #expect(outcomes.count == 1)
        #expect(failure(outcomes.first)?.code == .cancelled)
        #expect(failure(outcomes.first)?.isResumable == false)
        #expect(await unknown.onActor.allSatisfy { $0 })
        await manager.close()
    }

    /// Cancelling a download, removing one and closing the manager each end an observation with one completion:
    /// the cancel's failure (resumable), a not resumable `.cancelled` for the removal and for the close.
    @Test func cancelRemoveAndCloseEndObservations() async throws {
        let f = try ManagerFixture()
        f.server.serve("/rest.bin", file: .random(size: 64 << 10, seed: 46))
        let manager = try f.open()
        var ids: [DownloadID] = []
        for name in ["cancelled", "removed", "closed"] {
            var options = DownloadManager.AddOptions(out: name + ".bin")
            options.paused = true
            ids.append(try await manager.add(f.server.url("/rest.bin"), options: options))
        }
        let watchers = [Watcher(), Watcher(), Watcher()]
        var observations: [DownloadObservation] = []
        for (watcher, id) in zip(watchers, ids) { observations.append(await watcher.watch(manager, id)) }
        // The first call, with the paused download's progress, comes at once.
        for watcher in watchers {
            #expect(await eventually(timeout: 30) { await watcher.progress.count == 1 })
        }

        try await manager.cancel(ids[0])
        await observations[0].finished()
        #expect(await watchers[0].outcomes.count == 1)
        #expect(failure(await watchers[0].outcomes.first) == .cancelled)

        try await manager.remove(ids[1])
        await observations[1].finished()
        #expect(await watchers[1].outcomes.count == 1)
        let removed = failure(await watchers[1].outcomes.first)
        #expect(removed?.code == .cancelled && removed?.isResumable == false, "\(String(describing: removed))")

        await manager.close()
        await observations[2].finished()
        #expect(await watchers[2].outcomes.count == 1)
        #expect(failure(await watchers[2].outcomes.first)?.code == .cancelled)

        for watcher in watchers {
            #expect(await watcher.progress.count == 1)
            #expect(await watcher.onActor.allSatisfy { $0 })
        }
    }

    /// Once `cancel()` returns on the observing actor, no call comes: not the progress of the rest of the transfer,
    /// not the completion.
    @Test func cancelledObservationMakesNoMoreCalls() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 1 << 20, seed: 47, etag: "\"cut\"")
        f.server.serve("/cut.bin", file: file, faults: .onRequest(0, .stallAfter(300_000)))
        let manager = try f.open()
        var options = DownloadManager.AddOptions(out: "cut.bin")
        options.connections = 1
        let id = try await manager.add(f.server.url("/cut.bin"), options: options)
        let watcher = Watcher()
        let observation = await watcher.watch(manager, id)
        let server = f.server
        #expect(await blocking { server.waitForStall() })
        #expect(await eventually(timeout: 60) { await watcher.progress.contains { $0.bytes > 0 } })

        // Cancelled on the watcher's actor, so that the count read after it is the last.
        let callsAtCancel = await watcher.cancelling(observation)
        server.releaseStalls()
        await observation.finished()
        await manager.waitUntilIdle()
        #expect(await manager.download(id)?.status == .completed)
        expectFile(f.path("cut.bin"), file.data)
        #expect(observation.isCancelled)
        let reported = await watcher.progress.map(\.bytes)
        #expect(await watcher.calls == callsAtCancel, "calls after cancel: \(reported)")
        #expect(await watcher.outcomes.isEmpty)
        await manager.close()
    }

    // MARK: Helpers

    /// One completion, a success with the file at `path` holding `file`; progress never goes back and ends at the
    /// whole file.
    func expectCompleted(
        progress: [TransferProgress], outcomes: [DownloadOutcome], path: String, file: ServedFile,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let bytes = progress.map(\.bytes)
        #expect(!bytes.isEmpty, "no progress", sourceLocation: sourceLocation)
        #expect(
            zip(bytes, bytes.dropFirst()).allSatisfy { $0 <= $1 }, "progress went back: \(bytes)",
            sourceLocation: sourceLocation)
        #expect(progress.last?.bytes == Int64(file.data.count), sourceLocation: sourceLocation)
        #expect(progress.last?.total == Int64(file.data.count), sourceLocation: sourceLocation)
        #expect(progress.last?.fractionCompleted == 1, sourceLocation: sourceLocation)
        #expect(outcomes.count == 1, "\(outcomes.count) completions", sourceLocation: sourceLocation)
        let snapshot = try #require(try outcomes.first?.get(), sourceLocation: sourceLocation)
        #expect(snapshot.status == .completed, sourceLocation: sourceLocation)
        #expect(snapshot.path == path, sourceLocation: sourceLocation)
        expectFile(snapshot.path, file.data, sourceLocation: sourceLocation)
    }

    func failure(_ outcome: DownloadOutcome?) -> DownloadFailure? {
        if case .failure(let failure) = outcome { failure } else { nil }
    }
}

extension DownloadObservationTests.Watcher {
    /// Cancels `observation` on this actor and returns the calls made until then.
    func cancelling(_ observation: DownloadObservation) -> Int {
        observation.cancel()
        return calls
    }
}

/// A global actor whose jobs run on an executor that marks its thread.
@globalActor actor ObserverActor {
    static let shared = ObserverActor()
    let executor = MarkedExecutor("ObserverActor")
    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
}

/// A serial executor that runs its jobs on its own dispatch queue and marks the thread while one runs, so that code
/// can tell (without trapping, as `assertIsolated()` would) whether it runs there.
final class MarkedExecutor: SerialExecutor {
    let name: String
    private let queue: DispatchQueue

    init(_ name: String) {
        self.name = name
        self.queue = DispatchQueue(label: "stitch.test." + name)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        let name = self.name
        queue.async {
            Thread.current.threadDictionary[Self.key] = name
            job.runSynchronously(on: executor)
            Thread.current.threadDictionary[Self.key] = nil
        }
    }

    /// Whether the calling code runs in one of this executor's jobs.
    var isCurrent: Bool { Thread.current.threadDictionary[Self.key] as? String == name }

    private static let key = "stitch.test.executor"
}
