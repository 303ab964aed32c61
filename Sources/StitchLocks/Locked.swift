#if canImport(Glibc)
public import Glibc
#elseif canImport(Musl)
public import Musl
#elseif canImport(Darwin)
public import Darwin
#endif

/// A value behind a `pthread_mutex_t`: the one lock of every Stitch target (as swift-nio's `NIOLock`).
///
/// Why not Synchronization's `Mutex`: on Linux it is built on futex system calls inside the prebuilt (uninstrumented)
/// Synchronization module, so ThreadSanitizer never sees it lock and reports every access it guards as a race.
/// ThreadSanitizer intercepts pthread mutexes, so a sanitized build runs this same lock and reports real races only.
/// Uncontended, a pthread mutex costs about what the futex does (one atomic each way).
///
/// Non-copyable, as `Mutex`: one owner, which shares it by reference (a class's `let`). `withLock` is the only way
/// to the value; its body must not call out to code that could take the same lock again (it is not recursive).
public struct Locked<Value>: ~Copyable, @unchecked Sendable {
    // Sendable for any Value: the value is reached only under the lock, which hands it from thread to thread (as
    // `Mutex` is Sendable for any Value); unchecked because the compiler cannot see the lock.
    @usableFromInline let lock: UnsafeMutablePointer<pthread_mutex_t>
    @usableFromInline let value: UnsafeMutablePointer<Value>

    @inlinable
    public init(_ initialValue: consuming Value) {
        lock = .allocate(capacity: 1)
        lock.initialize(to: pthread_mutex_t())
        let status = pthread_mutex_init(lock, nil)
        precondition(status == 0, "pthread_mutex_init: \(status)")
        value = .allocate(capacity: 1)
        value.initialize(to: initialValue)
    }

    @inlinable
    deinit {
        value.deinitialize(count: 1)
        value.deallocate()
        pthread_mutex_destroy(lock)
        lock.deallocate()
    }

    /// Runs `body` with the value, holding the lock.
    @inlinable
    public borrowing func withLock<Result, Failure: Error>(
        _ body: (inout Value) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        pthread_mutex_lock(lock)
        defer { pthread_mutex_unlock(lock) }
        return try body(&value.pointee)
    }
}
