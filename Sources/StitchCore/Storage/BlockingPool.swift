import Foundation
import StitchLocks

/// A few threads for blocking file-system calls (syncs, renames), as swift-nio's `NIOThreadPool`.
///
/// Neither the cooperative pool (one thread per core) nor Dispatch's global queues (on Linux, no more threads than
/// cores for work that blocks in the kernel) let 16 downloads finishing at once sync at once; then the disk sees
/// two requests at a time and directory syncs cannot be shared. Threads start on demand, up to `maximumThreads`,
/// and stay for the life of the process.
final class BlockingPool: Sendable {
    static let shared = BlockingPool(maximumThreads: 16)
    /// For the engine's response-head decisions (open, reopen, preallocate, hash a prefix): kept apart from the
    /// syncs of `shared`, so a burst of finishing downloads on a slow disk cannot hold every transfer's next
    /// decision behind them.
    static let decisions = BlockingPool(maximumThreads: 16)

    private let maximumThreads: Int
    private let condition = NSCondition()
    /// Guarded by `condition`.
    private nonisolated(unsafe) var jobs: [@Sendable () -> Void] = []
    private nonisolated(unsafe) var threads = 0
    private nonisolated(unsafe) var idle = 0

    init(maximumThreads: Int) {
        self.maximumThreads = maximumThreads
    }

    /// Runs `work` on one of the pool's threads and returns its result.
    func run<T: Sendable>(_ work: @escaping @Sendable () throws(DownloadError) -> T) async throws(DownloadError) -> T {
        // The work's writes (an engine decision sets the download's fields) are ordered before the caller's reads
        // by this lock as well as by the continuation: ThreadSanitizer sees the lock (as the libcurl transport's `start`).
        let handoff = Locked(false)
        let result: Result<T, DownloadError> = await withCheckedContinuation { continuation in
            submit {
                let outcome: Result<T, DownloadError>
                do throws(DownloadError) {
                    outcome = .success(try work())
                } catch {
                    outcome = .failure(error)
                }
                handoff.withLock { $0 = true }
                continuation.resume(returning: outcome)
            }
        }
        handoff.withLock { _ in }
        return try result.get()
    }

    private func submit(_ job: @escaping @Sendable () -> Void) {
        condition.lock()
        jobs.append(job)
        // A woken thread counts as idle until it takes the lock again: compare with the jobs waiting, so a burst
        // gets as many threads as it has jobs (up to the maximum).
        let startThread = jobs.count > idle && threads < maximumThreads
        if startThread { threads += 1 }
        condition.unlock()
        // After the unlock: a thread woken while the lock is still held would only block again on it.
        condition.signal()
        if startThread {
            let thread = Thread { [self] in work() }
            thread.name = "stitch.blocking"
            thread.start()
        }
    }

    /// Threads, idle threads and jobs waiting, for a test's failure message.
    var occupancy: String {
        condition.lock()
        defer { condition.unlock() }
        return "\(threads) threads, \(idle) idle, \(jobs.count) jobs waiting"
    }

    private func work() {
        condition.lock()
        while true {
            while jobs.isEmpty {
                idle += 1
                condition.wait()
                idle -= 1
            }
            let job = jobs.removeFirst()
            condition.unlock()
            job()
            condition.lock()
        }
    }
}

extension BlockingPool {
    /// Threads for the actors whose jobs may block on the disk (``BlockingSerialExecutor``): one per actor with work
    /// queued, apart from the syncs and decisions of the other pools.
    static let actors = BlockingPool(maximumThreads: 64)

    /// Runs `job` on one of the pool's threads, without waiting for it.
    func execute(_ job: @escaping @Sendable () -> Void) { submit(job) }
}

/// A serial executor whose jobs run on ``BlockingPool/actors``' threads: for an actor whose methods make blocking
/// file-system calls, so that a slow disk holds that actor, never the cooperative pool every other task needs.
///
/// The download manager commits each change to its catalog before the call returns, with the write-ahead log synced
/// (`synchronous=FULL`). On the cooperative pool, with one thread per core, a few managers waiting on a busy disk
/// stopped every other task in the process: the test suite on a loaded machine saw downloads make no progress for a
/// minute. As swift-nio's event loops, the actor gets a thread of its own while it has jobs; none while it is idle.
final class BlockingSerialExecutor: SerialExecutor {
    private struct State {
        var jobs: [UnownedJob] = []
        var draining = false
    }
    private let state = Locked(State())
    private let pool: BlockingPool

    init(pool: BlockingPool = .actors) { self.pool = pool }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let start = state.withLock { state in
            state.jobs.append(job)
            if state.draining { return false }
            state.draining = true
            return true
        }
        if start { pool.execute { [self] in drain() } }
    }

    /// Runs the jobs in the order they came, until none is left; after a few batches the thread is given back and
    /// the rest waits its turn in the pool (as swift-nio's event loops take turns), so that actors kept busy for good
    /// cannot hold every thread from the others.
    private func drain() {
        let executor = asUnownedSerialExecutor()
        for _ in 0..<16 {
            let batch = state.withLock { state in
                let batch = state.jobs
                state.jobs = []
                if batch.isEmpty { state.draining = false }
                return batch
            }
            if batch.isEmpty { return }
            for job in batch { job.runSynchronously(on: executor) }
        }
        // Still draining (no other drain can start): continue as a new job of the pool.
        pool.execute { [self] in drain() }
    }
}
