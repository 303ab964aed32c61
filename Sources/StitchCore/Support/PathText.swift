import Foundation

/// The folder holding `path`, as `NSString.deletingLastPathComponent` gives it. A plain absolute path of one or
/// more components (no trailing or repeated slash: what the engine makes every destination) is cut at its last
/// slash without a trip through Foundation's path code, which took most of a small download's finish that was not
/// a system call; anything else goes to Foundation, except a name without a slash: "" (swift-corelibs-foundation
/// traps on that one).
func parentDirectory(of path: String) -> String {
    let utf8 = path.utf8
    if !utf8.contains(UInt8(ascii: "/")) { return "" }
    guard utf8.first == UInt8(ascii: "/"), utf8.last != UInt8(ascii: "/"),
        let slash = utf8.lastIndex(of: UInt8(ascii: "/"))
    else { return (path as NSString).deletingLastPathComponent }
    var previous: UInt8 = 0
    for byte in utf8 {
        if byte == UInt8(ascii: "/") && previous == byte { return (path as NSString).deletingLastPathComponent }
        previous = byte
    }
    return slash == utf8.startIndex ? "/" : String(path[..<slash])
}

/// JSON text written without `JSONEncoder` for the small records written once per download (the completion mark):
/// the encoder's generic machinery cost more than the rest of writing the mark.
enum JSONText {
    /// `text` as a JSON string literal (RFC 8259): quotes, backslashes and control characters escaped.
    static func string(_ text: String) -> String {
        // Byte by byte (a URL, an ETag or a date is mostly printable ASCII, copied as it is): a loop over Unicode
        // scalars cost about 1 % of a small download's CPU.
        var result: [UInt8] = []
        result.reserveCapacity(text.utf8.count + 8)
        result.append(UInt8(ascii: "\""))
        func escape(_ byte: UInt8) {
            result.append(UInt8(ascii: "\\"))
            result.append(byte)
        }
        func escape(code value: UInt32) {
            escape(UInt8(ascii: "u"))
            for shift in stride(from: 12, through: 0, by: -4) {
                let digit = UInt8((value >> UInt32(shift)) & 0xF)
                result.append(digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10)
            }
        }
        let bytes = Array(text.utf8)
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            index += 1
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"): escape(byte)
            case UInt8(ascii: "\n"): escape(UInt8(ascii: "n"))
            case UInt8(ascii: "\r"): escape(UInt8(ascii: "r"))
            case UInt8(ascii: "\t"): escape(UInt8(ascii: "t"))
            case 0..<0x20, 0x7F: escape(code: UInt32(byte))
            // U+2028 and U+2029 (E2 80 A8, E2 80 A9), line breaks to JavaScript.
            case 0xE2 where index + 1 < bytes.count && bytes[index] == 0x80 && (bytes[index + 1] | 1) == 0xA9:
                escape(code: bytes[index + 1] == 0xA8 ? 0x2028 : 0x2029)
                index += 2
            default: result.append(byte)
            }
        }
        result.append(UInt8(ascii: "\""))
        return String(decoding: result, as: UTF8.self)
    }
}
