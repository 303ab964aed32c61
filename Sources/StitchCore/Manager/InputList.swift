// The list of downloads given to `stitch get -i FILE` (and later the daemon), in aria2c's input-file format:
// one download per line, mirrors separated by TAB, followed by indented `key=value` option lines.

// MARK: - InputList

/// A list of downloads in aria2c's input-file format, as read by `stitch get -i FILE`.
///
/// ```
/// # comment
/// https://a.example/file.iso<TAB>https://b.example/file.iso
///   out=images/file.iso
///   checksum=sha-256=0123…
///   header=Authorization: Bearer abc
/// https://c.example/other.bin
/// ```
///
/// - A line that does not start with a space, a TAB or `#` is one download: one or more URIs separated by TAB
///   (mirrors of the same file). Spaces and TABs around each URI are dropped; a URI containing a space or a
///   control character makes that download fail (``Entry/problem``).
/// - A line that starts with a space or a TAB holds one `key=value` option for the download above it, even across
///   blank and comment lines. Supported keys: `out`, `dir`, `checksum`, `header` (repeatable), `split`,
///   `max-connection-per-server`, `max-download-limit`, the proxies (`all-proxy`, `http-proxy`, `https-proxy`,
///   each with `-user` and `-passwd`, and `no-proxy`; an empty proxy is none), `conditional-get` (`true` or
///   `false`: fetch only if newer than the file there) and Stitch's own `adopt` (`true` or `false`: take over the
///   partial another program left at `out`). Other keys are recorded in ``warnings`` and ignored;
///   a non-repeatable key given twice keeps its last value, with a warning. A bad value makes that download fail
///   alone (``Entry/problem``: the first one found), the rest of the list goes on; `split` and
///   `max-connection-per-server` above 16 are capped to 16 with a warning, as aria2c caps them.
/// - A line whose first non-blank character is `#` is a comment; blank lines are skipped.
/// - Lines end with LF or CRLF; a UTF-8 byte-order mark at the start and a missing final newline are accepted.
///   NUL bytes and invalid UTF-8 are errors.
///
/// Parsing does no I/O and is safe on untrusted input. It throws ``InputListError`` only for what no download can
/// be blamed for: NUL bytes, invalid UTF-8, an option line before any URI line.
public struct InputList: Sendable, Hashable {

    /// One download of an ``InputList``.
    public struct Entry: Sendable, Hashable {
        /// The URIs of the file, in the order given (aria2 mirrors); never empty. Not checked for a scheme here.
        public var uris: [String]
        /// `out`: the output file name or a relative path below ``dir``; never absolute, without `..` components.
        public var out: String?
        /// `dir`: the directory to save in; may be absolute.
        public var dir: String?
        /// `checksum`: the digest the file must have (`sha-256=<hex>`, aria2's `TYPE=DIGEST`).
        public var checksum: ExpectedChecksum?
        /// `header`: extra request headers, each `Name: value`, in the order given.
        public var headers: [String]
        /// The number of connections, 1 to 16: the smaller of `split` and `max-connection-per-server` when both
        /// are given (aria2 opens at most `max-connection-per-server` to the one server).
        public var connections: Int?
        /// `max-download-limit` in bytes per second; `nil` for no limit (aria2's `0`).
        public var rateLimit: Int64?
        /// `adopt`: take over the partial download another program left at ``out`` (`true`), or not (`false`);
        /// nil when not given (the command line's choice).
        public var adopt: Bool?
        /// `conditional-get`: fetch only if the server's file is newer than the one there (`true`), or not
        /// (`false`); nil when not given (the command line's choice).
        public var ifNewer: Bool?
        /// `all-proxy`, `http-proxy`, `https-proxy` (with their `-user` and `-passwd`) and `no-proxy`.
        public var proxies = DownloadManager.Proxies()
        /// The 1-based line number of the URI line.
        public var line: Int
        /// Why this download cannot be made (a bad URI or option value), naming the line; `nil` for a good entry.
        /// The other fields hold what was read before and after it, and must not be used to download.
        public var problem: InputListError?

