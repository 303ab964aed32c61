// The few calls whose spelling or meaning differs between the C libraries the library builds on. Linux (Glibc) is
// the platform built and tested here; the Musl and Darwin branches are written to their documentation and have not
// been compiled on this project's machines (see the README's platform table).
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Seconds on a monotonic clock, cheaply (a coarse clock where there is one: it is read per chunk of body).
@inline(__always)
func monotonicNow() -> Double {
    var now = timespec()
    #if os(Linux)
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now)
    #else
    clock_gettime(CLOCK_MONOTONIC, &now)
    #endif
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
}

/// Makes the data written to `fd` durable (rule 2's first step): `fdatasync` on Linux. On Darwin `fsync` only hands
/// the data to the drive, whose cache may lose it on power loss, so it is `fcntl(F_FULLFSYNC)`, with `fsync` where
/// the file system refuses that (untested here). Returns 0 or -1 with `errno` set, as the calls do.
func syncData(_ fd: Int32) -> Int32 {
    #if canImport(Darwin)
    if fcntl(fd, F_FULLFSYNC) == 0 { return 0 }
    return fsync(fd)
    #else
    return fdatasync(fd)
    #endif
}

/// Makes the data and the metadata of `fd` durable (a file's name and size, a folder's entries): `fsync`, and on
/// Darwin `fcntl(F_FULLFSYNC)` first (untested here). Returns 0 or -1 with `errno` set.
func syncFile(_ fd: Int32) -> Int32 {
    #if canImport(Darwin)
    if fcntl(fd, F_FULLFSYNC) == 0 { return 0 }
    #endif
    return fsync(fd)
}

/// `lseek`'s whence values for holes and data: their numbers differ (Linux: data 3, hole 4; Darwin: hole 3, data 4).
#if canImport(Darwin)
let seekHole: Int32 = SEEK_HOLE
let seekData: Int32 = SEEK_DATA
#else
let seekHole: Int32 = 4
let seekData: Int32 = 3
#endif
