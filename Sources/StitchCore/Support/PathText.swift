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
        var result = "\""
        result.reserveCapacity(text.utf8.count + 2)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": result += "\\\""
            case "\\": result += "\\\\"
            case "\n": result += "\\n"
            case "\r": result += "\\r"
            case "\t": result += "\\t"
            case _ where scalar.value < 0x20 || scalar.value == 0x7F || (0x2028...0x2029).contains(scalar.value):
                let hex = String(scalar.value, radix: 16)
                result += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result + "\""
    }
}
