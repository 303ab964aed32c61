import Glibc

// Byte arrays compared with `memcmp`.
//
// Tests compare whole downloaded files (up to tens of MiB) with `==`. From a debug build that is the standard
// library's unspecialised `Array ==`, one value-witness call per byte: about 0.7 s of a CPU for 64 MiB on a quiet
// machine. Those comparisons run on the Swift concurrency pool, which has one thread per core (two here), so under
// load a few of them held both threads for seconds at a time and the engine's own tasks waited behind them (issue
// 10's last flakes: a split's lanes not started within 30 s). These overloads are more specific than the generic
// ones, so every `==` on `[UInt8]` (and optionals of it) in code that imports this module takes them.

/// Whether two byte arrays hold the same bytes (`memcmp`).
public func == (lhs: [UInt8], rhs: [UInt8]) -> Bool {
    guard lhs.count == rhs.count else { return false }
    return lhs.withUnsafeBytes { left in
        rhs.withUnsafeBytes { right in
            left.count == 0 || memcmp(left.baseAddress!, right.baseAddress!, left.count) == 0
        }
    }
}

/// Whether two optional byte arrays are both nil, or hold the same bytes (`memcmp`).
public func == (lhs: [UInt8]?, rhs: [UInt8]?) -> Bool {
    switch (lhs, rhs) {
    case (nil, nil): return true
    case (let left?, let right?): return left == right
    default: return false
    }
}

/// Whether two byte arrays differ (`memcmp`).
public func != (lhs: [UInt8], rhs: [UInt8]) -> Bool { !(lhs == rhs) }

/// Whether two optional byte arrays differ (`memcmp`).
public func != (lhs: [UInt8]?, rhs: [UInt8]?) -> Bool { !(lhs == rhs) }
