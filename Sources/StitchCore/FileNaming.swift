// Choosing a safe local file name for a download.
//
// Everything here is pure string processing: no file-system access, no Foundation.

/// Derives a safe local file name for a download from the server's `Content-Disposition` header or the URL path.
///
/// All parsing is lenient towards real-world servers but the output of ``sanitize(_:)`` and
/// ``resolve(contentDisposition:urlPath:fallback:)`` is always a single, non-hidden path component that cannot
/// escape the download directory.
public enum FileNaming {

    /// The longest file name, in UTF-8 bytes, that ``sanitize(_:)`` returns (the `NAME_MAX` of common file systems).
    public static let maxNameBytes = 255

    // MARK: Content-Disposition (RFC 6266 / RFC 8187)

    /// Extracts the file name from a `Content-Disposition` header value (RFC 6266).
    ///
    /// Understands the token form (`attachment; filename=a.txt`), the quoted-string form with backslash escapes
    /// (`attachment; filename="a \"b\".txt"`) and the RFC 8187 extended form
    /// (`attachment; filename*=UTF-8''%E2%82%AC%20rates.pdf`, charset `UTF-8`, `ISO-8859-1` or `US-ASCII`,
    /// optional language tag). When both `filename*` and `filename` are present and `filename*` decodes, it wins.
    /// Parameter names are case-insensitive, parameters may come in any order, and semicolons inside quoted strings
    /// are not separators. Malformed parameters are skipped; for duplicated parameters the first one counts.
    ///
    /// The returned name is **not** sanitized: it may contain `/`, `..` or control characters. Pass it through
    /// ``sanitize(_:)`` (or use ``resolve(contentDisposition:urlPath:fallback:)``) before touching the file system.
    ///
    /// - Parameter header: The header value, without the `Content-Disposition:` field name.
    /// - Returns: The raw file name, or `nil` when the header is malformed or carries no usable name.
    public static func filename(fromContentDisposition header: String) -> String? {
        var parser = ContentDispositionParser(Array(header.utf8))
        guard let parameters = parser.parse() else { return nil }
        if let extended = parameters.extendedFilename, let decoded = decodeExtendedValue(extended),
            !decoded.isEmpty
        {
            return decoded
        }
        if let plain = parameters.filename, !plain.isEmpty {
            return decodeBytes(plain)
        }
        return nil
    }

    // MARK: URL path

