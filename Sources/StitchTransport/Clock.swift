#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Seconds on a monotonic clock, cheaply (a coarse clock where there is one: it is read per chunk of body).
@inline(__always)
package func monotonicNow() -> Double {
    var now = timespec()
    #if os(Linux)
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now)
    #else
    clock_gettime(CLOCK_MONOTONIC, &now)
    #endif
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
}

/// The one clock of a download: the engine's lanes, monitor, probe, rate limits, progress ticks, checkpoints and
/// retries, and the transports' stall timers, read the time and wait through it. ``SystemClock`` is the real one; a
/// test passes one it moves by hand, so that timing is decided by the test and not by how loaded the machine is.
public protocol DownloadClock: Sendable {
    /// Seconds on a monotonic clock (from any origin): what durations are measured on.
    func uptime() -> Double
    /// Seconds since the epoch, for `Retry-After` dates.
    func now() -> Int64
    /// Waits `seconds`; throws `CancellationError` when the calling task is cancelled.
    func sleep(seconds: Double) async throws
    /// Runs `work` every `interval` seconds (the first time one interval from now) until the timer is cancelled.
    /// `work` must be quick and must not block: it runs on the clock's own thread, and every other timer waits
    /// for it (hand anything slow to a task or a queue).
    func every(_ interval: Double, _ work: @escaping @Sendable () -> Void) -> any ClockTimer
}

/// A repeating timer of a ``DownloadClock``.
public protocol ClockTimer: Sendable {
    /// Stops it: a tick already taken may still run once, none after that.
    func cancel()
}

extension DownloadClock {
    /// The system's monotonic clock, for clocks that only decide the waits between retries.
    public func uptime() -> Double { monotonicNow() }

    /// The system's timer thread, for clocks that only decide the waits between retries.
    public func every(_ interval: Double, _ work: @escaping @Sendable () -> Void) -> any ClockTimer {
        EngineClock.shared.every(interval, work)
    }
}

/// The real clock: the system's monotonic and wall clocks, `Task.sleep`, and one timer thread for every download's
/// periodic work.
public struct SystemClock: DownloadClock {
    /// The system's clock.
    public init() {}

    public func uptime() -> Double { monotonicNow() }

    public func now() -> Int64 { Int64(time(nil)) }

    /// Waits `seconds` (to the millisecond) with `Task.sleep`; throws `CancellationError` when the task is
    /// cancelled.
    public func sleep(seconds: Double) async throws {
        try await Task.sleep(for: .milliseconds(Int64(seconds * 1000)))
    }

    public func every(_ interval: Double, _ work: @escaping @Sendable () -> Void) -> any ClockTimer {
        EngineClock.shared.every(interval, work)
    }
}
