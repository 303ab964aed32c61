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

/// Whether `needle`'s UTF-8 bytes occur in `haystack` (`memchr` for the first byte, `memcmp` for the rest): for
/// looking for text in files that may be binary, where `String(decoding:as:)` would repair every ill-formed sequence
/// (see ``textIfUTF8(_:)``). Glibc's `memmem` is a GNU extension the Swift module does not export.
public func bytes(_ haystack: [UInt8], contain needle: some StringProtocol) -> Bool {
    let pattern = Array(needle.utf8)
    guard !pattern.isEmpty else { return true }
    return haystack.withUnsafeBytes { hay in
        pattern.withUnsafeBytes { pin in
            guard hay.count >= pin.count else { return false }
            let last = hay.count - pin.count  // the last offset where the pattern fits
            var offset = 0
            while offset <= last {
                guard let found = memchr(hay.baseAddress! + offset, Int32(pin[0]), last - offset + 1) else {
                    return false
                }
                offset = found - UnsafeMutableRawPointer(mutating: hay.baseAddress!)
                if memcmp(hay.baseAddress! + offset, pin.baseAddress!, pin.count) == 0 { return true }
                offset += 1
            }
            return false
        }
    }
}

/// `bytes` as text when they are well-formed UTF-8, else a short note of how many bytes they were.
///
/// Not `String(decoding:as:)` on binary output: it repairs every ill-formed sequence through a thrown error, and
/// Swift Testing captures a backtrace for every error thrown under a test, so three random mebibytes of `-o -`
/// output took the two threads of the concurrency pool for seconds (what PoolWatchdog caught starving the suite).
public func textIfUTF8<Bytes: Collection<UInt8>>(_ bytes: Bytes) -> String {
    let valid = bytes.withContiguousStorageIfAvailable(isWellFormedUTF8) ?? isWellFormedUTF8(Array(bytes))
    return valid ? String(decoding: bytes, as: UTF8.self) : "<\(bytes.count) bytes, not UTF-8>"
}

/// Whether `bytes` are well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
public func isWellFormedUTF8(_ bytes: [UInt8]) -> Bool {
    bytes.withUnsafeBufferPointer(isWellFormedUTF8)
}

public func isWellFormedUTF8(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
    var index = 0
    let count = bytes.count
    while index < count {
        let lead = bytes[index]
        if lead < 0x80 {
            index += 1
            continue
        }
        let length: Int
        var low: UInt8 = 0x80
        var high: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0: length = 3; low = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED: length = 3; high = 0x9F
        case 0xF0: length = 4; low = 0x90
        case 0xF1...0xF3: length = 4
        case 0xF4: length = 4; high = 0x8F
        default: return false
        }
        guard index + length <= count else { return false }
        guard (low...high).contains(bytes[index + 1]) else { return false }
        for next in (index + 2)..<(index + length) where !(0x80...0xBF).contains(bytes[next]) { return false }
        index += length
    }
    return true
}
