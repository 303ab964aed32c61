import Foundation
import Synchronization

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
        let handoff = Mutex(false)
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