        /// Creates an entry.
        public init(
            uris: [String], out: String? = nil, dir: String? = nil, checksum: ExpectedChecksum? = nil,
            headers: [String] = [], connections: Int? = nil, rateLimit: Int64? = nil, line: Int,
            problem: InputListError? = nil
        ) {
            self.uris = uris
            self.out = out
            self.dir = dir
            self.checksum = checksum
            self.headers = headers
            self.connections = connections
            self.rateLimit = rateLimit
            self.line = line
            self.problem = problem
        }
    }

    /// Something in the list that was ignored rather than refused, such as an aria2 option Stitch does not support.
    public struct Warning: Sendable, Hashable, CustomStringConvertible {
        /// The 1-based line number.
        public var line: Int
        /// A message for people, e.g. `unsupported option "referer" ignored`.
        public var message: String

        /// Creates a warning.
        public init(line: Int, message: String) {
            self.line = line
            self.message = message
        }

        /// `line N: message`.
        public var description: String { "line \(line): \(message)" }
    }

    /// The downloads, in file order.
    public var entries: [Entry]
    /// What was ignored, in file order.
    public var warnings: [Warning]

    /// Creates a list.
    public init(entries: [Entry] = [], warnings: [Warning] = []) {
        self.entries = entries
        self.warnings = warnings
    }

    /// The option keys Stitch understands; any other key gives a warning.
    public static let supportedKeys: [String] = [
        "out", "dir", "checksum", "header", "split", "max-connection-per-server", "max-download-limit", "adopt",
        "all-proxy", "http-proxy", "https-proxy", "no-proxy", "all-proxy-user", "all-proxy-passwd", "http-proxy-user",
        "http-proxy-passwd", "https-proxy-user", "https-proxy-passwd", "conditional-get",
    ]

    /// Keys whose empty value means something (no proxy, no user).
    static let emptyAllowed: Set<String> = [
        "all-proxy", "http-proxy", "https-proxy", "no-proxy", "all-proxy-user", "all-proxy-passwd", "http-proxy-user",
        "http-proxy-passwd", "https-proxy-user", "https-proxy-passwd",
    ]

    /// The allowed values of `split` and `max-connection-per-server`.
    public static let connectionRange: ClosedRange<Int> = DownloadOptions.connectionRange

    /// Headers Stitch sets itself (as `stitch get -H` refuses them), compared in lowercase.
    static let reservedHeaders: Set<String> = ["range", "if-range", "accept-encoding"]

    /// Parses an input file held in a string.
    /// - Parameter text: The file's contents.
    /// - Returns: The entries and warnings; an empty or comment-only text gives no entries.
    /// - Throws: ``InputListError`` naming the line, for an option line before any URI line.
    public static func parse(_ text: String) throws(InputListError) -> InputList {
        try parse(bytes: text.utf8)
    }

    /// Parses an input file's raw bytes, as read from disk.
    /// - Parameter bytes: The file's contents, expected to be UTF-8.
    /// - Returns: The entries and warnings; an empty or comment-only file gives no entries.
    /// - Throws: ``InputListError`` naming the line, for invalid UTF-8, NUL bytes and an option line before any
    ///   URI line.
    public static func parse(bytes: some Collection<UInt8>) throws(InputListError) -> InputList {
        let data = Array(bytes)
        var parser = Parser()
        var start = data.starts(with: [0xEF, 0xBB, 0xBF]) ? 3 : 0
        var lineNumber = 0
        while start < data.count {
            lineNumber += 1
            let newline = data[start...].firstIndex(of: UInt8(ascii: "\n")) ?? data.count
            var end = newline
            if end > start, data[end - 1] == UInt8(ascii: "\r") { end -= 1 }
            let raw = data[start..<end]
            start = newline + 1
            if let nul = raw.firstIndex(of: 0) {
                throw InputListError(line: lineNumber, message: "NUL byte at byte \(nul - raw.startIndex + 1)")
            }
            if let offset = invalidUTF8Offset(raw) {
                throw InputListError(line: lineNumber, message: "invalid UTF-8 at byte \(offset + 1)")
            }
            try parser.consume(String(decoding: raw, as: UTF8.self), line: lineNumber)
        }
        return parser.finish()
    }

