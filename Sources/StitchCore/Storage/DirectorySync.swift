import Foundation
import Synchronization

/// Group commit for directory syncs: one `fsync` of a directory makes every rename done in it before the sync
/// began durable, so downloads finishing in one folder at about the same time share syncs instead of queueing
/// one each (2,000 small files over 16 connections needed about a tenth of the syncs).
///
/// A caller's rename is covered by the first sync that *starts* after it: if one is running, the caller waits
/// for it and then for the next, which one of the waiters runs.
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
                do { try syncDirectory(directory) } catch { failure = error }
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
