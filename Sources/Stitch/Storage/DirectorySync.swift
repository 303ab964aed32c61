import CStitchSystem
import Foundation
import Glibc
import Synchronization

/// Group commit: callers that each need "a sync that started after my write" share one, keyed by what the sync
/// covers. A caller is covered by the first sync that *starts* after it arrives: if one is running, the caller
/// waits for it and then for the next, which one of the waiters runs for all of them (the leader).
///
/// The leader is told whether it is alone (no other caller waits for that sync), so an operation may do less
/// work for one caller than for a group (``FileSync``: one file's `fsync` alone, the whole file system's
/// `syncfs` for a group).
final class GroupCommit: Sendable {
    private struct Group {
        /// Syncs started and finished so far; a sync's number is `started` when it begins.
        var started: UInt64 = 0
        var finished: UInt64 = 0
        var running = false
        /// Failed syncs by number, kept while callers wait: each caller gets the error of the sync that covered
        /// it (the first to start after it arrived), not that of a later one.
        var failures: [UInt64: DownloadError] = [:]
        var waiters = 0
    }

    /// Syncs run, and how many of them were for a group (for tests).
    let syncCount = Atomic<Int>(0)
    let groupSyncCount = Atomic<Int>(0)
    private let condition = NSCondition()
    /// Guarded by `condition`.
    private nonisolated(unsafe) var groups: [String: Group] = [:]

    /// Callers waiting for a sync of `key`, the one running it included (for tests).
    func waiting(_ key: String) -> Int {
        condition.lock()
        defer { condition.unlock() }
        return groups[key]?.waiters ?? 0
    }

    /// Returns once a sync of `key` that started after this call has finished. When this caller leads, it runs
    /// `operation(alone)`: `alone` is true when no other caller waits for this sync.
    func sync(_ key: String, _ operation: (_ alone: Bool) throws(DownloadError) -> Void) throws(DownloadError) {
        condition.lock()
        var group = groups[key] ?? Group()
        // The sync that covers this caller: the next one to start.
        let target = group.started + 1
        group.waiters += 1
        groups[key] = group
        while true {
            group = groups[key]!
            if group.finished >= target {
                break
            }
            if !group.running {
                // Lead: run the sync for everyone waiting. Every waiter counted here waits for this sync or
                // has been covered by an earlier one and not left yet, so one waiter means this caller alone.
                group.running = true
                group.started += 1
                let number = group.started
                let alone = group.waiters == 1
                groups[key] = group
                condition.unlock()
                var failure: DownloadError?
                syncCount.add(1, ordering: .relaxed)
                if !alone { groupSyncCount.add(1, ordering: .relaxed) }
                do { try operation(alone) } catch { failure = error }
                condition.lock()
                group = groups[key]!
                group.running = false
                group.finished = number
                if let failure { group.failures[number] = failure }
                groups[key] = group
                condition.broadcast()
                continue
            }
            condition.wait()
        }
        group = groups[key]!
        group.waiters -= 1
        let failed = group.failures[target]
        if group.waiters == 0 && !group.running {
            groups[key] = nil
        } else {
            groups[key] = group
        }
        condition.unlock()
        if let failed { throw failed }
    }
}

/// Directory syncs shared by the downloads finishing in one folder: one `fsync` of a directory makes every rename
/// done in it before the sync began durable (2,000 small files over 16 connections needed about a tenth of the
/// syncs).
final class DirectorySync: Sendable {
    static let shared = DirectorySync()
    private let commit = GroupCommit()
    /// Syncs run (for tests).
    var syncCount: Int { commit.syncCount.load(ordering: .relaxed) }

    /// Makes the renames done in `directory` so far durable.
    func sync(_ directory: String) throws(DownloadError) {
        try commit.sync(directory) { (_) throws(DownloadError) in try syncDirectory(directory) }
    }
}

