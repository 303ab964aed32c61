import Dispatch
import StitchLocks

/// Hands a download's events to the caller's `onEvent`: one at a time, in order, on a queue of their own — never
/// under one of the engine's locks, never on the transport's thread or the decision pool. A caller's slow (or
/// blocked) `onEvent` holds up only its own events; every download keeps receiving. Progress events waiting behind
/// a slow callback are folded into the latest one, so a callback blocked for an hour holds a handful of events, not
/// thousands.
///
/// ``close()`` ends it: no event sent after that is delivered; ``drained()`` returns once every event sent before
/// has been delivered.
final class EventChannel: Sendable {
    private struct State {
        var pending: [DownloadEvent] = []
        /// A drain is queued or running.
        var scheduled = false
        var open = true
    }

    private let state = Locked(State())
    private let queue = DispatchQueue(label: "stitch.events")
    private let onEvent: @Sendable (DownloadEvent) -> Void

    init(_ onEvent: @escaping @Sendable (DownloadEvent) -> Void) {
        self.onEvent = onEvent
    }

    var isOpen: Bool { state.withLock { $0.open } }

    func send(_ event: DownloadEvent) {
        state.withLock { state in
            guard state.open else { return }
            if case .progress = event, let last = state.pending.last, case .progress = last {
                state.pending[state.pending.count - 1] = event
            } else {
                state.pending.append(event)
            }
            guard !state.scheduled else { return }
            state.scheduled = true
            // Queued under the lock: a `drained()` that follows a `close()` queues its mark after this drain.
            queue.async { [self] in drain() }
        }
    }

    private func drain() {
        while true {
            let batch = state.withLock { state -> [DownloadEvent] in
                if state.pending.isEmpty { state.scheduled = false }
                defer { state.pending.removeAll(keepingCapacity: true) }
                return state.pending
            }
            if batch.isEmpty { return }
            for event in batch { onEvent(event) }
        }
    }

    func close() {
        state.withLock { $0.open = false }
    }

    /// Returns once every event sent so far has been delivered (without holding a thread while it waits).
    func drained() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            state.withLock { _ in queue.async { continuation.resume() } }
        }
    }
}
