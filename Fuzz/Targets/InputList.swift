// Fuzz target: the aria2-style input file (`InputList.parse(bytes:)`), as `stitch get -i FILE` reads it.
//
// Input: the file's raw bytes.

@testable import Stitch
@testable import StitchCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzInputList(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    let list: InputList
    do {
        list = try InputList.parse(bytes: input.bytes)
    } catch {
        check(error.line >= 1, "error on line \(error.line)")
        return 0
    }
    check(!input.bytes.contains(0), "NUL byte accepted")
    var previousLine = 0
    for entry in list.entries {
        check(entry.line > previousLine, "entries out of order")
        previousLine = entry.line
        check(!entry.uris.isEmpty, "entry without URIs on line \(entry.line)")
        if let problem = entry.problem {
            // A download that fails alone: its problem is on its own lines; what was accepted of it still holds.
            check(problem.line >= entry.line, "problem on line \(problem.line) before its entry's \(entry.line)")
        }
        for uri in entry.uris where entry.problem == nil {
            check(!uri.isEmpty, "empty URI")
            check(!uri.unicodeScalars.contains { FileNaming.isDropped($0) || $0.properties.isWhitespace },
                "URI with a blank or control character: \(uri.debugDescription)")
        }
        if let out = entry.out {
            check(!out.isEmpty && !out.hasPrefix("/"), "absolute or empty out \(out.debugDescription)")
            let components = out.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false)
            check(!components.contains { $0.elementsEqual("..".utf8) }, "out escapes: \(out.debugDescription)")
            check(!out.unicodeScalars.contains(where: FileNaming.isDropped), "control character in out")
            check(InputList.problem(withOut: out) == nil, "out accepted with a problem")
        }
        if let dir = entry.dir { check(!dir.isEmpty && !dir.unicodeScalars.contains(where: FileNaming.isDropped), "dir") }
        if let connections = entry.connections { check(InputList.connectionRange.contains(connections), "connections") }
        if let rate = entry.rateLimit { check(rate > 0, "rate limit \(rate)") }
        for header in entry.headers {
            guard let (name, _) = Downloader.parseHeaderLine(header) else {
                check(false, "header does not parse back: \(header.debugDescription)")
                continue
            }
            check(!InputList.reservedHeaders.contains(name.lowercased()), "reserved header \(name) accepted")
        }
        if let checksum = entry.checksum {
            let text = checksum.description
            check((try? ExpectedChecksum(parsing: text)) == checksum, "checksum \(text) does not parse back")
        }
    }
    for warning in list.warnings { check(warning.line >= 1, "warning on line \(warning.line)") }
    return 0
}
