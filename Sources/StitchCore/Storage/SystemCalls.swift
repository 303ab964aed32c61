// The C library's calls that a type with a method of the same name needs, in one platform-neutral place.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

// The C library's `read`, `write` and `link` under names of their own: a type with a method of the same name calls
// these instead of qualifying the call with one platform's module (`Glibc.write` cannot compile on Darwin).

/// `read(2)`.
@inline(__always)
func systemRead(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
    read(fd, buffer, count)
}

/// `write(2)`.
@inline(__always)
func systemWrite(_ fd: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int {
    write(fd, buffer, count)
}

/// `link(2)`.
@inline(__always)
func systemLink(_ existing: String, _ new: String) -> Int32 {
    link(existing, new)
}
