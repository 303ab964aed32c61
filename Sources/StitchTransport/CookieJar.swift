import Foundation

/// Cookies read from a file in the Netscape/Mozilla text format (what `curl -c`, wget's `--save-cookies`, aria2 and
/// browser exporters write, and `curl -b`, `wget --load-cookies` and `aria2c --load-cookies` read), matched to each
/// request by the engine, so every transport sends the same `Cookie` header. Read-only: a response's `Set-Cookie`
/// changes nothing, and nothing of it is ever written to a state file.
///
/// One cookie a line, seven fields separated by TABs: domain, whether subdomains match (`TRUE`/`FALSE`), path,
/// secure (`TRUE`: https only), expiry (seconds since 1970; 0 for a session cookie, kept), name, value. A domain
/// written `#HttpOnly_example.com` is an HTTP-only cookie (sent like any other); other lines starting with `#` and
/// empty lines are skipped. Matching follows RFC 6265 §5.4: the domain (the host itself, or with the subdomain flag or
/// a leading dot a host ending in `.DOMAIN`), the path (equal, or a prefix ending at a `/`), secure, not expired; the
/// longer paths first.
public struct CookieJar: Sendable, Hashable, CustomStringConvertible {
    /// How many cookies; never their values.
    public var description: String { "CookieJar(\(cookies.count) cookies)" }

    /// One cookie of the file.
    public struct Cookie: Sendable, Hashable, CustomStringConvertible {
        /// The domain, path and name; never the value.
        public var description: String { "Cookie(\(domain)\(path) \(name))" }
        /// The host it is for, lowercased, without a leading dot.
        public var domain: String
        /// Whether hosts ending in `.` + ``domain`` match too.
        public var includesSubdomains: Bool
        /// The path it is for: requests for it and below it.
        public var path: String
        /// Sent over https only.
        public var secure: Bool
        /// Seconds since 1970; 0: a session cookie.
        public var expires: Int64
        /// Its name.
        public var name: String
        /// Its value, as in the file.
        public var value: String
    }

    /// A line that is not a cookie: its number (from 1) and why.
    public struct Problem: Sendable, Hashable, CustomStringConvertible {
        /// The line's number, from 1.
        public var line: Int
        /// What is wrong with it.
        public var reason: String
        /// `line N: REASON; skipped`.
        public var description: String { "line \(line): \(reason); skipped" }
    }

    /// The cookies read, in the file's order.
    public private(set) var cookies: [Cookie] = []
    /// The lines skipped, each named (at most the first 100 are kept).
    public private(set) var problems: [Problem] = []