    /// The offset of the first byte that does not start a valid UTF-8 sequence, or `nil` if all are valid.
    static func invalidUTF8Offset(_ bytes: ArraySlice<UInt8>) -> Int? {
        var decoder = Unicode.UTF8.ForwardParser()
        var iterator = bytes.makeIterator()
        var offset = 0
        while true {
            switch decoder.parseScalar(from: &iterator) {
            case .valid(let encoded): offset += encoded.count
            case .emptyInput: return nil
            case .error: return offset
            }
        }
    }
}

// MARK: - InputListError

/// Why an input file was refused: the 1-based line and what is wrong with it.
public struct InputListError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The 1-based line number.
    public var line: Int
    /// A message for people, e.g. `'split' must be a whole number from 1 to 16, got "32"`.
    public var message: String

    /// Creates an error.
    public init(line: Int, message: String) {
        self.line = line
        self.message = message
    }

    /// `line N: message`.
    public var description: String { "line \(line): \(message)" }
}

// MARK: - Parser

extension InputList {

    /// Line-by-line state: the entry being built and what has been seen of it.
    struct Parser {
        var entries: [Entry] = []
        var warnings: [Warning] = []
        var current: Entry?
        var split: Int?
        var maxPerServer: Int?
        var seenKeys: Set<String> = []
        /// `*-proxy-user` and `*-proxy-passwd` by proxy (`all`, `http`, `https`), applied when the entry closes.
        var proxyUsers: [String: String] = [:]
        var proxyPasswords: [String: String] = [:]

        mutating func consume(_ line: String, line number: Int) throws(InputListError) {
            guard let first = line.unicodeScalars.first else { return }
            let body = InputList.trimmingBlanks(line)
            if body.isEmpty || body.unicodeScalars.first == "#" { return }
            if first == " " || first == "\t" {
                guard current != nil else {
                    throw InputListError(
                        line: number,
                        message: "option line \(InputList.quoted(body)) before any URI line (options are indented "
                            + "under the URI they apply to)")
                }
                do throws(InputListError) { try option(body, line: number) } catch { fail(error) }
            } else {
                startEntry(line, line: number)
            }
        }

        mutating func finish() -> InputList {
            closeEntry()
            return InputList(entries: entries, warnings: warnings)
        }

        /// The current download fails alone; its first problem is the one reported.
        private mutating func fail(_ error: InputListError) {
            if current?.problem == nil { current?.problem = error }
        }

        private mutating func closeEntry() {
            guard var entry = current else { return }
            switch (split, maxPerServer) {
            case (let a?, let b?): entry.connections = min(a, b)
            case (let a?, nil), (nil, let a?): entry.connections = a
            case (nil, nil): entry.connections = nil
            }
            for kind in DownloadManager.Proxies.Kind.allCases {
                entry.proxies.setCredentials(
                    kind, user: proxyUsers[kind.rawValue], password: proxyPasswords[kind.rawValue])
            }
            entries.append(entry)
            current = nil
            split = nil
            maxPerServer = nil
            seenKeys = []
            proxyUsers = [:]
            proxyPasswords = [:]
        }

        private mutating func startEntry(_ line: String, line number: Int) {
            closeEntry()
            var uris: [String] = []
            var problem: InputListError?
            for field in line.unicodeScalars.split(separator: "\t", omittingEmptySubsequences: true) {
                let uri = InputList.trimmingBlanks(field)
                guard !uri.isEmpty else { continue }
                if problem == nil, uri.unicodeScalars.contains(" ") {
                    problem = InputListError(
                        line: number,
                        message: "URI \(InputList.quoted(uri)) contains a space (separate mirrors with a TAB)")
                }
                if problem == nil,
                    let bad = uri.unicodeScalars.first(where: { FileNaming.isDropped($0) || $0.properties.isWhitespace })
                {
                    problem = InputListError(
                        line: number,
                        message: "URI \(InputList.quoted(uri)) contains the character \(InputList.codePoint(bad))")
                }
                uris.append(uri)
            }
            // A line of blanks was skipped before, so at least one field is non-empty.
            current = Entry(uris: uris, line: number, problem: problem)
        }

