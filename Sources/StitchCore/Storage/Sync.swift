// Rule 2's syncs, where their spelling differs between platforms. Linux (Glibc) is built and tested here; the
// Darwin branch is written to Apple's documentation and has not been compiled on this project's machines.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

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
