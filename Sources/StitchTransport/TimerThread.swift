import Foundation
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

    // Guarded by `mutex`; `condition` uses CLOCK_MONOTONIC.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>
    private var entries: [UInt64: Entry] = [:]
    private var nextID: UInt64 = 0
    /// When the thread wakes up unless signalled (`.max`: not until signalled); nil while it runs work.
    private var sleepsUntil: UInt64? = .max
    private var started = false

    package init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        #if !canImport(Darwin)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        #endif
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        // Only for clocks that never started their thread (tests make their own): the thread holds `self`.
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    private static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    /// Runs `work` every `interval` seconds (the first time one interval from now) until cancelled.
    package func every(_ interval: Double, _ work: @escaping @Sendable () -> Void) -> Timer {
        let seconds = interval.isFinite ? min(max(0.001, interval), Self.longestInterval) : Self.longestInterval
        let period = UInt64(seconds * 1e9)
        let now = Self.now()
        pthread_mutex_lock(mutex)
        nextID += 1
        let id = nextID
        entries[id] = Entry(due: now + period, period: period, work: work)
        let start = !started
        started = true
        // Woken only when this timer is due before the thread would wake anyway.
        if !start, let until = sleepsUntil, now + period < until {
            sleepsUntil = nil
            pthread_cond_signal(condition)
        }
        pthread_mutex_unlock(mutex)
        if start {
            let thread = Thread { [self] in run() }
            thread.name = "stitch.clock"
            thread.start()
        }
        return Timer(id: id, clock: self)
    }

    /// Timers registered and not cancelled (for tests).
    package var count: Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return entries.count
    }

    private func cancel(_ id: UInt64) {
        // Not woken: it finds nothing due at its next wake-up. The entry (its closure) is released after the
        // lock, in case that is the last reference to something.
        pthread_mutex_lock(mutex)
        let removed = entries.removeValue(forKey: id)
        pthread_mutex_unlock(mutex)
        _ = removed
    }

    private func run() {
        pthread_mutex_lock(mutex)
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
                pthread_mutex_unlock(mutex)
                for work in due { work() }
                due.removeAll()
                pthread_mutex_lock(mutex)
                continue
            }
            sleepsUntil = next
            if next == .max {
                pthread_cond_wait(condition, mutex)
            } else {
                #if canImport(Darwin)
                // Darwin's conditions wait on the wall clock only: wait for the time left instead (unbuilt here).
                let now = Self.now()
                let left = next > now ? next - now : 0
                var relative = timespec(tv_sec: Int(left / 1_000_000_000), tv_nsec: Int(left % 1_000_000_000))
                _ = pthread_cond_timedwait_relative_np(condition, mutex, &relative)
                #else
                var deadline = timespec(tv_sec: Int(next / 1_000_000_000), tv_nsec: Int(next % 1_000_000_000))
                _ = pthread_cond_timedwait(condition, mutex, &deadline)
                #endif
            }
            sleepsUntil = nil
        }
    }
}