    /// Extracts the last non-empty segment of a URL path, percent-decoded.
    ///
    /// Any query (`?…`) or fragment (`#…`) is ignored. A full URL (`https://host/dir/file.iso`) is also accepted;
    /// its scheme and authority are skipped. Invalid percent escapes are kept literally; decoded bytes that are
    /// not valid UTF-8 are read as ISO-8859-1.
    ///
    /// The returned name is **not** sanitized (`%2F` decodes to `/`, the segment may be `..`).
    ///
    /// - Parameter path: A URL path such as `/files/report%202024.pdf?x=1`.
    /// - Returns: The decoded segment, or `nil` when the path has no non-empty segment.
    public static func filename(fromURLPath path: String) -> String? {
        var bytes = Array(path.utf8)
        if let end = bytes.firstIndex(where: { $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") }) {
            bytes.removeSubrange(end...)
        }
        if let pathStart = startOfPathAfterSchemeAndAuthority(bytes) {
            bytes.removeSubrange(..<pathStart)
        }
        guard let segment = bytes.split(separator: UInt8(ascii: "/")).last else { return nil }
        let decoded = decodeBytes(percentDecode(segment, strict: false) ?? Array(segment))
        return decoded.isEmpty ? nil : decoded
    }

    // MARK: Sanitizing

    /// Turns an untrusted name into a safe single path component, or returns `nil` if nothing usable remains.
    ///
    /// The rules, in order:
    /// 1. Control characters (C0, DEL, C1), Unicode line/paragraph separators, bidirectional formatting
    ///    characters and byte-order marks are dropped.
    /// 2. Only the last non-empty component after any `/` or `\` is kept (`../../etc/passwd` → `passwd`).
    /// 3. Characters reserved on common file systems (`< > : " | ? *`) become `_`.
    /// 4. Leading whitespace and dots are stripped, so the result is never hidden (`.bashrc` → `bashrc`);
    ///    trailing whitespace and dots are stripped too. `""`, `"."`, `".."` and dots/spaces-only names give `nil`.
    /// 5. Names longer than ``maxNameBytes`` UTF-8 bytes are cut on a character boundary, keeping a short
    ///    extension (`.pdf`, `.tar.gz`) where possible.
    ///
    /// - Parameter name: An untrusted name, e.g. from ``filename(fromContentDisposition:)``.
    /// - Returns: A non-empty name without `/`, `\`, NUL or leading dot, at most ``maxNameBytes`` UTF-8 bytes long.
    public static func sanitize(_ name: String) -> String? {
        if isSafeAsItIs(name) { return name }
        return sanitizeScalars(name)
    }

    /// Whether every rule of ``sanitize(_:)`` leaves `name` as it is, read from its UTF-8 bytes alone: printable
    /// ASCII without a separator or a reserved character, not starting or ending with a dot or a space, at most
    /// ``maxNameBytes`` long (the usual name from a URL, which then needs no array of scalars).
    static func isSafeAsItIs(_ name: String) -> Bool {
        // A string without contiguous UTF-8 (bridged) takes the long way.
        name.utf8.withContiguousStorageIfAvailable { bytes in
            guard let first = bytes.first, let last = bytes.last, bytes.count <= maxNameBytes,
                first != UInt8(ascii: "."), first != UInt8(ascii: " "), last != UInt8(ascii: "."),
                last != UInt8(ascii: " ")
            else { return false }
            for byte in bytes {
                switch byte {
                case UInt8(ascii: "/"), UInt8(ascii: "\\"), UInt8(ascii: "<"), UInt8(ascii: ">"), UInt8(ascii: ":"),
                    UInt8(ascii: "\""), UInt8(ascii: "|"), UInt8(ascii: "?"), UInt8(ascii: "*"):
                    return false
                case 0x20...0x7E: continue
                default: return false
                }
            }
            return true
        } ?? false
    }

    /// ``sanitize(_:)`` scalar by scalar, for every name.
    static func sanitizeScalars(_ name: String) -> String? {
        // 1 + 2: filter scalars and keep the last non-empty component. Working on scalars (not Characters) matters:
        // a "/" followed by a combining mark is a single Character that does not compare equal to "/".
        var component: [Unicode.Scalar] = []
        var current: [Unicode.Scalar] = []
        for scalar in name.unicodeScalars {
            if scalar == "/" || scalar == "\\" {
                if !current.isEmpty {
                    component = current
                    current.removeAll(keepingCapacity: true)
                }
            } else if !isDropped(scalar) {
                current.append(scalar)
            }
        }
        if !current.isEmpty { component = current }

        // 3: reserved characters.
        for index in component.indices where isReserved(component[index]) {
            component[index] = "_"
        }

        // 4: trim.
        var start = component.startIndex
        var end = component.endIndex
        while start < end, isTrimmable(component[start]) { start += 1 }
        while end > start, isTrimmable(component[end - 1]) { end -= 1 }
        guard start < end else { return nil }
        let trimmed = Array(component[start..<end])

        // 5: length.
        let result = truncated(trimmed, maxBytes: maxNameBytes)
        guard isSafeComponent(result) else { return nil }
        return result
    }

    // MARK: Resolving

    /// Chooses the local file name for a download.
    ///
    /// Returns the sanitized `Content-Disposition` file name if there is one, otherwise the sanitized last segment of
    /// the URL path, otherwise the sanitized `fallback` (and `"index.html"` if even the fallback is unusable).
    /// The result is always safe to append to a directory path.
    ///
    /// - Parameters:
    ///   - contentDisposition: The `Content-Disposition` header value, if the server sent one.
    ///   - urlPath: The (final, after redirects) URL path, or a full URL.
    ///   - fallback: The name to use when neither source yields a usable name.
    public static func resolve(contentDisposition: String?, urlPath: String, fallback: String = "index.html") -> String
    {
        if let header = contentDisposition, let raw = filename(fromContentDisposition: header),
            let name = sanitize(raw)
        {
            return name
        }
        if let raw = filename(fromURLPath: urlPath), let name = sanitize(raw) {
            return name
        }
        return sanitize(fallback) ?? "index.html"
    }
}

// MARK: - Helpers

extension FileNaming {

