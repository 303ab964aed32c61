public import Dispatch

/// A value that only one serial dispatch queue touches (as swift-nio's `NIOLoopBound` is bound to an event loop):
/// an object whose work all runs on its queue keeps its state here instead of in plain stored properties.
///
/// `@unchecked Sendable`, reviewed: every read and write of ``value`` checks that it runs on the queue
/// (`dispatchPrecondition`, in release builds too), so the value is never reached from two threads at once; the
/// initial value is handed over before the queue can run anything of the owner's.
public final class QueueConfined<Value>: @unchecked Sendable {
    private let queue: DispatchQueue
    private var stored: Value

    /// `value`, from now on reached only on `queue`.
    public init(_ value: consuming Value, on queue: DispatchQueue) {
        self.queue = queue
        stored = value
    }

    /// The value; on the queue only.
    public var value: Value {
        get {
            dispatchPrecondition(condition: .onQueue(queue))
            return stored
        }
        _modify {
            dispatchPrecondition(condition: .onQueue(queue))
            yield &stored
        }
    }
}
