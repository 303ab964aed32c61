import Dispatch
import StitchLocks

/// Hands a download's events to the caller's `onEvent`: one at a time and in order, never under one of the
/// engine's locks, and never on the transport's thread.
///
/// An event the engine's own task sends (``send(_:fromTransport:)`` with `fromTransport` false) is delivered at once
/// on that task when nothing is being delivered or waiting: the caller has it before the engine goes on (a `resume`
/// line is out before the first byte is asked for, as `--json` readers expect even of a run killed a moment later).
/// An event sent from the transport's thread (the sink's probe), or one that would overtake others, waits on a
/// queue of the download's own: a caller's slow or blocked `onEvent` never holds up the transport that every
/// download shares. Progress events waiting behind a slow callback fold into the latest one.
///
/// ``close()`` ends it: no event sent after that is delivered; ``drained()`` returns once every event sent before
/// has been delivered.
final class EventChannel: Sendable {
    private struct State {
        var pending: [DownloadEvent] = []
        /// An event is being delivered (on a sender's thread or the queue), or a drain is queued.
        var busy = false
        var open = true
        /// Waiting in `drained()` for `busy` to end.
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Locked(State())
    private let queue = DispatchQueue(label: "stitch.events")
    private let onEvent: @Sendable (DownloadEvent) -> Void

    init(_ onEvent: @escaping @Sendable (DownloadEvent) -> Void) {
        self.onEvent = onEvent
    }

    var isOpen: Bool { state.withLock { $0.open } }

    /// Sends `event`; with `closing`, closes the channel under the same lock, so that it is the last event delivered.
    func send(_ event: DownloadEvent, fromTransport: Bool = false, closing: Bool = false) {
        let now = state.withLock { state -> Bool in
            guard state.open else { return false }
            if closing { state.open = false }
            if !fromTransport, !state.busy {
                state.busy = true
                return true
            }
            if case .progress = event, let last = state.pending.last, case .progress = last {
                state.pending[state.pending.count - 1] = event
            } else {
                state.pending.append(event)
            }
            if !state.busy {
                state.busy = true
                queue.async { [self] in drain() }
            }
            return false
        }
        guard now else { return }
        onEvent(event)
        finishedDelivering()
    }

    /// After a delivery (on a sender's thread, or a drain): what was queued meanwhile goes to the queue; else idle.
    private func finishedDelivering() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            if !state.pending.isEmpty {
                queue.async { [self] in drain() }
                return []
            }
            state.busy = false
            defer { state.idleWaiters.removeAll() }
            return state.idleWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    private func drain() {
        while true {
            let batch = state.withLock { state -> [DownloadEvent] in
                defer { state.pending.removeAll(keepingCapacity: true) }
                return state.pending
            }
            if batch.isEmpty { break }
            for event in batch { onEvent(event) }
        }
        finishedDelivering()
    }

    func close() {
        state.withLock { $0.open = false }
    }

    /// Returns once every event sent so far has been delivered (without holding a thread while it waits).
    func drained() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = state.withLock { state -> Bool in
                if !state.busy { return true }
                state.idleWaiters.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
    }
}
