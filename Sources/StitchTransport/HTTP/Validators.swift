// What a response head says about the file it carries, as both the engine and a backend that asks for a body in
// parts (the URLSession backend's windows) must read it alike.

/// What a response told us about the resource: the evidence a resume is checked against.
package struct Validators: Codable, Sendable, Hashable {
    package var etag: String?
    package var lastModified: String?
    /// The `Date` of the response that carried `lastModified` (RFC 9110 §8.8.2.2 needs it to call a date strong).
    package var date: String?
    /// The complete length, when the server said it.
    package var totalLength: Int64?
    package var acceptRanges: Bool
    /// The digest of the whole file the server announced (``AnnouncedDigest``), verified once it is complete.
    package var digest: AnnouncedDigest? = nil

    /// Validators with these values.
    package init(
        etag: String?, lastModified: String?, date: String?, totalLength: Int64?, acceptRanges: Bool,
        digest: AnnouncedDigest? = nil
    ) {
        self.etag = etag
        self.lastModified = lastModified
        self.date = date
        self.totalLength = totalLength
        self.acceptRanges = acceptRanges
        self.digest = digest
    }

    package static let none = Validators(etag: nil, lastModified: nil, date: nil, totalLength: nil, acceptRanges: false)

    package var strongETag: String? {
        guard let etag, !etag.hasPrefix("W/"), etag.hasPrefix("\"") else { return nil }
        return etag
    }

    /// Last-Modified counts as strong only if it is at least one second older than the response's Date.
    package var strongLastModified: String? {
        guard let lastModified, let modified = HTTPDate.parse(lastModified),
            let date, let sent = HTTPDate.parse(date), sent - modified >= 1
        else { return nil }
        return lastModified
    }

    /// The `If-Range` value to send, if any validator is strong enough for it.
    package var ifRange: String? { strongETag ?? strongLastModified }

    /// Whether the rest of the resource can be asked for with a validated range request.
    package var canResume: Bool { acceptRanges && ifRange != nil && totalLength != nil }
}

extension Validators {
    /// The validators and length a final response head carries.
    package init(from head: ResponseHead) {
        let headers = head.headers
        var total: Int64?
        if head.status == 206 {
            total = headers["Content-Range"].flatMap(ContentRange.init(parsing:))?.completeLength
        } else if head.status == 200, headers["Transfer-Encoding"] == nil {
            // Digits only, as for Content-Range: no sign, and no length so large that offsets could overflow.
            total = headers["Content-Length"].flatMap { ContentRange.number(Substring($0)) }
        }
        let acceptRanges = headers["Accept-Ranges"]?.lowercased().contains("bytes") ?? (head.status == 206)
        self.init(
            etag: Self.echoable(headers["ETag"]), lastModified: Self.echoable(headers["Last-Modified"]), date: headers["Date"],
            totalLength: total, acceptRanges: acceptRanges, digest: AnnouncedDigest(from: head))
    }

    /// A validator that may be sent back in `If-Range`, or nil: one with control characters (a bare CR would split
    /// the request's header lines) is treated as absent.
    package static func echoable(_ value: String?) -> String? {
        guard let value, !value.isEmpty,
            !value.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
        else { return nil }
        return value
    }
}

extension HTTPHeaders {
    /// Why a 200/206 body cannot be the file's bytes as sent: an encoding despite `Accept-Encoding: identity`
    /// (libcurl does not decode, so the encoded bytes would be saved as the file), a transfer coding other than
    /// chunked, or conflicting `Content-Length` fields (RFC 9112 §6.3: the framing cannot be trusted).
    package var bodyFramingProblem: String? {
        let headers = self
        func codings(_ name: String) -> [String] {
            headers.values(name)
                .flatMap { $0.lowercased().split(separator: ",") }
                .map { String($0).trimming(" \t") }.filter { !$0.isEmpty && $0 != "identity" }
        }
        let content = codings("content-encoding")
        if !content.isEmpty {
            let coding = content.joined(separator: ", ").debugDescription
            return "the server sent an encoded body (Content-Encoding: \(coding)) despite Accept-Encoding: identity"
        }
        let transfer = codings("transfer-encoding").filter { $0 != "chunked" }
        if !transfer.isEmpty {
            let coding = transfer.joined(separator: ", ").debugDescription
            return "the server sent an encoded body (Transfer-Encoding: \(coding))"
        }
        let lengths = Set(headers.values("content-length"))
        if lengths.count > 1 { return "the server sent conflicting Content-Length headers" }
        return nil
    }
}
