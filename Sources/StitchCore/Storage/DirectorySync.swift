import Foundation
import StitchLocks
import Synchronization

/// Group commit for directory syncs: one `fsync` of a directory makes every rename done in it before the sync
/// began durable, so downloads finishing in one folder at about the same time share syncs instead of queueing
/// one each (2,000 small files over 16 connections needed about a tenth of the syncs).
///
/// A caller's rename is covered by the first sync that *starts* after it: if one is running, the caller waits
/// for it and then for the next, which one of the waiters runs.
///
/// Two ways to wait: ``sync(_:)`` blocks its thread (for callers already on the blocking pool), and
/// ``suspendingSync(_:)`` suspends the caller's task instead (the engine's finish): a waiter then holds no thread,
/// and the sync that covers it resumes it without waking a thread for it (with 16 downloads finishing in one folder,
/// the blocking waits were two of the eleven thread wake-ups each small download cost). The two keep separate
/// groups; either way a caller returns only after a sync that started after its call.
final class DirectorySync: Sendable {
    static let shared = DirectorySync()

    private struct Folder {
        /// Syncs started and finished so far; a sync's number is `started` when it begins.
        var started: UInt64 = 0
        var finished: UInt64 = 0
        var running = false
        /// Failed syncs by number, kept while callers wait: each caller gets the error of the sync that covered
        /// it (the first to start after its rename), not that of a later one.
        var failures: [UInt64: DownloadError] = [:]
        var waiters = 0
    }

    /// Syncs run (for tests).
    let syncCount = Atomic<Int>(0)
    private let condition = NSCondition()
    /// Guarded by `condition`.
    private nonisolated(unsafe) var folders: [String: Folder] = [:]
    /// The folders ``suspendingSync(_:)`` is syncing, with the tasks waiting for their next sync.
    private let waiting = Locked<[String: [Waiter]]>([:])
    /// `fsync` of a folder: ``syncDirectory(_:)``, or a test's stand-in.
    private let syncing: @Sendable (String) throws(DownloadError) -> Void
    /// A test's hook, called by ``suspendingSync(_:)`` between its look that found a sync running and its look that
    /// joins the waiters (where that sync may end and its folder leave the table).
    private let betweenLooks: (@Sendable () -> Void)?

    init(
        syncing: @escaping @Sendable (String) throws(DownloadError) -> Void = { directory throws(DownloadError) in
            try syncDirectory(directory)
        },
        betweenLooks: (@Sendable () -> Void)? = nil
    ) {
        self.syncing = syncing
        self.betweenLooks = betweenLooks
    }

    /// A task waiting for the next sync of a folder.
    private typealias Waiter = CheckedContinuation<Turn, Never>

    /// What a waiting task is resumed with.
    private enum Turn {
        /// A sync that started after the call began has finished, with this error if it failed.
        case covered(DownloadError?)
        /// No sync is running: this task runs the next.
        case lead
    }

    /// Tasks waiting for a sync of `directory` (for tests).
    func waiters(_ directory: String) -> Int { waiting.withLock { $0[directory]?.count ?? 0 } }

    /// Makes the renames done in `directory` so far durable; suspends, holding no thread, while another caller's sync
    /// runs. The sync itself runs on ``BlockingPool/shared``.
    func suspendingSync(_ directory: String) async throws(DownloadError) {
        // A folder in the table has a sync running (or a waiter about to run one).
        let running = waiting.withLock { folders in
            if folders[directory] != nil { return true }
            folders[directory] = []
            return false
        }
        if running {
            let turn = await withCheckedContinuation { (continuation: Waiter) in
                betweenLooks?()
                let lead = waiting.withLock { folders in
                    // The sync finished and its folder left the table meanwhile: no one to wait for.
                    guard folders[directory] != nil else {
                        folders[directory] = []
                        return true
                    }
                    folders[directory]!.append(continuation)
                    return false
                }
                if lead { continuation.resume(returning: .lead) }
            }
            if case .covered(let failure) = turn {
                if let failure { throw failure }
                return
            }
        }
        // This task leads: its sync covers it and every task waiting now, all of whose renames came before it starts.
        // Tasks that come while it runs wait for the next, which the first of them runs.
        let covered = waiting.withLock { folders in
            let now = folders[directory] ?? []
            folders[directory] = []
            return now
        }
        syncCount.add(1, ordering: .relaxed)
        var failure: DownloadError?
        let syncing = self.syncing
        do throws(DownloadError) {
            try await BlockingPool.shared.run { () throws(DownloadError) in try syncing(directory) }
        } catch {
            failure = error
        }
        let next = waiting.withLock { folders -> Waiter? in
            guard var waiters = folders[directory], !waiters.isEmpty else {
                folders[directory] = nil
                return nil
            }
            let next = waiters.removeFirst()
            folders[directory] = waiters
            return next
        }
        for waiter in covered { waiter.resume(returning: .covered(failure)) }
        next?.resume(returning: .lead)
        if let failure { throw failure }
    }

    /// Makes the renames done in `directory` so far durable.
    func sync(_ directory: String) throws(DownloadError) {
        condition.lock()
        var folder = folders[directory] ?? Folder()
        // The sync that covers this caller: the next one to start.
        let target = folder.started + 1
        folder.waiters += 1
        folders[directory] = folder
        while true {
            folder = folders[directory]!
            if folder.finished >= target {
                break
            }
            if !folder.running {
                // Lead: run the sync for everyone waiting.
                folder.running = true
                folder.started += 1
                let number = folder.started
                folders[directory] = folder
                condition.unlock()
                var failure: DownloadError?
                syncCount.add(1, ordering: .relaxed)
                do { try syncing(directory) } catch { failure = error }
                condition.lock()
                folder = folders[directory]!
                folder.running = false
                folder.finished = number
                if let failure { folder.failures[number] = failure }
                folders[directory] = folder
                condition.broadcast()
                continue
            }
            condition.wait()
        }
        folder = folders[directory]!
        folder.waiters -= 1
        let failed = folder.failures[target]
        if folder.waiters == 0 && !folder.running {
            folders[directory] = nil
        } else {
            folders[directory] = folder
        }
        condition.unlock()
        if let failed { throw failed }
    }
}

/// `fsync` of a directory (after a rename in it). A file system that cannot sync directories (`EINVAL`) is
/// accepted as is.
func syncDirectory(_ directory: String) throws(DownloadError) {
    let fd = retryingOnInterrupt { open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
    guard fd >= 0 else { throw .io("cannot open directory", path: directory, .current) }
    defer { close(fd) }
    if syncFile(fd) != 0 && errno != EINVAL {
        throw .io("cannot sync directory", path: directory, .current)
    }
}