    /// Scalars removed outright by `sanitize`.
    static func isDropped(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x7F...0x9F: return true  // C0, DEL, C1
        case 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: return true  // bidi formatting
        case 0x2028, 0x2029: return true  // line / paragraph separator
        case 0xFEFF: return true  // BOM / zero-width no-break space
        default: return false
        }
    }

    /// Characters that are invalid in file names on Windows, macOS (`:`) or SMB/exFAT volumes.
    static func isReserved(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar {
        case "<", ">", ":", "\"", "|", "?", "*": return true
        default: return false
        }
    }

    static func isTrimmable(_ scalar: Unicode.Scalar) -> Bool {
        scalar == "." || scalar.properties.isWhitespace
    }

    static func isSafeComponent(_ name: String) -> Bool {
        !name.isEmpty && name != "." && name != ".." && name.utf8.first != UInt8(ascii: ".")
            && !name.unicodeScalars.contains { $0 == "/" || $0 == "\\" || $0 == "\0" }
            && name.utf8.count <= maxNameBytes
    }

    static func utf8Length(_ scalars: some Sequence<Unicode.Scalar>) -> Int {
        scalars.reduce(0) { $0 + UTF8.width($1) }
    }

    /// Cuts `scalars` to at most `maxBytes` UTF-8 bytes, preferring to keep a short extension.
    /// `scalars` must be non-empty and must not start with whitespace or a dot.
    static func truncated(_ scalars: [Unicode.Scalar], maxBytes: Int) -> String {
        if utf8Length(scalars) <= maxBytes {
            return String(String.UnicodeScalarView(scalars))
        }
        let extensionStart = extensionStart(of: scalars)
        let suffix = scalars[extensionStart...]
        let suffixBytes = utf8Length(suffix)
        if extensionStart > 0 {
            let stem = prefix(of: scalars[..<extensionStart], maxBytes: maxBytes - suffixBytes)
            if !stem.isEmpty {
                return String(String.UnicodeScalarView(stem + suffix))
            }
        }
        return String(String.UnicodeScalarView(prefix(of: scalars[...], maxBytes: maxBytes)))
    }

    /// Index of the dot starting a short extension (`.pdf`, or `.tar.gz`-style double extension), or `endIndex`.
    static func extensionStart(of scalars: [Unicode.Scalar]) -> Int {
        guard let lastDot = scalars.lastIndex(of: "."), lastDot > 0 else { return scalars.endIndex }
        let suffix = scalars[lastDot...]
        guard suffix.count >= 2, utf8Length(suffix) <= 32, !suffix.contains(where: { $0.properties.isWhitespace })
        else { return scalars.endIndex }
        // Keep an inner short alphanumeric extension too: ".tar.gz", ".user.js".
        if let previousDot = scalars[..<lastDot].lastIndex(of: "."), previousDot > 0 {
            let inner = scalars[(previousDot + 1)..<lastDot]
            if (1...4).contains(inner.count), inner.allSatisfy(isASCIIAlphanumeric) {
                return previousDot
            }
        }
        return lastDot
    }

    /// The longest prefix of whole Characters (falling back to whole scalars if a single Character is too long)
    /// that fits in `maxBytes`, without trailing whitespace.
    static func prefix(of scalars: ArraySlice<Unicode.Scalar>, maxBytes: Int) -> [Unicode.Scalar] {
        guard maxBytes > 0 else { return [] }
        var result: [Unicode.Scalar] = []
        var bytes = 0
        for character in String(String.UnicodeScalarView(scalars)) {
            let width = character.utf8.count
            if bytes + width > maxBytes { break }
            result.append(contentsOf: character.unicodeScalars)
            bytes += width
        }
        if result.isEmpty {
            for scalar in scalars {
                let width = UTF8.width(scalar)
                if bytes + width > maxBytes { break }
                result.append(scalar)
                bytes += width
            }
        }
        while let last = result.last, last.properties.isWhitespace { result.removeLast() }
        return result
    }

