import Dispatch
import Synchronization

/// A signal that is given once and then stays given: a test server's threads wait on it (``wait(atMost:)``, bounded
/// so that a failing test cannot hang them) until the test's condition is met — a fault on an explicit signal, not
/// on a sleep.
public final class OneShot: Sendable {
    private let group = DispatchGroup()
    private let given = Atomic<Bool>(false)

    public init() { group.enter() }

    /// Gives the signal (once; later calls do nothing).
    public func open() {
        if !given.exchange(true, ordering: .acquiringAndReleasing) { group.leave() }
    }

    /// Waits until the signal is given, or `seconds` have passed.
    public func wait(atMost seconds: Double) { _ = group.wait(timeout: .now() + seconds) }
}
