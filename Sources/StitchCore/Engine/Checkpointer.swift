import Dispatch
import Foundation
import Synchronization
import StitchLocks

/// Runs durable checkpoints off the transport thread: every `interval` seconds, or sooner when poked
/// (the sink pokes it every `checkpointBytes`). A failure (disk full while writing the state) is kept for
/// the sink, which then aborts the transfer.
///
/// Each download has a serial Dispatch queue rather than a thread of its own: starting a thread per download
/// was a measurable part of fetching thousands of small files; Dispatch reuses its threads, and the queues
/// still let several downloads sync at once. The interval is kept by the download's clock (the shared timer thread) (arming a
/// Dispatch timer per download woke a thread twice for downloads that end before their first checkpoint).
final class Checkpointer: Sendable {
    private let store: PartStore
    private let timer: any ClockTimer
    private let stopped = Atomic<Bool>(false)
    /// Set while a checkpoint that has seen `stopped` false runs (see ``stopIfIdle()``).
    private let running = Atomic<Bool>(false)
    private let trigger: Trigger
    let hasFailed = Atomic<Bool>(false)
    private let failure = Locked<DownloadError?>(nil)

    /// What the clock's thread and the sink hold: the queue, the pending flag and a weak reference to the
    /// checkpointer, resolved only on the queue — so the clock's thread never holds the last reference to a
    /// checkpointer (whose deinit would then run there).
    private final class Trigger: Sendable {
        let queue: DispatchQueue
        let pending = Atomic<Bool>(false)
        private let target = Locked<WeakReference>(WeakReference())

        struct WeakReference {
            weak var checkpointer: Checkpointer?
        }

        init(queue: DispatchQueue) { self.queue = queue }

        func attach(_ checkpointer: Checkpointer) { target.withLock { $0.checkpointer = checkpointer } }

        /// Asks for a checkpoint soon. Pokes while one is pending collapse into it.
        func poke() {
            guard !pending.exchange(true, ordering: .acquiringAndReleasing) else { return }
            queue.async { [self] in target.withLock { $0.checkpointer }?.checkpoint() }
        }
    }

    init(store: PartStore, interval: Double, clock: any DownloadClock = SystemClock()) {
        self.store = store
        // A serial queue of its own (Dispatch's overcommitting root queue): a checkpoint blocks in fdatasync,
        // and the global queues run no more threads than cores on Linux, so many downloads would queue their
        // checkpoints behind each other.
        let trigger = Trigger(queue: DispatchQueue(label: "stitch.checkpoint"))
        self.trigger = trigger
        timer = clock.every(interval) { trigger.poke() }
        trigger.attach(self)
    }

    var error: DownloadError? { failure.withLock { $0 } }

    /// Asks for a checkpoint soon. Pokes while one is pending collapse into it.
    func poke() { trigger.poke() }

    /// Stops the timer and waits for a checkpoint in progress; no checkpoint runs after this returns. May block
    /// (a checkpoint syncs): not on a cooperative thread.
    func stop() {
        guard !stopIfIdle() else { return }
        trigger.queue.sync {}
    }

    /// Stops the timer; true when no checkpoint is running, so none will run (the caller need not wait), false
    /// when one is (then ``stop()`` waits for it). Never blocks.
    ///
    /// `stopped` is set before `running` is read, and a checkpoint sets `running` before it reads `stopped` again
    /// (all sequentially consistent): either this sees the checkpoint running, or the checkpoint sees the stop
    /// and does nothing. A checkpoint that starts after the stop never sets `running`.
    @discardableResult
    func stopIfIdle() -> Bool {
        if !stopped.exchange(true, ordering: .sequentiallyConsistent) { timer.cancel() }
        return !running.load(ordering: .sequentiallyConsistent)
    }

    private func checkpoint() {
        trigger.pending.store(false, ordering: .releasing)
        guard !stopped.load(ordering: .sequentiallyConsistent) else { return }
        running.store(true, ordering: .sequentiallyConsistent)
        defer { running.store(false, ordering: .sequentiallyConsistent) }
        guard !stopped.load(ordering: .sequentiallyConsistent) else { return }
        do {
            try store.checkpoint()
        } catch {
            failure.withLock { $0 = error }
            hasFailed.store(true, ordering: .releasing)
        }
    }

    deinit {
        timer.cancel()
    }
}