    /// Converts bytes to a String: UTF-8 if valid, otherwise ISO-8859-1 (every byte is a code point).
    static func decodeBytes(_ bytes: some Collection<UInt8>) -> String {
        if let string = String(validating: bytes, as: UTF8.self) { return string }
        return latin1String(bytes)
    }

    static func latin1String(_ bytes: some Collection<UInt8>) -> String {
        var scalars = String.UnicodeScalarView()
        for byte in bytes { scalars.append(Unicode.Scalar(byte)) }
        return String(scalars)
    }

    static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// Decodes `%XX` escapes. When `strict`, a malformed escape makes the whole decode fail (returns `nil`);
    /// otherwise it is kept literally.
    static func percentDecode(_ bytes: some Collection<UInt8>, strict: Bool) -> [UInt8]? {
        let input = Array(bytes)
        var output: [UInt8] = []
        output.reserveCapacity(input.count)
        var index = 0
        while index < input.count {
            let byte = input[index]
            if byte == UInt8(ascii: "%") {
                if index + 2 < input.count, let high = hexValue(input[index + 1]),
                    let low = hexValue(input[index + 2])
                {
                    output.append(high << 4 | low)
                    index += 3
                    continue
                }
                if strict { return nil }
            }
            output.append(byte)
            index += 1
        }
        return output
    }

    /// For `scheme://authority/path`, the index where the path starts (or `endIndex` if there is no path).
    /// `nil` when `bytes` does not start with a scheme followed by `://`.
    static func startOfPathAfterSchemeAndAuthority(_ bytes: [UInt8]) -> Int? {
        var index = 0
        guard let first = bytes.first, isASCIILetter(first) else { return nil }
        while index < bytes.count {
            let byte = bytes[index]
            if isASCIILetter(byte) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                || byte == UInt8(ascii: "+") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
            {
                index += 1
            } else {
                break
            }
        }
        guard bytes[index...].starts(with: "://".utf8) else { return nil }
        let authorityStart = index + 3
        return bytes[authorityStart...].firstIndex(of: UInt8(ascii: "/")) ?? bytes.endIndex
    }

    static func isASCIILetter(_ byte: UInt8) -> Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte | 0x20)
    }

    static func isASCIIAlphanumeric(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar {
        case "a"..."z", "A"..."Z", "0"..."9": return true
        default: return false
        }
    }

    /// ASCII-lowercases bytes (other bytes are unchanged).
    static func asciiLowercased(_ bytes: some Sequence<UInt8>) -> [UInt8] {
        bytes.map { (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0) ? $0 + 32 : $0 }
    }

    /// Decodes an RFC 8187 `ext-value` (`charset'[language]'pct-encoded`). Returns `nil` for unknown charsets,
    /// malformed escapes or bytes invalid in the declared charset.
    static func decodeExtendedValue(_ value: [UInt8]) -> String? {
        let quote = UInt8(ascii: "'")
        guard let firstQuote = value.firstIndex(of: quote),
            let secondQuote = value[(firstQuote + 1)...].firstIndex(of: quote)
        else { return nil }
        let charset = String(decoding: asciiLowercased(value[..<firstQuote]), as: UTF8.self)
        guard let bytes = percentDecode(value[(secondQuote + 1)...], strict: true) else { return nil }
        switch charset {
        case "utf-8", "utf8":
            return String(validating: bytes, as: UTF8.self)
        case "iso-8859-1", "latin1":
            return latin1String(bytes)
        case "us-ascii":
            return bytes.allSatisfy({ $0 < 0x80 }) ? latin1String(bytes) : nil
        default:
            return nil
        }
    }
}

