/// One request as received by ``TestHTTPServer``, recorded before the response is sent.
public struct RecordedRequest: Sendable {
    /// 0-based position among all requests the server received.
    public let serial: Int
    /// 0-based position among the requests to the same ``path`` (the index given to a ``FaultPolicy``).
    public let index: Int
    /// The request method, e.g. `GET` or `HEAD`.
    public let method: String
    /// The raw request target exactly as sent: `/a?b` (origin form) or `http://host:port/a` (absolute form).
    public let target: String
    /// The path the target maps to, without query (absolute-form targets are reduced to their path).
    public let path: String
    /// The query string without `?`, if any.
    public let query: String?
    /// The protocol version from the request line, e.g. `HTTP/1.1`.
    public let version: String
    /// All header fields in the order received, names as sent.
    public let headers: [(name: String, value: String)]
    /// Identifies the TCP connection (0-based, in accept order); equal ids mean a reused connection.
    public let connectionID: Int
    /// 0-based position of this request on its connection (1 or more means keep-alive reuse).
    public let indexOnConnection: Int

    /// The first value of the header `name` (case-insensitive), or nil.
    public func header(_ name: String) -> String? {
        let wanted = name.lowercased()
        return headers.first { $0.name.lowercased() == wanted }?.value
    }

    /// Every value of the header `name` (case-insensitive), in order.
    public func headerValues(_ name: String) -> [String] {
        let wanted = name.lowercased()
        return headers.filter { $0.name.lowercased() == wanted }.map(\.value)
    }

    /// The `Range` header value, if any.
    public var range: String? { header("Range") }
}

// MARK: - Internal parsing

/// A parsed request line plus header block.
struct RequestHead {
    var method: String
    var target: String
    var version: String
    var headers: [(name: String, value: String)]

    func header(_ name: String) -> String? {
        let wanted = name.lowercased()
        return headers.first { $0.name.lowercased() == wanted }?.value
    }

    /// Comma-separated tokens of every `Connection` header, lowercased.
    var connectionTokens: [String] {
        headers.filter { $0.name.lowercased() == "connection" }
            .flatMap { $0.value.split(separator: ",") }
            .map { $0.trimmingSpaces().lowercased() }
    }

    /// Whether the client wants the connection kept open after this exchange.
    var wantsKeepAlive: Bool {
        let tokens = connectionTokens
        if version == "HTTP/1.0" { return tokens.contains("keep-alive") }
        return !tokens.contains("close")
    }
}

enum HeadParseResult {
    /// No complete header block yet.
    case incomplete
    /// The header block exceeds the limit.
    case tooLarge
    /// Not a valid HTTP/1.x request.
    case malformed
    /// A request head, and how many buffer bytes it used.
    case head(RequestHead, consumed: Int)
}

/// Parses a request head from the start of `buffer` (leading empty lines are skipped).
func parseRequestHead(_ buffer: [UInt8], limit: Int) -> HeadParseResult {
    var start = 0
    while start + 1 < buffer.count, buffer[start] == 13, buffer[start + 1] == 10 { start += 2 }
    guard let end = findHeaderEnd(buffer, from: start) else {
        return buffer.count - start > limit ? .tooLarge : .incomplete
    }
    if end - start > limit { return .tooLarge }
    let text = String(decoding: buffer[start..<end], as: UTF8.self)
    var lines = text.split(separator: "\r\n", omittingEmptySubsequences: false)
    guard !lines.isEmpty else { return .malformed }
    let requestLine = lines.removeFirst()
    let parts = requestLine.split(separator: " ", omittingEmptySubsequences: false)
    guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty, parts[2].hasPrefix("HTTP/1.") else {
        return .malformed
    }
    var headers: [(name: String, value: String)] = []
    for line in lines where !line.isEmpty {
        guard let colon = line.firstIndex(of: ":") else { return .malformed }
        let name = line[..<colon]
        if name.isEmpty || name.contains(" ") || name.contains("\t") { return .malformed }
        headers.append((String(name), line[line.index(after: colon)...].trimmingSpaces()))
    }
    let head = RequestHead(
        method: String(parts[0]), target: String(parts[1]), version: String(parts[2]), headers: headers)
    return .head(head, consumed: end + 4)
}

/// Index of the `\r\n\r\n` terminating the header block (pointing at its first byte).
private func findHeaderEnd(_ buffer: [UInt8], from start: Int) -> Int? {
    guard buffer.count >= start + 4 else { return nil }
    var index = start
    while index + 3 < buffer.count {
        if buffer[index] == 13, buffer[index + 1] == 10, buffer[index + 2] == 13, buffer[index + 3] == 10 {
            return index
        }
        index += 1
    }
    return nil
}