/// The data and metadata of finished files made durable together: downloads finishing on one local file system
/// at about the same time share one `syncfs` (one pass of writeback and one cache flush of the device) instead of
/// an `fsync` each. A file that finishes alone gets its own `fsync`.
///
/// `syncfs` reports a writeback error of any file on the file system since the descriptor's last call; on any
/// failure each caller falls back to its own `fsync`, which reports exactly its file's errors. Only file systems
/// whose `syncfs` is known to reach the disk the way `fsync` does take part (ext4, XFS, Btrfs, F2FS); on others
/// (FUSE, network file systems, where it may not send the sync on), every file gets its own `fsync`.
///
/// The price of sharing: a group's `syncfs` also waits for other programs' dirty data on that file system.
final class FileSync: Sendable {
    static let shared = FileSync()
    private let commit = GroupCommit()
    /// The system calls (tests inject failures): one file's sync, and the sync of its whole file system.
    private let fileSync: @Sendable (Int32) -> Int32
    private let fileSystemSync: @Sendable (Int32) -> Int32

    init(
        fileSync: @escaping @Sendable (Int32) -> Int32 = { fsync($0) },
        fileSystemSync: @escaping @Sendable (Int32) -> Int32 = { stitch_syncfs($0) }
    ) {
        self.fileSync = fileSync
        self.fileSystemSync = fileSystemSync
    }
    /// Syncs run, and how many were shared by a group (for tests).
    var syncCount: Int { commit.syncCount.load(ordering: .relaxed) }
    var groupSyncCount: Int { commit.groupSyncCount.load(ordering: .relaxed) }

    /// Callers waiting for a sync of the file system `fd` is on (for tests).
    func waiting(onFileSystemOf fd: Int32) -> Int {
        var info = stat()
        return fstat(fd, &info) == 0 ? commit.waiting("\(info.st_dev)") : 0
    }

    /// Makes the data and metadata written to `fd` so far durable, as `fsync(fd)` does. `path` names the file in
    /// errors.
    func sync(_ fd: Int32, path: String) throws(DownloadError) {
        var info = stat()
        guard Self.sharesSyncs(stitch_file_system_type(fd)), fstat(fd, &info) == 0 else {
            return try fsyncAlone(fd, path: path)
        }
        // A failed fsync of this file is final: Linux reports a writeback error to one fsync only, so a second
        // one would succeed without the data.
        var ownSyncFailed = false
        do throws(DownloadError) {
            try commit.sync("\(info.st_dev)") { (alone) throws(DownloadError) in
                if alone {
                    do throws(DownloadError) { try fsyncAlone(fd, path: path) } catch {
                        ownSyncFailed = true
                        throw error
                    }
                    return
                }
                guard fileSystemSync(fd) == 0 else {
                    throw .io("cannot sync the file system of", path: path, .current)
                }
            }
        } catch {
            if ownSyncFailed { throw error }
            // A failed group sync may be another file's error (or this one's): this file's own fsync says. (The
            // group's syncfs consumed the file system's error report, not this file's.)
            try fsyncAlone(fd, path: path)
        }
    }

    private func fsyncAlone(_ fd: Int32, path: String) throws(DownloadError) {
        guard fileSync(fd) == 0 else { throw .io("cannot sync", path: path, .current) }
    }

    /// File systems whose `syncfs` writes and waits for every dirty inode and flushes the device's cache, as
    /// `fsync` would for one file: ext2/3/4, XFS, Btrfs, F2FS.
    static func sharesSyncs(_ type: Int) -> Bool {
        // (-1 when the type could not be read: not shared.)
        [0xEF53, 0x5846_5342, 0x9123_683E, 0xF2F5_2010].contains(type)
    }
}

/// `fsync` of a directory (after a rename in it). A file system that cannot sync directories (`EINVAL`) is
/// accepted as is.
func syncDirectory(_ directory: String) throws(DownloadError) {
    let fd = retryingOnInterrupt { open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
    guard fd >= 0 else { throw .io("cannot open directory", path: directory, .current) }
    defer { close(fd) }
    if fsync(fd) != 0 && errno != EINVAL {
        throw .io("cannot sync directory", path: directory, .current)
    }
}
