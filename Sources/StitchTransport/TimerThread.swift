import Foundation
import StitchLocks
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// One thread that keeps the time for every download's periodic work (progress ticks, timed checkpoints), in
/// place of a Dispatch timer and a sleeping task per download.
///
/// Why: a download of 100 KiB is over before its first tick, yet arming and cancelling a Dispatch timer and a
/// `Task.sleep` each woke another thread twice, a large part of the cost of fetching thousands of small files.
/// Here registering and cancelling are a lock and a dictionary update: the thread is woken only when a new timer
/// is due before the moment it sleeps until, and ticks due within ``leeway`` of each other share one wake-up.
/// It sleeps on a condition variable bound to the monotonic clock, so a step of the wall clock changes nothing.
///
/// The work runs on the clock's thread and must neither block nor drop the last reference to anything whose
/// deinit might (hand anything slow to a queue or a task, and resolve weak references there): every other timer
/// waits for it.
package final class EngineClock: @unchecked Sendable {
    package static let shared = EngineClock()

    /// How early a tick may run so that ticks due close together share a wake-up (at most a quarter of its
    /// period).
    static let leeway: UInt64 = 20_000_000
    /// The longest interval (about 31 years): longer ones, and infinite ones, are this.
    static let longestInterval = 1e9

    /// A repeating timer; ``cancel()`` stops it (a tick already taken may still run once, none after that).
    package final class Timer: ClockTimer {
        fileprivate let id: UInt64
        fileprivate let clock: EngineClock

        fileprivate init(id: UInt64, clock: EngineClock) {
            self.id = id
            self.clock = clock
        }

        package func cancel() { clock.cancel(id) }
    }

    private struct Entry {
        var due: UInt64
        var period: UInt64
        var work: @Sendable () -> Void
    }

    // Guarded by `lock`, whose condition waits on the monotonic clock.
    private let lock = ConditionLock()
    private var entries: [UInt64: Entry] = [:]
    private var nextID: UInt64 = 0
    /// When the thread wakes up unless signalled (`.max`: not until signalled); nil while it runs work.
    private var sleepsUntil: UInt64? = .max
    private var started = false

    package init() {}

    private static func now() -> UInt64 { ConditionLock.monotonicNanoseconds() }

    /// Runs `work` every `interval` seconds (the first time one interval from now) until cancelled.
    package func every(_ interval: Double, _ work: @escaping @Sendable () -> Void) -> Timer {
        let seconds = interval.isFinite ? min(max(0.001, interval), Self.longestInterval) : Self.longestInterval
        let period = UInt64(seconds * 1e9)
        let now = Self.now()
        lock.lock()
        nextID += 1
        let id = nextID
        entries[id] = Entry(due: now + period, period: period, work: work)
        let start = !started
        started = true
        // Woken only when this timer is due before the thread would wake anyway.
        if !start, let until = sleepsUntil, now + period < until {
            sleepsUntil = nil
            lock.signal()
        }
        lock.unlock()
        if start {
            let thread = Thread { [self] in run() }
            thread.name = "stitch.clock"
            thread.start()
        }
        return Timer(id: id, clock: self)
    }

    /// Timers registered and not cancelled (for tests).
    package var count: Int {
        lock.lock()
        defer { lock.unlock() }
        return entries.count
    }

    private func cancel(_ id: UInt64) {
        // Not woken: it finds nothing due at its next wake-up. The entry (its closure) is released after the
        // lock, in case that is the last reference to something.
        lock.lock()
        let removed = entries.removeValue(forKey: id)
        lock.unlock()
        _ = removed
    }

    private func run() {
        lock.lock()
        while true {
            let now = Self.now()
            var due: [@Sendable () -> Void] = []
            var next = UInt64.max
            for id in Array(entries.keys) {
                guard var entry = entries[id] else { continue }
                // (A short period gets a shorter leeway, or its timer would always look due.)
                if entry.due <= now + min(Self.leeway, entry.period / 4) {
                    due.append(entry.work)
                    // Ticks missed while the machine was busy are not made up for.
                    entry.due = max(entry.due + entry.period, now + entry.period / 2)
                    entries[id] = entry
                }
                next = min(next, entry.due)
            }
            if !due.isEmpty {
                sleepsUntil = nil
                lock.unlock()
                for work in due { work() }
                due.removeAll()
                lock.lock()
                continue
            }
            sleepsUntil = next
            lock.wait(untilNanoseconds: next == .max ? nil : next)
            sleepsUntil = nil
        }
    }
}