    /// Reads `text` (a whole file). Malformed lines are skipped and listed in ``problems``.
    public init(text: String) {
        // Line by line without an array of them (a file of newlines stays cheap), by scalars: "\r\n" is one
        // Character, and a file written on Windows must still split into lines.
        var rest = text.unicodeScalars[...]
        var index = -1
        while !rest.isEmpty || index < 0 {
            index += 1
            let end = rest.firstIndex(of: "\n") ?? rest.endIndex
            var scalars = rest[..<end]
            rest = end == rest.endIndex ? rest[end...] : rest[rest.index(after: end)...]
            if scalars.last == "\r" { scalars = scalars.dropLast() }
            if scalars.isEmpty && rest.isEmpty { break }
            var line = Substring(String(String.UnicodeScalarView(scalars)))
            if line.hasPrefix("#HttpOnly_") {
                line = line.dropFirst("#HttpOnly_".count)
            } else if line.hasPrefix("#") || line.allSatisfy({ $0 == " " || $0 == "\t" }) {
                continue
            }
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false)
            func skip(_ reason: String) {
                if problems.count < 100 { problems.append(Problem(line: index + 1, reason: reason)) }
            }
            guard fields.count == 7 || fields.count == 6 else {
                skip("not a cookie: 7 fields separated by TABs expected, \(fields.count) found")
                continue
            }
            var domain = fields[0].lowercased()
            if domain.hasPrefix("["), domain.hasSuffix("]") { domain = String(domain.dropFirst().dropLast()) }
            let host = domain.hasPrefix(".") ? String(domain.dropFirst()) : domain
            guard !host.isEmpty, !host.contains(where: { $0 == " " || $0 == "/" }) else {
                skip("no domain")
                continue
            }
            guard let subdomains = Self.flag(fields[1]), let secure = Self.flag(fields[3]) else {
                skip("the second and fourth fields are TRUE or FALSE")
                continue
            }
            guard let expires = Int64(fields[4]), expires >= 0 else {
                skip("the expiry is seconds since 1970")
                continue
            }
            let name = String(fields[5])
            let value = fields.count == 7 ? String(fields[6]) : ""
            let forbidden: (Character) -> Bool = { $0 == ";" || $0.isNewline || $0 == "\u{0}" || $0.asciiValue.map { $0 < 0x20 || $0 == 0x7F } == true }
            guard !name.isEmpty, !name.contains(where: forbidden), !name.contains("="), !value.contains(where: forbidden)
            else {
                skip("a name and value without ';' or control characters expected")
                continue
            }
            let path = fields[2].isEmpty ? "/" : String(fields[2])
            guard path.hasPrefix("/") else {
                skip("the path starts with /")
                continue
            }
            cookies.append(
                Cookie(
                    domain: host, includesSubdomains: subdomains || domain.hasPrefix("."), path: path, secure: secure,
                    expires: expires, name: name, value: value))
        }
    }

    /// The `Cookie` header for a request of `url` at `now` (seconds since 1970), or nil when no cookie matches.
    public func header(for url: String, now: Double? = nil) -> String? {
        let now = now ?? Date().timeIntervalSince1970
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
            var host = components.host?.lowercased(), !host.isEmpty
        else { return nil }
        if host.hasPrefix("[") { host = String(host.dropFirst().dropLast()) }
        let path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        let matching = cookies.enumerated().filter { _, cookie in
            (cookie.expires == 0 || Double(cookie.expires) > now)
                && (!cookie.secure || scheme == "https")
                && Self.domainMatches(host, cookie)
                && Self.pathMatches(path, cookie.path)
        }
        guard !matching.isEmpty else { return nil }
        // Longer paths first; among equal paths, the file's order.
        let ordered = matching.sorted { a, b in
            a.element.path.count != b.element.path.count ? a.element.path.count > b.element.path.count : a.offset < b.offset
        }
        // At most 150 cookies and 8 KiB, as curl sends: servers refuse larger headers.
        var header = ""
        for (count, cookie) in ordered.enumerated() {
            let pair = "\(cookie.element.name)=\(cookie.element.value)"
            if count == 150 || header.utf8.count + pair.utf8.count + 2 > 8 << 10 { break }
            header += header.isEmpty ? pair : "; " + pair
        }
        return header.isEmpty ? nil : header
    }

    static func flag(_ text: Substring) -> Bool? {
        switch text.uppercased() {
        case "TRUE": true
        case "FALSE": false
        default: nil
        }
    }

    /// RFC 6265 §5.1.3: the host itself; with subdomains, a host ending in `.` + domain that is not an IP address.
    static func domainMatches(_ host: String, _ cookie: Cookie) -> Bool {
        if host == cookie.domain { return true }
        guard cookie.includesSubdomains, host.hasSuffix("." + cookie.domain) else { return false }
        let isAddress = host.contains(":") || host.split(separator: ".").allSatisfy { $0.allSatisfy(\.isNumber) }
        return !isAddress
    }

    /// RFC 6265 §5.1.4.
    static func pathMatches(_ requestPath: String, _ cookiePath: String) -> Bool {
        if requestPath == cookiePath { return true }
        guard requestPath.hasPrefix(cookiePath) else { return false }
        return cookiePath.hasSuffix("/") || requestPath.dropFirst(cookiePath.count).first == "/"
    }
}
