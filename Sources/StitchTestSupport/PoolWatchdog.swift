import Foundation
import Synchronization

/// Watches the Swift concurrency pool that every test of a process shares (two threads on a 2-core machine): a task
/// on the pool beats every 100 ms, and a thread of its own checks the beat each second. When no beat came for 5 s —
/// the pool's threads blocked, or busy with work that should have been offloaded — it prints how long, and the
/// stacks of the pool's threads at that moment (with `STITCH_POOL_STACKS` set), which a test that later times out
/// cannot show any more.
///
/// On only with `STITCH_TRACE` set (scripts/test.sh sets it); at most three reports a process.
public enum PoolWatchdog {
    private static let lastBeat = Atomic<Int64>(0)
    private static let dumpsStacks = ProcessInfo.processInfo.environment["STITCH_POOL_STACKS"] != nil
    private static let started = Atomic<Bool>(false)

    /// Starts the watchdog once per process (later calls do nothing).
    public static func start() {
        guard ProcessInfo.processInfo.environment["STITCH_TRACE"] != nil else { return }
        guard !started.exchange(true, ordering: .acquiringAndReleasing) else { return }
        lastBeat.store(milliseconds(), ordering: .releasing)
        // At the priority the downloads of the tests run at, so that a queue of their work delays it as it delays them.
        Task.detached(priority: .medium) {
            while true {
                lastBeat.store(milliseconds(), ordering: .releasing)
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
        let watcher = Thread {
            var reports = 0
            var reportedThisStall = false
            while reports < 3 {
                Thread.sleep(forTimeInterval: 1)
                let late = milliseconds() - lastBeat.load(ordering: .acquiring)
                if late < 1_000 {
                    reportedThisStall = false
                } else if late >= 5_000, !reportedThisStall {
                    reportedThisStall = true
                    reports += 1
                    // The stacks only when asked for: gdb stops the whole process while it walks hundreds of
                    // threads, which is itself a stall of seconds that other tests' timeouts see.
                    var report = "PoolWatchdog: no task of the concurrency pool ran for \(late) ms"
                    if dumpsStacks { report += "; the pool's threads:\n" + ThreadDump.capture(onlyPoolThreads: true) }
                    print(report)
                }
            }
        }
        watcher.name = "stitch-pool-watchdog"
        watcher.start()
    }

    private static func milliseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return Int64(now.tv_sec) * 1_000 + Int64(now.tv_nsec) / 1_000_000
    }
}

/// Every thread's stack in this process, from gdb (empty when gdb is missing).
public enum ThreadDump {
    /// - Parameter onlyPoolThreads: keep only the threads running a job of the Swift concurrency pool.
    public static func capture(onlyPoolThreads: Bool = false) -> String {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/gdb") else { return "" }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/gdb")
        process.arguments = ["-p", "\(getpid())", "-batch", "-nx", "-ex", "thread apply all bt 25"]
        // To a file, not a pipe: gdb stops every thread of this process, the pipe's reader too.
        let path = NSTemporaryDirectory() + "stitch-threads-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).txt"
        guard FileManager.default.createFile(atPath: path, contents: nil), let output = FileHandle(forWritingAtPath: path)
        else { return "" }
        defer { unlink(path) }
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return "" }
        process.waitUntilExit()
        try? output.close()
        let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        guard onlyPoolThreads else { return text }
        return text.components(separatedBy: "\nThread ")
            .filter { $0.contains("swift_job_run") }
            .map { "Thread " + $0 }
            .joined(separator: "\n")
    }
}
