import CStitchSystem
import Glibc
import Stitch

/// An in-memory file that ``TestHTTPServer`` serves at a path.
///
/// Its validators (`etag`, `lastModified`) are sent verbatim and used for `If-Range`
/// evaluation. Serve a different `ServedFile` at the same path (``TestHTTPServer/serve(_:file:faults:)``
/// or ``TestHTTPServer/replaceFile(_:with:)``) to simulate the resource changing between requests.
public struct ServedFile: Sendable {
    /// The complete body.
    public var data: [UInt8]
    /// The `ETag` header value, quotes included: `"\"abc\""` (strong) or `"W/\"abc\""` (weak). Nil sends none.
    public var etag: String?
    /// The `Last-Modified` header value, an HTTP-date (see ``httpDate(secondsSince1970:)``). Nil sends none.
    public var lastModified: String?
    /// When true (the default) the server honours `Range` and sends `Accept-Ranges: bytes`;
    /// when false it ignores `Range` (always 200 with the full body) and never sends `Accept-Ranges`.
    public var acceptRanges: Bool
    /// The `Content-Disposition` header value, sent verbatim (it may be deliberately hostile). Nil sends none.
    public var contentDisposition: String?
    /// The `Content-Type` header value.
    public var contentType: String
    /// Extra response headers sent verbatim after the standard ones.
    public var extraHeaders: [(String, String)]
    /// When true (the default) a GET or HEAD with `If-None-Match` (weak comparison, `*` matching any) or, without
    /// it, `If-Modified-Since` no earlier than ``lastModified`` is answered 304 Not Modified (RFC 9110 §13.2.2);
    /// when false the conditions are ignored (a 200), as some servers and caches do.
    public var honoursConditions = true

    /// Creates a served file.
    public init(
        data: [UInt8],
        etag: String? = nil,
        lastModified: String? = nil,
        acceptRanges: Bool = true,
        contentDisposition: String? = nil,
        contentType: String = "application/octet-stream",
        extraHeaders: [(String, String)] = []
    ) {
        self.data = data
        self.etag = etag
        self.lastModified = lastModified
        self.acceptRanges = acceptRanges
        self.contentDisposition = contentDisposition
        self.contentType = contentType
        self.extraHeaders = extraHeaders
    }

    /// Creates a file whose body is `size` deterministic pseudo-random bytes derived from `seed`
    /// (see ``randomBytes(count:seed:)``).
    public static func random(
        size: Int,
        seed: UInt64,
        etag: String? = nil,
        lastModified: String? = nil,
        acceptRanges: Bool = true,
        contentDisposition: String? = nil,
        contentType: String = "application/octet-stream"
    ) -> ServedFile {
        ServedFile(
            data: randomBytes(count: size, seed: seed), etag: etag, lastModified: lastModified,
            acceptRanges: acceptRanges, contentDisposition: contentDisposition, contentType: contentType)
    }

    /// Returns `count` deterministic pseudo-random bytes (SplitMix64 stream) for `seed`.
    /// The same `(count, seed)` always gives the same bytes, and a shorter count is a prefix
    /// of a longer one. Fast enough for tens of MiB even in debug builds.
    public static func randomBytes(count: Int, seed: UInt64) -> [UInt8] {
        precondition(count >= 0, "count must not be negative")
        return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            if let base = buffer.baseAddress { stitch_splitmix_fill(base, count, seed) }
            initialized = count
        }
    }

    /// Formats a Unix time as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form
    /// used by `Date`, `Last-Modified` and `Retry-After`.
    public static func httpDate(secondsSince1970: Int) -> String {
        var time = time_t(secondsSince1970)
        var parts = tm()
        gmtime_r(&time, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) "
            + "\(1900 + parts.tm_year) \(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }

    /// Whether a request with these condition headers is answered 304 (RFC 9110 §13.2.2: `If-None-Match` first,
    /// else `If-Modified-Since`).
    public func notModified(ifNoneMatch: String?, ifModifiedSince: String?) -> Bool {
        guard honoursConditions else { return false }
        if let ifNoneMatch {
            guard let etag else { return false }
            func opaque(_ tag: Substring) -> Substring { tag.hasPrefix("W/") ? tag.dropFirst(2) : tag }
            let tags = ifNoneMatch.split(separator: ",").map { $0.drop { $0 == " " }.reversed().drop { $0 == " " } }
                .map { Substring(String($0.reversed())) }
            return tags.contains { $0 == "*" || opaque($0) == opaque(Substring(etag)) }
        }
        guard let ifModifiedSince, let since = HTTPDate.parse(ifModifiedSince),
            let lastModified, let modified = HTTPDate.parse(lastModified)
        else { return false }
        return modified <= since
    }

    /// The current time as an HTTP-date.
    public static func httpDateNow() -> String {
        httpDate(secondsSince1970: Int(time(nil)))
    }
}