        private mutating func option(_ text: String, line number: Int) throws(InputListError) {
            guard let equals = text.unicodeScalars.firstIndex(of: "=") else {
                // A line naming a password is not repeated (it goes to stderr and --json).
                let shown = text.lowercased().contains("passwd") ? "a line naming a password" : InputList.quoted(text)
                throw InputListError(line: number, message: "expected key=value, got \(shown)")
            }
            let key = InputList.trimmingBlanks(text.unicodeScalars[..<equals])
            let value = InputList.trimmingBlanks(text.unicodeScalars[text.unicodeScalars.index(after: equals)...])
            guard !key.isEmpty else {
                throw InputListError(line: number, message: "option without a key: \(InputList.quoted(text))")
            }
            guard InputList.supportedKeys.contains(key) else {
                warnings.append(Warning(line: number, message: "unsupported option \(InputList.quoted(key)) ignored"))
                return
            }
            guard !value.isEmpty || InputList.emptyAllowed.contains(key) else {
                throw InputListError(line: number, message: "option '\(key)' has no value")
            }
            if key != "header", !seenKeys.insert(key).inserted {
                warnings.append(
                    Warning(line: number, message: "option '\(key)' given again for this URI; the last value is used"))
            }
            try apply(key: key, value: value, line: number)
        }

