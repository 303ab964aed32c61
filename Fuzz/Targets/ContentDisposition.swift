// Fuzz target: file naming from Content-Disposition and the URL path (`FileNaming.resolve`,
// `filename(fromContentDisposition:)`, `filename(fromURLPath:)`, `sanitize`).
//
// Input: the Content-Disposition value (first line) and a URL path (the rest).

@testable import Stitch
@testable import StitchCore

/// What every name the engine may create must be: one safe path component.
func checkSafeName(_ name: String, from source: String) {
    let context = "\(name.debugDescription) from \(source.debugDescription)"
    check(!name.isEmpty, "empty name from \(source.debugDescription)")
    check(name != "." && name != "..", "dot name \(context)")
    check(!name.hasPrefix("."), "hidden name \(context)")
    check(name.utf8.count <= FileNaming.maxNameBytes, "name of \(name.utf8.count) bytes \(context)")
    check(!name.utf8.contains(UInt8(ascii: "/")) && !name.utf8.contains(UInt8(ascii: "\\")), "separator in \(context)")
    check(!name.utf8.contains(0), "NUL in \(context)")
    check(!name.unicodeScalars.contains(where: FileNaming.isDropped), "dropped character kept in \(context)")
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzContentDisposition(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    let (header, path) = input.firstLineAndRest

    let resolved = FileNaming.resolve(contentDisposition: header, urlPath: path)
    checkSafeName(resolved, from: header + "\n" + path)
    checkSafeName(FileNaming.resolve(contentDisposition: nil, urlPath: input.text), from: input.text)
    checkSafeName(FileNaming.resolve(contentDisposition: nil, urlPath: "", fallback: input.text), from: input.text)

    if let raw = FileNaming.filename(fromContentDisposition: header) {
        check(!raw.isEmpty, "empty raw name from \(header.debugDescription)")
        if let name = FileNaming.sanitize(raw) {
            checkSafeName(name, from: raw)
            check(resolved == name, "resolve ignored a usable Content-Disposition name")
        }
    }
    if let raw = FileNaming.filename(fromURLPath: path) {
        check(!raw.isEmpty, "empty raw name from \(path.debugDescription)")
    }
    if let name = FileNaming.sanitize(input.text) {
        checkSafeName(name, from: input.text)
        // A safe name stays usable.
        if let again = FileNaming.sanitize(name) { checkSafeName(again, from: name) } else {
            check(false, "sanitized name \(name.debugDescription) sanitizes to nothing")
        }
    }
    return 0
}
