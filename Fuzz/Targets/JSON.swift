// Fuzz target: the RPC layer's JSON reader and writer (`JSON.parse`, `JSON.serialized`), which read whatever a
// client of `stitch serve` sends.
//
// Input: byte 0 picks the nesting limit (1 to 64); the rest is the body. Invariants: parsing never crashes or
// recurses past the limit; whatever parses is written back as JSON that parses to the same value, with no raw
// `<`, `>`, `&` or control character in it (the output may go into a JSONP script).

@testable import StitchRPC

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJSON(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    guard let first = input.bytes.first else { return 0 }
    let depth = Int(first % 64) + 1
    let body = Array(input.bytes.dropFirst())
    guard let value = try? JSON.parse(body, maxDepth: depth) else { return 0 }
    let written = value.serialized
    check(!written.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "<") || $0 == UInt8(ascii: ">") || $0 == UInt8(ascii: "&") }),
        "unescaped byte in \(String(decoding: written, as: UTF8.self).debugDescription)")
    guard let again = try? JSON.parse(written, maxDepth: depth) else {
        check(false, "written JSON does not parse: \(String(decoding: written, as: UTF8.self).debugDescription)")
        return 0
    }
    // Doubles are written in Swift's shortest form, which reads back exactly.
    check(again == value, "round trip changed \(String(decoding: body, as: UTF8.self).debugDescription)")
    return 0
}
