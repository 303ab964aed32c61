/// One holder at a time across suspension points (an async mutex): ``run(_:)`` waits its turn, in the order the
/// callers arrived, without blocking a thread. For a short sequence of awaits that must not interleave with another
/// such sequence (the daemon's option changes and its configuration reload).
///
/// Not recursive: a body that calls ``run(_:)`` of the same gate waits for itself forever.
public final class AsyncGate: Sendable {
    private let state = Locked<(held: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    public init() {}

    /// Runs `body` once every earlier caller's body has finished.
    public func run<T>(_ body: () async throws -> T) async rethrows -> T {
        await acquire()
        defer { release() }
        return try await body()
    }

    private func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                guard state.held else {
                    state.held = true
                    return true
                }
                state.waiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    private func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard !state.waiters.isEmpty else {
                state.held = false
                return nil
            }
            return state.waiters.removeFirst()
        }
        next?.resume()
    }
}
