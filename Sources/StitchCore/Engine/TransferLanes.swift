import Foundation
import Synchronization
import StitchLocks

/// The download's state machine (``DownloadStateMachine``) and the requests of its lanes beside it, under the
/// run's one lock (``DownloadRun/core``).
struct EngineCore {
    var machine: DownloadStateMachine
    /// The request running on each lane, so a slow one can be told to make way.
    var requests: [Int: LaneRequest] = [:]

    /// What the scheduler knows of the running requests.
    var running: [Int: LaneScheduler.Running] {
        requests.mapValues { request in
            LaneScheduler.Running(
                startedAt: request.startedAt, resumeOffset: request.plan.resumeOffset, receiving: request.receiving)
        }
    }
}

/// The lanes of one running transfer, as its requests and sinks see them: the part file, how many lanes, whether
/// it is the download's one segment on one connection, the stop flag the sinks read on the transport's thread, and
/// the beats that wake the monitor and the lanes waiting for work. Made by ``DownloadRun`` for each transfer.
final class TransferLanes: Sendable {
    let store: PartStore
    let count: Int
    /// The download's one segment over one lane (see ``LaneRequest/Role/alone``).
    let alone: Bool
    /// Set once the state machine stops the lanes (read by the sinks on the transport's thread).
    let stopped = Atomic<Bool>(false)
    /// Lanes that have ended.
    let finished = Atomic<Int>(0)
    /// Wakes the monitor, on the clock's timer.
    let beat = Beat()
    /// Wakes lanes that wait for work: on the monitor's beat, and at once when a lane lets go of a segment (the
    /// last one done, the waiting lanes end without waiting for a beat).
    let idle = Beat()
    /// Held by an idle lane while it claims work (see ``DownloadRun``): one claim at a time, so a steal's split
    /// never meets another's.
    let claiming = Locked(())
    /// The validators the transfer has; on one connection a response may add to them.
    private let knownBox: Locked<Validators>

    /// The mirrors whose lanes fetch beside the first source's (nil: none in this transfer).
    let mirrors: MirrorSet?

    init(store: PartStore, count: Int, alone: Bool, known: Validators, mirrors: MirrorSet? = nil) {
        self.store = store
        self.count = count
        self.alone = alone
        self.mirrors = mirrors
        knownBox = Locked(known)
    }

    var known: Validators { knownBox.withLock { $0 } }

    /// What a response on the download's one connection added to the validators.
    func adopt(_ validators: Validators) {
        knownBox.withLock { $0 = validators }
    }
}

/// The timing of the lanes: when a steal is worth it, how the monitor samples and what it calls slow (the rules
/// that use them are ``LaneScheduler``'s).
enum LaneTiming {
    /// Bytes a running request may have in flight (socket buffers) when its range is cut short: what the client's
    /// receive buffer and the server's send buffer hold, up to a few MiB on Linux's defaults (seen here: up to about
    /// 3 MiB on loopback with the machine loaded).
    static let stealSlack: Int64 = 4 << 20
    /// A segment whose connection will finish it sooner than this is left alone by idle lanes (a new request
    /// costs a round trip or two).
    static let stealMinimumSeconds = 0.2
    /// The same for a victim at least ``bufferFillingSpeed`` fast and not slow next to its thief.
    static let stealMinimumSecondsFast = 1.0
    /// A speed at which a connection may outrun the client's writes, so that its socket buffers fill.
    static let bufferFillingSpeed: Double = 48 * 1024 * 1024
    /// The smallest tail worth a request of its own, and the alignment of a split that falls inside a piece.
    static let stealGranule: Int64 = 64 << 10
    /// How often the monitor samples the lanes, and the window a speed is measured over.
    static let monitorInterval = 0.1
    static let speedWindow = 0.5
    /// A speed needs at least this much of a window.
    static let minimumSpeedWindow = 0.2
    /// A connection this many times slower than its peers' median is slow...
    static let slowFactor = 4.0
    /// ...and replaced after this many samples in a row (with the window, noticed within about half a second).
    static let slowTicksToReplace = 2

    /// How long a request that started at `start` at time `started` would take to reach `end` at its speed so far;
    /// infinite when it has no speed yet to judge by (under a tenth of a second old, or nothing written).
    static func secondsLeft(from start: Int64, at started: Double, written: Int64, end: Int64, now: Double) -> Double {
        let elapsed = now - started
        let done = written - start
        guard elapsed >= 0.1, done > 0 else { return .infinity }
        return Double(end - written) / (Double(done) / elapsed)
    }

}

/// A beat that tasks wait for: ``fire()`` (on a clock's timer thread: it only resumes continuations) wakes every
/// task waiting in ``next()``. Ended, or the waiting task cancelled, `next()` returns false.
final class Beat: Sendable {
    private struct State {
        var waiters: [UInt64: CheckedContinuation<Bool, Never>] = [:]
        var nextID: UInt64 = 0
        var ended = false
    }
    private let state = Locked(State())

    func fire() {
        let waiters = state.withLock { state in
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters.values { waiter.resume(returning: true) }
    }

    func end() {
        let waiters = state.withLock { state in
            state.ended = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters.values { waiter.resume(returning: false) }
    }

    /// Waits for the next beat: true when it came, false once ended or when the task is cancelled.
    func next() async -> Bool {
        let id = state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let waiting = state.withLock { state in
                    guard !state.ended, !Task.isCancelled else { return false }
                    state.waiters[id] = continuation
                    return true
                }
                if !waiting { continuation.resume(returning: false) }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume(returning: false)
        }
    }
}

/// A flag one thread sets and others read, shareable by reference (a closure can hold it).
final class AtomicFlag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}
