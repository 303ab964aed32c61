#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Seconds on a monotonic clock, cheaply (a coarse clock where there is one: it is read per chunk of body).
@inline(__always)
package func monotonicNow() -> Double {
    var now = timespec()
    #if os(Linux)
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now)
    #else
    clock_gettime(CLOCK_MONOTONIC, &now)
    #endif
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
}