        private mutating func apply(key: String, value: String, line number: Int) throws(InputListError) {
            func fail(_ message: String) -> InputListError {
                InputListError(line: number, message: message)
            }
            switch key {
            case "out":
                if let problem = InputList.problem(withOut: value) {
                    throw fail("'out' \(problem), got \(InputList.quoted(value))")
                }
                current?.out = value
            case "dir":
                if let bad = value.unicodeScalars.first(where: FileNaming.isDropped) {
                    throw fail("'dir' contains the character \(InputList.codePoint(bad))")
                }
                current?.dir = value
            case "checksum":
                if let bad = value.unicodeScalars.first(where: FileNaming.isDropped) {
                    throw fail("'checksum' contains the character \(InputList.codePoint(bad))")
                }
                do {
                    current?.checksum = try ExpectedChecksum(parsing: value)
                } catch {
                    throw fail("'checksum': \(error.message)")
                }
            case "header":
                guard let (name, headerValue) = Downloader.parseHeaderLine(value) else {
                    throw fail(
                        "'header' must be 'Name: value' with a valid name and no control characters, got "
                            + InputList.quoted(value))
                }
                guard !InputList.reservedHeaders.contains(name.lowercased()) else {
                    throw fail("'header' \(name) is set by stitch itself and cannot be overridden")
                }
                current?.headers.append(headerValue.isEmpty ? "\(name):" : "\(name): \(headerValue)")
            case "split", "max-connection-per-server":
                let range = InputList.connectionRange
                let significant = value.drop { $0 == "0" }
                guard value.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), !significant.isEmpty else {
                    throw fail(
                        "'\(key)' must be a whole number from \(range.lowerBound) to \(range.upperBound), got "
                            + InputList.quoted(value))
                }
                // Above the maximum is capped, as aria2c caps it: what was meant ("many") is clear.
                var n = range.upperBound
                if significant.count <= 2, let small = Int(significant), small <= range.upperBound {
                    n = small
                } else {
                    warnings.append(
                        Warning(
                            line: number,
                            message: "'\(key)' \(InputList.quoted(value)) is above \(range.upperBound); using \(n)"))
                }
                if key == "split" { split = n } else { maxPerServer = n }
            case "max-download-limit":
                if InputList.isZeroRate(value) {
                    current?.rateLimit = nil
                } else if let rate = RateLimiter.parse(value) {
                    current?.rateLimit = rate
                } else {
                    throw fail(
                        "'max-download-limit' must be a rate like 500K, 2M or 1.5M (bytes per second; 0 for none), "
                            + "got \(InputList.quoted(value))")
                }
            case "all-proxy", "http-proxy", "https-proxy":
                let proxy: TransportOptions.Proxy
                do { proxy = try TransportOptions.Proxy(parsing: value) } catch { throw fail("'\(key)': \(error)") }
                switch key {
                case "all-proxy": current?.proxies.all = proxy
                case "http-proxy": current?.proxies.http = proxy
                default: current?.proxies.https = proxy
                }
            case "no-proxy":
                if let bad = value.unicodeScalars.first(where: { $0.value < 0x20 || $0.value == 0x7F }) {
                    throw fail("'no-proxy' contains the character \(InputList.codePoint(bad))")
                }
                current?.proxies.noProxy = value
            case "all-proxy-user", "http-proxy-user", "https-proxy-user":
                proxyUsers[String(key.prefix { $0 != "-" })] = value
            case "all-proxy-passwd", "http-proxy-passwd", "https-proxy-passwd":
                proxyPasswords[String(key.prefix { $0 != "-" })] = value
            case "adopt", "conditional-get":
                let flag: Bool
                switch value.lowercased() {
                case "true": flag = true
                case "false": flag = false
                default: throw fail("'\(key)' must be true or false, got \(InputList.quoted(value))")
                }
                if key == "adopt" { current?.adopt = flag } else { current?.ifNewer = flag }
            default:
                preconditionFailure("supportedKeys and apply(key:value:line:) disagree on '\(key)'")
            }
        }
    }

    // MARK: Helpers

    /// Why `out` is not a safe relative path, or `nil` if it is.
    ///
    /// Works on UTF-8 bytes, as the file system does: as `Character`s, `/` followed by a combining mark would not
    /// be a separator, and `../\u{301}x` would slip through.
    static func problem(withOut value: String) -> String? {
        let slash = UInt8(ascii: "/")
        if value.utf8.first == slash { return "must be a relative path" }
        if let bad = value.unicodeScalars.first(where: FileNaming.isDropped) {
            return "contains the character \(codePoint(bad))"
        }
        let components = value.utf8.split(separator: slash, omittingEmptySubsequences: false)
        if components.contains(where: { $0.elementsEqual("..".utf8) }) { return "must not contain a '..' component" }
        if let last = components.last, last.isEmpty || last.elementsEqual(".".utf8) {
            return "must name a file, not a directory"
        }
        return nil
    }

    /// Whether a `max-download-limit` value means "no limit": zero with an optional unit (`0`, `0K`, `0.0M`).
    static func isZeroRate(_ value: String) -> Bool {
        let number = value.prefix { $0 == "0" || $0 == "." }
        guard number.contains("0") else { return false }
        // The rest must be a unit `RateLimiter.parse` accepts.
        return RateLimiter.parse("1" + value[number.endIndex...]) != nil
    }

    /// `text` without leading and trailing spaces and TABs.
    static func trimmingBlanks(_ text: some StringProtocol) -> String {
        trimmingBlanks(text.unicodeScalars)
    }

    /// `scalars` without leading and trailing spaces and TABs, as a string.
    static func trimmingBlanks(_ scalars: some BidirectionalCollection<Unicode.Scalar>) -> String {
        guard let first = scalars.firstIndex(where: { $0 != " " && $0 != "\t" }),
            let last = scalars.lastIndex(where: { $0 != " " && $0 != "\t" })
        else { return "" }
        return String(String.UnicodeScalarView(scalars[first...last]))
    }

    /// `text` in double quotes for a message, cut after 80 characters, with `"`, `\\`, control, invisible and
    /// bidirectional characters escaped as `\u{…}` so a message cannot reorder or hide what a terminal shows.
    static func quoted(_ text: String) -> String {
        var result = "\""
        for (index, scalar) in text.unicodeScalars.enumerated() {
            if index == 80 {
                result += "\"…"
                return result
            }
            switch scalar {
            case "\"", "\\": result += "\\" + String(scalar)
            case "\t": result += "\\t"
            case "\r": result += "\\r"
            case _ where FileNaming.isDropped(scalar) || (scalar != " " && scalar.properties.isWhitespace):
                result += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result + "\""
    }

    /// `U+0009`.
    static func codePoint(_ scalar: Unicode.Scalar) -> String {
        let hex = String(scalar.value, radix: 16, uppercase: true)
        return "U+" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
    }
}
