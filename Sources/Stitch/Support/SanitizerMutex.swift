// Compiled only with `-DSTITCH_TSAN` (scripts/tsan.sh). This file is the same in every target that uses
// `Mutex` (Stitch, the transport's three targets, StitchRPC, StitchServer, StitchCLI, StitchTestSupport and the
// test targets): symbolic links to Sources/Stitch/Support/SanitizerMutex.swift.
#if STITCH_TSAN
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Under ThreadSanitizer, a `pthread_mutex_t` in place of Synchronization's `Mutex`, shadowing it in this module.
///
/// On Linux the standard library's `Mutex` is built on futex system calls inside the prebuilt (uninstrumented)
/// Synchronization module, so ThreadSanitizer never sees it lock: every access it guards is reported as a race.
/// ThreadSanitizer intercepts pthread mutexes, so with this the reports are about real races only. Same API as
/// far as this project uses it.
struct Mutex<Value>: ~Copyable, @unchecked Sendable {
    private let lock: UnsafeMutablePointer<pthread_mutex_t>
    private let value: UnsafeMutablePointer<Value>

    init(_ initialValue: consuming Value) {
        lock = .allocate(capacity: 1)
        pthread_mutex_init(lock, nil)
        value = .allocate(capacity: 1)
        value.initialize(to: initialValue)
    }

    deinit {
        value.deinitialize(count: 1)
        value.deallocate()
        pthread_mutex_destroy(lock)
        lock.deallocate()
    }

    borrowing func withLock<Result, Failure: Error>(
        _ body: (inout Value) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        pthread_mutex_lock(lock)
        defer { pthread_mutex_unlock(lock) }
        return try body(&value.pointee)
    }
}
#endif
