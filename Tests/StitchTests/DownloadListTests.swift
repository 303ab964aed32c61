import Foundation
import Observation
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
import StitchLocks

/// `DownloadList`, the `@Observable` list of a manager's downloads: `withObservationTracking` sees a change when a
/// download is added, progresses and completes (in `downloads` and in `aggregate`), and once a download has
/// completed, been paused (by the manager or by the list), cancelled or removed, the list holds exactly the
/// manager's snapshots in the manager's order. Waits are on observed changes, never on time.
@MainActor @Suite struct DownloadListTests {

    /// Tracking sees a download added, progressing and completing: the server sends the first 200 kB at once and the
    /// rest at 300 kB/s, with no event but progress reports in between, so the list shows more than 500 kB while the
    /// download still runs only if progress reports change it. Completed, the list is the manager's, with the
    /// aggregate of the whole file.
    @Test func changesAreSignalledAsADownloadProgressesAndCompletes() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 1 << 20, seed: 80, etag: "\"list\"")
        f.server.serve(
            "/list.bin", file: file, faults: .onRequest(0, .throttleAfter(200_000, bytesPerSecond: 300_000)))
        let manager = try f.open()
        let list = DownloadList(manager: manager)
        await list.start()
        #expect(list.isFollowing)
        #expect(list.downloads.isEmpty)

        let added = ChangeSignal.arm { _ = list.downloads }
        let aggregated = ChangeSignal.arm { _ = list.aggregate }
        var options = DownloadManager.AddOptions(out: "list.bin")
        options.connections = 1
        let id = try await manager.add(f.server.url("/list.bin"), options: options)
        #expect(await added.wait(), "adding a download signalled no change of downloads")
        #expect(await aggregated.wait(), "adding a download signalled no change of aggregate")

        let midway = await waitUntil {
            list.download(id).map { $0.status == .running && $0.progress.bytes > 500_000 } ?? false
        }
        #expect(midway, "never seen running past 500 kB: \(String(describing: list.download(id)))")
        #expect(list.aggregate.bytes == list.download(id)?.progress.bytes)
        #expect(list.aggregate.running == 1)

        #expect(await waitUntil { list.download(id)?.status == .completed }, "\(String(describing: list.download(id)))")
        #expect(list.downloads == (await manager.downloads()))
        #expect(list.aggregate == (await manager.aggregateProgress()))
        #expect(list.aggregate.fractionCompleted == 1)
        #expect(list.aggregate.completed == 1)
        expectFile(list.download(id)?.path, file.data)
        list.stop()
        #expect(!list.isFollowing)
        await manager.close()
    }

    /// Three downloads: one held running, one added paused, one added through the list that completes. After each
    /// step — a pause by the manager (seen through its events), a removal, a resume and a cancel through the list's
    /// intents (shown when they return), a removal by the manager — the list is the manager's. Stopped, it follows
    /// no more until refreshed.
    @Test func contentsMatchTheManagerAfterEachChange() async throws {
        let f = try ManagerFixture()
        let done = ServedFile.random(size: 64 << 10, seed: 81, etag: "\"done\"")
        f.server.serve("/held.bin", file: .random(size: 512 << 10, seed: 82), faults: .always(.stallAfter(100_000)))
        f.server.serve("/paused.bin", file: .random(size: 64 << 10, seed: 83))
        f.server.serve("/done.bin", file: done)
        let manager = try f.open()
        let list = DownloadList(manager: manager)
        let server = f.server

        var options = DownloadManager.AddOptions(out: "held.bin")
        options.connections = 1
        let held = try await manager.add(server.url("/held.bin"), options: options)
        // Started after a download was added: the list loads it.
        await list.start()
        #expect(list.downloads.map(\.id) == [held])
        options = DownloadManager.AddOptions(out: "paused.bin")
        options.paused = true
        let paused = try await manager.add(server.url("/paused.bin"), options: options)
        let completed = try await list.add(
            try #require(URL(string: server.url("/done.bin"))), options: .init(out: "done.bin"))
        #expect(list.download(completed) != nil, "not in the list when add returned")

        #expect(await blocking { server.waitForStall() })
        #expect(await waitUntil { list.download(completed)?.status == .completed })
        #expect(await waitUntil { list.download(held)?.progress.bytes == 100_000 })
        expectFile(list.download(completed)?.path, done.data)
        #expect(list.downloads.map(\.id) == [held, paused, completed])

        // Paused by the manager: the list follows its events.
        try await manager.pause(held)
        #expect(await waitUntil { list.download(held)?.status == .paused })
        #expect(list.downloads == (await manager.downloads()))
        #expect(list.aggregate == (await manager.aggregateProgress()))
        #expect(list.aggregate.paused == 2 && list.aggregate.completed == 1)

        // The list's intents: their effect shows when they return.
        try await list.remove(paused)
        #expect(list.download(paused) == nil)
        #expect(list.downloads == (await manager.downloads()))
        try await list.resume(held)
        #expect(list.download(held).map { $0.status == .queued || $0.status == .running } == true)
        #expect(await blocking { server.waitForStall() })
        try await list.cancel(held)
        #expect(list.download(held)?.status == .failed(.cancelled))
        #expect(list.downloads == (await manager.downloads()))
        #expect(list.aggregate == (await manager.aggregateProgress()))
        #expect(list.aggregate.failed == 1)

        // Removed by the manager: the list follows.
        let removed = ChangeSignal.arm { _ = list.downloads }
        try await manager.remove(completed)
        #expect(await removed.wait())
        #expect(await waitUntil { list.download(completed) == nil })
        #expect(list.downloads == (await manager.downloads()))
        #expect(list.downloads.map(\.id) == [held])

        list.stop()
        try await manager.remove(held)
        #expect(list.downloads.map(\.id) == [held], "a stopped list changed")
        await list.refresh()
        #expect(list.downloads.isEmpty)
        #expect(list.aggregate == AggregateProgress())
        await manager.close()
    }

    /// Waits until `condition` holds, re-checking it at each change of what it reads; false after `timeout`.
    func waitUntil(timeout: Double = 60, _ condition: @escaping () -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(timeout)
        while !condition() {
            let signal = ChangeSignal.arm { _ = condition() }
            if condition() { return true }
            let left = deadline - ContinuousClock.now
            guard left > .zero, await signal.wait(timeout: left.seconds) else { return condition() }
        }
        return true
    }
}

/// One `withObservationTracking` change: armed on what a closure reads, fired (once) at the first change of it.
final class ChangeSignal: Sendable {
    private struct State {
        var fired = false
        var timedOut = false
        var waiter: CheckedContinuation<Bool, Never>?
    }
    private let state = Locked(State())

    /// Tracks what `read` reads, from now on.
    @MainActor static func arm(_ read: () -> Void) -> ChangeSignal {
        let signal = ChangeSignal()
        withObservationTracking(read) { signal.finish(true) }
        return signal
    }

    private func finish(_ fired: Bool) {
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            if fired { state.fired = true } else { state.timedOut = true }
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: fired || state.withLock { $0.fired })
    }

    /// Whether a change came, waiting up to `timeout` seconds for one.
    func wait(timeout: Double = 60) async -> Bool {
        let timer = Task { [self] in
            try? await Task.sleep(for: .seconds(timeout))
            finish(false)
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { continuation in
            let done = state.withLock { state -> Bool? in
                if state.fired || state.timedOut { return state.fired }
                state.waiter = continuation
                return nil
            }
            if let done { continuation.resume(returning: done) }
        }
    }
}
