import Dispatch
import Foundation
import Synchronization

/// Runs durable checkpoints off the transport thread: every `interval` seconds, or sooner when poked
/// (the sink pokes it every `checkpointBytes`). A failure (disk full while writing the state) is kept for
/// the sink, which then aborts the transfer.
final class Checkpointer: Sendable {
    private let store: PartStore
    private let interval: Double
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let stopped = Atomic<Bool>(false)
    let hasFailed = Atomic<Bool>(false)
    private let failure = Mutex<DownloadError?>(nil)

    init(store: PartStore, interval: Double) {
        self.store = store
        self.interval = interval
        let thread = Thread { [self] in self.run() }
        thread.name = "stitch.checkpoint"
        thread.start()
    }

    var error: DownloadError? { failure.withLock { $0 } }

    /// Asks for a checkpoint soon. Pokes while one is pending collapse into it.
    func poke() {
        if !pending.exchange(true, ordering: .acquiringAndReleasing) { wake.signal() }
    }

    private let pending = Atomic<Bool>(false)

    /// Stops the thread and waits for it; no checkpoint runs after this returns.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        wake.signal()
        finished.wait()
    }

    private func run() {
        while !stopped.load(ordering: .acquiring) {
            _ = wake.wait(timeout: .now() + interval)
            pending.store(false, ordering: .releasing)
            if stopped.load(ordering: .acquiring) { break }
            do {
                try store.checkpoint()
            } catch {
                failure.withLock { $0 = error }
                hasFailed.store(true, ordering: .releasing)
            }
        }
        finished.signal()
    }
}
