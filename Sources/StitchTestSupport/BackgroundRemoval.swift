import Foundation
import Glibc
import Synchronization

/// Removes test folders and files on threads of their own, so that a test's clean-up never holds one of the Swift
/// concurrency pool's threads.
///
/// The pool has one thread per core (two here) and every test shares it with the code under test. Unlinking a
/// folder of multi-MiB files while other tests write and sync can take seconds (seen in a thread dump under load:
/// both pool threads in `unlink`, from a fixture's `deinit` and a sandbox's clean-up, while a split's lanes waited
/// to run). Removals still running when the process exits are waited for (up to a minute), so nothing is left
/// behind.
public enum BackgroundRemoval {
    private static let pending = Atomic<Int>(0)
    private static let registered: Void = {
        atexit { BackgroundRemoval.waitForAll(timeout: 60) }
    }()

    /// Removes `path` (a file, or a folder and everything in it) soon, off the calling thread.
    public static func remove(_ path: String) {
        _ = registered
        pending.add(1, ordering: .relaxed)
        let started = spawnThread {
            try? FileManager.default.removeItem(atPath: path)
            pending.subtract(1, ordering: .releasing)
        }
        if !started {
            try? FileManager.default.removeItem(atPath: path)
            pending.subtract(1, ordering: .releasing)
        }
    }

    /// Waits until every removal asked for so far has ended, or `timeout` seconds have passed.
    public static func waitForAll(timeout: Double) {
        let deadline = Date().addingTimeInterval(timeout)
        while pending.load(ordering: .acquiring) > 0, Date() < deadline {
            usleep(10_000)
        }
    }
}
