import Dispatch
import Foundation
import Synchronization

/// Runs durable checkpoints off the transport thread: every `interval` seconds, or sooner when poked
/// (the sink pokes it every `checkpointBytes`). A failure (disk full while writing the state) is kept for
/// the sink, which then aborts the transfer.
///
/// Each download has a serial Dispatch queue rather than a thread of its own: starting a thread per download
/// was a measurable part of fetching thousands of small files; Dispatch reuses its threads, and the queues
/// still let several downloads sync at once.
final class Checkpointer: Sendable {
    private let store: PartStore
    private let queue: DispatchQueue
    /// Set once in `init`; only cancelled afterwards.
    private nonisolated(unsafe) let timer: any DispatchSourceTimer
    private let stopped = Atomic<Bool>(false)
    private let pending = Atomic<Bool>(false)
    let hasFailed = Atomic<Bool>(false)
    private let failure = Mutex<DownloadError?>(nil)

    init(store: PartStore, interval: Double) {
        self.store = store
        // A serial queue of its own (Dispatch's overcommitting root queue): a checkpoint blocks in fdatasync,
        // and the global queues run no more threads than cores on Linux, so many downloads would queue their
        // checkpoints behind each other.
        let queue = DispatchQueue(label: "stitch.checkpoint")
        self.queue = queue
        let timer = DispatchSource.makeTimerSource(queue: queue)
        self.timer = timer
        let period = DispatchTimeInterval.milliseconds(max(1, Int(interval * 1000)))
        timer.schedule(deadline: .now() + period, repeating: period, leeway: .milliseconds(20))
        timer.setEventHandler { [weak self] in self?.checkpoint() }
        timer.activate()
    }

    var error: DownloadError? { failure.withLock { $0 } }

    /// Asks for a checkpoint soon. Pokes while one is pending collapse into it.
    func poke() {
        guard !pending.exchange(true, ordering: .acquiringAndReleasing) else { return }
        queue.async { [weak self] in self?.checkpoint() }
    }

    /// Stops the timer and waits for a checkpoint in progress; no checkpoint runs after this returns.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        timer.cancel()
        queue.sync {}
    }

    private func checkpoint() {
        pending.store(false, ordering: .releasing)
        guard !stopped.load(ordering: .acquiring) else { return }
        do {
            try store.checkpoint()
        } catch {
            failure.withLock { $0 = error }
            hasFailed.store(true, ordering: .releasing)
        }
    }

    deinit {
        if !stopped.load(ordering: .acquiring) { timer.cancel() }
    }
}
