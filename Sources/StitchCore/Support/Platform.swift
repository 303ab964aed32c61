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

/// `lseek`'s whence values for holes and data: their numbers differ (Linux: data 3, hole 4; Darwin: hole 3, data 4).
#if canImport(Darwin)
let seekHole: Int32 = SEEK_HOLE
let seekData: Int32 = SEEK_DATA
#else
let seekHole: Int32 = 4
let seekData: Int32 = 3
#endif
