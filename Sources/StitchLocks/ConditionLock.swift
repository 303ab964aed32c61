#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A `pthread_mutex_t` with a condition variable on the monotonic clock, for the few threads that sleep until a
/// state changes or a moment comes (the engine's timer thread, a test's waiting server): a step of the wall clock
/// changes no wait. ThreadSanitizer sees both, as it does ``Locked``.
///
/// The caller holds the lock around ``wait(untilNanoseconds:)`` and the state it guards, which lives beside it
/// (the type holds no value: the timer thread's state is many fields, read in a loop around the waits).
public final class ConditionLock: @unchecked Sendable {
    // Sendable: the pthread objects are made for sharing between threads; the pointers never change.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    public init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        var status = pthread_mutex_init(mutex, nil)
        precondition(status == 0, "pthread_mutex_init: \(status)")
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        #if !canImport(Darwin)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        #endif
        status = pthread_cond_init(condition, &attributes)
        precondition(status == 0, "pthread_cond_init: \(status)")
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    public func lock() { pthread_mutex_lock(mutex) }
    public func unlock() { pthread_mutex_unlock(mutex) }

    /// Runs `body` holding the lock.
    public func withLock<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    /// Wakes one waiter.
    public func signal() { pthread_cond_signal(condition) }
    /// Wakes every waiter.
    public func broadcast() { pthread_cond_broadcast(condition) }

    /// With the lock held: releases it until signalled (or woken spuriously: check the state again), or until
    /// `deadline`, in nanoseconds of the monotonic clock (``monotonicNanoseconds()``; nil: no deadline), and takes
    /// it again. Returns false when the deadline passed.
    @discardableResult
    public func wait(untilNanoseconds deadline: UInt64?) -> Bool {
        guard let deadline else {
            pthread_cond_wait(condition, mutex)
            return true
        }
        #if canImport(Darwin)
        // Darwin's conditions wait on the wall clock only: wait for the time left instead (unbuilt here).
        let now = Self.monotonicNanoseconds()
        let left = deadline > now ? deadline - now : 0
        var relative = timespec(tv_sec: Int(left / 1_000_000_000), tv_nsec: Int(left % 1_000_000_000))
        return pthread_cond_timedwait_relative_np(condition, mutex, &relative) != ETIMEDOUT
        #else
        let capped = min(deadline, UInt64(Int.max / 2))
        var time = timespec(tv_sec: Int(capped / 1_000_000_000), tv_nsec: Int(capped % 1_000_000_000))
        return pthread_cond_timedwait(condition, mutex, &time) != ETIMEDOUT
        #endif
    }

    /// The monotonic clock, in nanoseconds: what ``wait(untilNanoseconds:)`` deadlines are counted in.
    public static func monotonicNanoseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }
}
