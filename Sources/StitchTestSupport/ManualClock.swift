import Foundation
public import Stitch
import StitchLocks

/// A ``DownloadClock`` that moves only when the test says (as swift-nio's `EmbeddedEventLoop.advanceTime`): the
/// engine's lanes, monitor, probe, rate limits, progress ticks, checkpoints and retries, and the transports' stall
/// timers then happen at the virtual times the test steps through, however loaded the machine is.
///
/// ``advance(by:)`` walks forward in time order through the ticks and sleeps due on the way: timer work runs on the
/// caller's thread with ``uptime()`` showing its time; a sleeper is resumed at its time, but its task runs later, on
/// its executor, when the walk may have gone further. So step in small increments and let the tasks settle between
/// steps (LaneTimingTests' `drive` waits until every body in flight sleeps on the clock again).
public final class ManualClock: DownloadClock, Sendable {
    private struct Timer {
        var due: Double
        let period: Double
        let work: @Sendable () -> Void
    }

    private struct Sleeper {
        let due: Double
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: Double
        var timers: [UInt64: Timer] = [:]
        var sleepers: [UInt64: Sleeper] = [:]
        var nextID: UInt64 = 0
        var sleepsTaken = 0
    }

    private let state: Locked<State>
    /// The epoch seconds ``now()`` gives at uptime 0 (fixed, so `Retry-After` dates give exact delays).
    public static let epoch: Int64 = 1_800_000_000

    public init(start: Double = 0) {
        state = Locked(State(now: start))
    }

    public func uptime() -> Double { state.withLock { $0.now } }

    public func now() -> Int64 { Self.epoch + Int64(uptime()) }

    /// Tasks waiting in ``sleep(seconds:)`` now.
    public var sleeping: Int { state.withLock { $0.sleepers.count } }
    /// Sleeps asked for so far (of any length).
    public var sleepsTaken: Int { state.withLock { $0.sleepsTaken } }
    /// Timers registered and not cancelled.
    public var timers: Int { state.withLock { $0.timers.count } }

    public func sleep(seconds: Double) async throws {
        guard seconds > 0 else {
            // As `SystemClock`: no wait (a `Retry-After: 0`), only a chance for others to run.
            try Task.checkCancellation()
            state.withLock { $0.sleepsTaken += 1 }
            await Task.yield()
            return
        }
        let id = state.withLock { state in
            state.nextID += 1
            state.sleepsTaken += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let verdict: Result<Void, any Error>? = state.withLock { state in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    state.sleepers[id] = Sleeper(due: state.now + seconds, continuation: continuation)
                    return nil
                }
                if let verdict { continuation.resume(with: verdict) }
            }
        } onCancel: {
            state.withLock { $0.sleepers.removeValue(forKey: id) }?.continuation.resume(throwing: CancellationError())
        }
    }

    public func every(_ interval: Double, _ work: @escaping @Sendable () -> Void) -> any ClockTimer {
        let id = state.withLock { state in
            state.nextID += 1
            let period = max(1e-6, interval)
            state.timers[state.nextID] = Timer(due: state.now + period, period: period, work: work)
            return state.nextID
        }
        return ManualTimer(clock: self, id: id)
    }

    fileprivate func cancel(_ id: UInt64) {
        _ = state.withLock { $0.timers.removeValue(forKey: id) }
    }

    /// Moves the clock forward by `seconds`, running what falls due on the way in time order (a sleep and a tick
    /// due at the same time: the sleep first).
    public func advance(by seconds: Double) {
        let target = uptime() + max(0, seconds)
        while true {
            enum Due {
                case sleeper(CheckedContinuation<Void, any Error>)
                case timer(@Sendable () -> Void)
            }
            let due: Due? = state.withLock { state in
                let sleeper = state.sleepers.min { ($0.value.due, $0.key) < ($1.value.due, $1.key) }
                let timer = state.timers.min { ($0.value.due, $0.key) < ($1.value.due, $1.key) }
                if let sleeper, sleeper.value.due <= target, timer.map({ sleeper.value.due <= $0.value.due }) ?? true {
                    state.now = max(state.now, sleeper.value.due)
                    state.sleepers[sleeper.key] = nil
                    return .sleeper(sleeper.value.continuation)
                }
                if let timer, timer.value.due <= target {
                    state.now = max(state.now, timer.value.due)
                    state.timers[timer.key]?.due += timer.value.period
                    return .timer(timer.value.work)
                }
                state.now = target
                return nil
            }
            switch due {
            case .sleeper(let continuation): continuation.resume()
            case .timer(let work): work()
            case nil: return
            }
        }
    }
}

private final class ManualTimer: ClockTimer {
    let clock: ManualClock
    let id: UInt64

    init(clock: ManualClock, id: UInt64) {
        self.clock = clock
        self.id = id
    }

    func cancel() { clock.cancel(id) }
}
