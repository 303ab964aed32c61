// Shared by every fuzz target (compiled into each one by scripts/fuzz.sh).

#if canImport(Glibc)
    import Glibc
#endif

/// Fails the run (libFuzzer records the input as a crash) when an invariant does not hold.
@inline(never)
func check(_ condition: Bool, _ message: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line) {
    guard !condition else { return }
    let text = "fuzz invariant failed (\(file):\(line)): \(message())\n"
    text.utf8CString.withUnsafeBufferPointer { buffer in _ = fputs(buffer.baseAddress!, stderr) }
    abort()
}

/// The input as bytes, as a string (invalid UTF-8 replaced by U+FFFD), and split at the first LF.
struct FuzzInput {
    let bytes: [UInt8]
    init(_ data: UnsafePointer<UInt8>?, _ size: Int) {
        bytes = size > 0 && data != nil ? Array(UnsafeBufferPointer(start: data, count: size)) : []
    }
    var text: String { String(decoding: bytes, as: UTF8.self) }
    /// The text before the first LF and the text after it (empty if none).
    var firstLineAndRest: (String, String) {
        guard let newline = bytes.firstIndex(of: UInt8(ascii: "\n")) else { return (text, "") }
        return (
            String(decoding: bytes[..<newline], as: UTF8.self),
            String(decoding: bytes[(newline + 1)...], as: UTF8.self)
        )
    }
    /// An Int64 made of the first 8 bytes (little-endian, zero-padded).
    var leadingInt64: Int64 {
        var value: UInt64 = 0
        for (index, byte) in bytes.prefix(8).enumerated() { value |= UInt64(byte) << (8 * UInt64(index)) }
        return Int64(bitPattern: value)
    }
}

/// Whether `text` holds a C0 control character other than TAB, or DEL.
func hasControlCharacter(_ text: String, allowingTab: Bool = false) -> Bool {
    text.unicodeScalars.contains { ($0.value < 0x20 && !(allowingTab && $0 == "\t")) || $0.value == 0x7F }
}