/// A small byte-level parser for `disposition-type *( ";" disposition-parm )`.
struct ContentDispositionParser {
    struct Parameters {
        var filename: [UInt8]?
        var extendedFilename: [UInt8]?
    }

    private let bytes: [UInt8]
    private var index = 0

    init(_ bytes: [UInt8]) {
        self.bytes = bytes
    }

    private static let semicolon = UInt8(ascii: ";")
    private static let equals = UInt8(ascii: "=")
    private static let quote = UInt8(ascii: "\"")
    private static let backslash = UInt8(ascii: "\\")

    /// Returns `nil` when the header does not even start like a Content-Disposition value.
    mutating func parse() -> Parameters? {
        skipWhitespace()
        let typeStart = index
        skipToken()
        let typeEnd = index
        skipWhitespace()
        if index < bytes.count, bytes[index] == Self.equals {
            // Lenient: no disposition type, the value starts with a parameter ("filename=a.txt").
            index = typeStart
        } else if typeStart == typeEnd || (index < bytes.count && bytes[index] != Self.semicolon) {
            return nil
        }

        var parameters = Parameters()
        while true {
            skipWhitespace()
            guard index < bytes.count else { break }
            if bytes[index] == Self.semicolon {
                index += 1
                continue
            }
            let nameStart = index
            skipToken()
            let name = FileNaming.asciiLowercased(bytes[nameStart..<index])
            skipWhitespace()
            guard index > nameStart, index < bytes.count, bytes[index] == Self.equals else {
                skipParameter()
                continue
            }
            index += 1
            skipWhitespace()
            guard let value = parseValue() else {
                skipParameter()
                continue
            }
            if name.elementsEqual("filename".utf8) {
                if parameters.filename == nil { parameters.filename = value }
            } else if name.elementsEqual("filename*".utf8) {
                if parameters.extendedFilename == nil { parameters.extendedFilename = value }
            }
        }
        return parameters
    }

    /// Parses a quoted-string or a token-ish value. Returns `nil` (leaving `index` inside the parameter) when the
    /// value is malformed.
    private mutating func parseValue() -> [UInt8]? {
        if index < bytes.count, bytes[index] == Self.quote {
            guard let value = parseQuotedString() else { return nil }
            skipWhitespace()
            guard index == bytes.count || bytes[index] == Self.semicolon else { return nil }
            return value
        }
        // Token form. Real servers often send unquoted values containing spaces, so take everything up to the
        // next ';' and trim surrounding whitespace.
        let start = index
        while index < bytes.count, bytes[index] != Self.semicolon { index += 1 }
        var end = index
        while end > start, Self.isWhitespace(bytes[end - 1]) { end -= 1 }
        return Array(bytes[start..<end])
    }

    /// At an opening quote: returns the unescaped content and moves past the closing quote, or `nil` if unterminated.
    private mutating func parseQuotedString() -> [UInt8]? {
        index += 1
        var value: [UInt8] = []
        while index < bytes.count {
            let byte = bytes[index]
            if byte == Self.quote {
                index += 1
                return value
            }
            if byte == Self.backslash, index + 1 < bytes.count {
                value.append(bytes[index + 1])
                index += 2
                continue
            }
            value.append(byte)
            index += 1
        }
        return nil
    }

    /// Skips the rest of a malformed parameter, up to the next `;` outside a quoted string.
    private mutating func skipParameter() {
        while index < bytes.count, bytes[index] != Self.semicolon {
            if bytes[index] == Self.quote {
                if parseQuotedString() == nil { return }
            } else {
                index += 1
            }
        }
    }

    private mutating func skipWhitespace() {
        while index < bytes.count, Self.isWhitespace(bytes[index]) { index += 1 }
    }

    private mutating func skipToken() {
        while index < bytes.count, Self.isTokenCharacter(bytes[index]) { index += 1 }
    }

    private static func isWhitespace(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t")
    }

    /// RFC 9110 `tchar`.
    private static func isTokenCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
            UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
            UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            return true
        default:
            return false
        }
    }
}
