import Dispatch
import Foundation
import Synchronization

/// One thread that keeps the time for every download's periodic work (progress ticks, timed checkpoints), in
/// place of a Dispatch timer and a sleeping task per download.
///
/// Why: a download of 100 KiB is over before its first tick, yet arming and cancelling a Dispatch timer and a
/// `Task.sleep` each woke another thread twice, a large part of the cost of fetching thousands of small files.
/// Here registering and cancelling are a lock and a dictionary update: the thread is woken only when a new timer
/// is due before the moment it sleeps until, and ticks due within ``leeway`` of each other share one wake-up.
///
/// The work runs on the clock's thread and must not block (hand anything slow to a queue or a task): every
/// other timer waits for it.
final class EngineClock: Sendable {
    static let shared = EngineClock()

    /// How early a tick may run so that ticks due close together share a wake-up (at most a quarter of its
    /// period).
    static let leeway: UInt64 = 20_000_000

    /// A repeating timer; ``cancel()`` stops it (the work may still be running once, but never starts after).
    final class Timer: Sendable {
        fileprivate let id: UInt64
        fileprivate let clock: EngineClock

        fileprivate init(id: UInt64, clock: EngineClock) {
            self.id = id
            self.clock = clock
        }

        func cancel() { clock.cancel(id) }
    }

    private struct Entry {
        var due: UInt64
        var period: UInt64
        var work: @Sendable () -> Void
    }

    private struct State {
        var entries: [UInt64: Entry] = [:]
        var nextID: UInt64 = 0
        /// When the thread wakes up unless signalled (`.max`: not until signalled); nil while it runs work.
        var sleepsUntil: UInt64? = .max
        var started = false
    }

    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)

    /// Runs `work` every `interval` seconds (the first time one interval from now) until cancelled.
    func every(_ interval: Double, _ work: @escaping @Sendable () -> Void) -> Timer {
        let period = UInt64(max(0.001, interval) * 1e9)
        let now = DispatchTime.now().uptimeNanoseconds
        let (id, start, signal) = state.withLock { state -> (UInt64, Bool, Bool) in
            state.nextID += 1
            state.entries[state.nextID] = Entry(due: now + period, period: period, work: work)
            let start = !state.started
            state.started = true
            // Woken only when this timer is due before the thread would wake anyway.
            let signal = !start && state.sleepsUntil.map { now + period < $0 } == true
            if signal { state.sleepsUntil = nil }
            return (state.nextID, start, signal)
        }
        if start {
            let thread = Thread { [self] in run() }
            thread.name = "stitch.clock"
            thread.start()
        } else if signal {
            wake.signal()
        }
        return Timer(id: id, clock: self)
    }

    /// Timers registered and not cancelled (for tests).
    var count: Int { state.withLock { $0.entries.count } }

    private func cancel(_ id: UInt64) {
        // Not woken: it finds nothing due at its next wake-up.
        _ = state.withLock { $0.entries.removeValue(forKey: id) }
    }

    private func run() {
        while true {
            let now = DispatchTime.now().uptimeNanoseconds
            let (due, next) = state.withLock { state -> ([@Sendable () -> Void], UInt64) in
                var due: [@Sendable () -> Void] = []
                var next = UInt64.max
                for id in Array(state.entries.keys) {
                    guard var entry = state.entries[id] else { continue }
                    // (A short period gets a shorter leeway, or its timer would always look due.)
                    if entry.due <= now + min(Self.leeway, entry.period / 4) {
                        due.append(entry.work)
                        // Ticks missed while the machine was busy are not made up for.
                        entry.due = max(entry.due + entry.period, now + entry.period / 2)
                        state.entries[id] = entry
                    }
                    next = min(next, entry.due)
                }
                state.sleepsUntil = due.isEmpty ? next : nil
                return (due, next)
            }
            if !due.isEmpty {
                for work in due { work() }
                continue
            }
            if next == .max {
                wake.wait()
            } else {
                _ = wake.wait(timeout: DispatchTime(uptimeNanoseconds: next))
            }
            state.withLock { $0.sleepsUntil = nil }
        }
    }
}