/// Splits a request target into `(path, query)`. Absolute-form targets (`http://host/p?q`)
/// are reduced to their path; other forms are returned as the path.
func splitTarget(_ target: String) -> (path: String, query: String?) {
    var rest = Substring(target)
    let lower = target.lowercased()
    for scheme in ["http://", "https://"] where lower.hasPrefix(scheme) {
        rest = rest.dropFirst(scheme.count)
        if let slash = rest.firstIndex(where: { $0 == "/" || $0 == "?" || $0 == "#" }) {
            rest = rest[slash...]
        } else {
            rest = ""
        }
        if !rest.hasPrefix("/") { rest = "/" + rest }
        break
    }
    if let hash = rest.firstIndex(of: "#") { rest = rest[..<hash] }
    if let question = rest.firstIndex(of: "?") {
        return (String(rest[..<question]), String(rest[rest.index(after: question)...]))
    }
    return (String(rest), nil)
}

// MARK: - Ranges

/// The outcome of evaluating a `Range` header against a representation of `total` bytes.
enum RangeEvaluation: Equatable {
    /// Syntactically unsupported or multiple ranges: serve the whole representation (200).
    case ignore
    /// 416 with `Content-Range: bytes */total`.
    case unsatisfiable
    /// 206 for the inclusive byte range.
    case range(first: Int, last: Int)
}

/// Evaluates a single-range `Range` header like nginx does. Multiple ranges are ignored (200).
func evaluateRange(_ header: String, total: Int) -> RangeEvaluation {
    let trimmed = header.trimmingSpaces()
    guard trimmed.lowercased().hasPrefix("bytes=") else { return .ignore }
    let set = trimmed.dropFirst("bytes=".count)
    let specs = set.split(separator: ",", omittingEmptySubsequences: false)
    guard specs.count == 1 else { return .ignore }
    let spec = specs[0].trimmingSpaces()
    guard let dash = spec.firstIndex(of: "-") else { return .ignore }
    let firstText = spec[..<dash].trimmingSpaces()
    let lastText = spec[spec.index(after: dash)...].trimmingSpaces()
    if firstText.isEmpty {
        guard let suffix = parseDigits(lastText) else { return .ignore }
        if suffix == 0 || total == 0 { return .unsatisfiable }
        return .range(first: max(0, total - suffix), last: total - 1)
    }
    guard let first = parseDigits(firstText) else { return .ignore }
    var last = Int.max
    if !lastText.isEmpty {
        guard let parsed = parseDigits(lastText) else { return .ignore }
        last = parsed
    }
    if first > last || first >= total { return .unsatisfiable }
    return .range(first: first, last: min(last, total - 1))
}

/// Parses ASCII digits, saturating at `Int.max`; nil if empty or not all digits.
private func parseDigits(_ text: String) -> Int? {
    guard !text.isEmpty else { return nil }
    var value = 0
    for byte in text.utf8 {
        guard byte >= 48, byte <= 57 else { return nil }
        let (times, overflow1) = value.multipliedReportingOverflow(by: 10)
        let (sum, overflow2) = times.addingReportingOverflow(Int(byte - 48))
        value = overflow1 || overflow2 ? Int.max : sum
    }
    return value
}

/// Whether an `If-Range` value lets the range be honoured: an entity tag must equal the current
/// strong ETag exactly (weak tags never match); a date must equal `Last-Modified` exactly.
func ifRangeMatches(_ value: String, file: ServedFile) -> Bool {
    let condition = value.trimmingSpaces()
    if condition.hasPrefix("W/") { return false }
    if condition.hasPrefix("\"") {
        guard let etag = file.etag, !etag.hasPrefix("W/") else { return false }
        return etag == condition
    }
    guard let lastModified = file.lastModified else { return false }
    return lastModified == condition
}

/// Parses `bytes A-B/…` into an inclusive range, or nil.
func parseContentRange(_ value: String) -> (first: Int, last: Int)? {
    let trimmed = value.trimmingSpaces()
    guard trimmed.lowercased().hasPrefix("bytes ") else { return nil }
    let rest = trimmed.dropFirst("bytes ".count)
    guard let slash = rest.firstIndex(of: "/"), let dash = rest[..<slash].firstIndex(of: "-") else { return nil }
    guard let first = parseDigits(rest[..<dash].trimmingSpaces()),
        let last = parseDigits(rest[rest.index(after: dash)..<slash].trimmingSpaces()), first <= last
    else { return nil }
    return (first, last)
}

extension StringProtocol {
    /// The text without leading and trailing spaces and tabs.
    func trimmingSpaces() -> String {
        var slice = Substring(self)
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return String(slice)
    }
}
