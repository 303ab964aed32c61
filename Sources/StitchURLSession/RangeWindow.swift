import StitchTransport

/// How a transport that cannot stop a transfer promptly (URLSession: `cancel()` runs behind the reading) bounds what
/// one response can bring: it asks for at most a *window* of bytes per request, shows the engine the response the
/// engine asked for, and fetches the rest window by window with `If-Range` under the first response's strong
/// validator, checking every answer against that first one. Bytes of two versions of the file are never joined: a
/// later window that is not exactly the next bytes of the same version ends the body as a failure, and the engine's
/// own resume then finds the change.
///
/// Pure decisions over headers, tested without sockets. Only requests whose rest can be proven to be of one version
/// are windowed:
/// - a request for the whole file (no `Range`) asks for `bytes=0-(W-1)`; a `206` whose `Content-Range` is exactly
///   that window and that carries a strong validator (or is the whole file) is shown as the `200` it stands for.
///   A `206` without a strong validator, a `416` (an empty file), or a `206` that does not match is not shown: the
///   request is sent again as the engine made it. Anything else (a `200`, a redirect, an error) is the answer as it
///   came.
/// - a range request with `If-Range` (`bytes=N-` or `bytes=N-M`, longer than a window) asks for `W` bytes from `N`;
///   a `206` whose `Content-Range` is exactly that window is shown as the answer to the engine's range. Anything
///   else is the answer as it came, for the engine to judge against what it asked.
/// - any other request (a range without `If-Range`, several ranges, a range that fits in a window) is sent as is.
struct RangeWindow: Sendable, Hashable {
    /// The first byte the engine asked for (0 for the whole file).
    let start: Int64
    /// The last byte the engine asked for, or nil for "to the end".
    let end: Int64?
    /// Whether the engine asked for the whole file (no `Range`).
    let wholeFile: Bool
    /// The most bytes one request asks for.
    let size: Int64
    /// The engine's `If-Range`, for a range request.
    let ifRange: String?

    /// The window for a request with these headers, or nil when it is sent as is.
    init?(requestHeaders headers: HTTPHeaders, size: Int) {
        guard size > 0 else { return nil }
        self.size = Int64(size)
        let ranges = headers.filter { $0.name.lowercased() == "range" }
        if ranges.isEmpty {
            guard !headers.contains("If-Range") else { return nil }
            start = 0
            end = nil
            wholeFile = true
            ifRange = nil
            return
        }
        // Only the engine's own form, with a validator that keeps every window on one version of the file.
        let ifRanges = headers.filter { $0.name.lowercased() == "if-range" }
        guard ranges.count == 1, ifRanges.count == 1, let (first, last) = Self.parseRange(ranges[0].value) else {
            return nil
        }
        if let last, last - first + 1 <= self.size { return nil }  // fits in one window already
        start = first
        end = last
        wholeFile = false
        ifRange = ifRanges[0].value
    }

    /// The last byte the window asks for.
    var windowLast: Int64 {
        let last = start + size - 1
        return end.map { min($0, last) } ?? last
    }

    /// The `Range` value sent.
    var rangeValue: String { "bytes=\(start)-\(windowLast)" }

    /// What to do with the response to a windowed request.
    enum Adaptation: Sendable, Hashable {
        /// Show the engine this head as it came.
        case pass
        /// Show the engine `head`; this response's body is `bodyLength` bytes, and `rest` (if the head promises more)
        /// says how to ask for what follows.
        case rewrite(head: ResponseHead, bodyLength: Int64, rest: Rest?)
        /// Do not show this response: send the engine's request as it made it.
        case sendAsAsked
    }

    /// What the response `head` to the windowed request stands for.
    func adapt(_ head: ResponseHead) -> Adaptation {
        guard head.status == 206 else {
            // 416 to a whole-file request: the window may lie past an empty file's end; ask as the engine did.
            return head.status == 416 && wholeFile ? .sendAsAsked : .pass
        }
        let contentRanges = head.headers.filter { $0.name.lowercased() == "content-range" }
        let lengths = head.headers.filter { $0.name.lowercased() == "content-length" }
        // A chunked answer is framed by its chunks (the transport undoes them, as libcurl does); any other transfer
        // coding is the engine's to refuse, in the answer as it came.
        let codings = head.headers.filter { $0.name.lowercased() == "transfer-encoding" }
        guard codings.allSatisfy({ $0.value.trimming(" \t").lowercased() == "chunked" }), codings.count <= 1,
            contentRanges.count == 1, lengths.count <= 1,
            let range = ContentRange(parsing: contentRanges[0].value), let first = range.first,
            let last = range.last, let complete = range.completeLength, first == start, last < complete,
            last == min(windowLast, complete - 1),
            lengths.first.map({ ContentRange.number(Substring($0.value.trimming(" \t"))) == last - first + 1 }) ?? true
        else { return wholeFile ? .sendAsAsked : .pass }
        let windowLength = last - first + 1
        var headers = HTTPHeaders()
        for field in head.headers
        // A window's Content-Digest (and Digest, by some) is its own bytes': never shown as the whole file's.
        where !["content-range", "content-length", "transfer-encoding", "content-digest", "digest"]
            .contains(field.name.lowercased())
        {
            headers.add(name: field.name, value: field.value)
        }
        let askedLast = end.map { min($0, complete - 1) } ?? (complete - 1)
        let validators = Validators(from: head)
        let validator = wholeFile ? validators.ifRange : ifRange
        let rest = last < askedLast ? validator.map {
            Rest(next: last + 1, last: askedLast, size: size, validator: $0, completeLength: complete,
                etag: validators.etag, lastModified: validators.lastModified, digest: validators.digest)
        } : nil
        if last < askedLast && rest == nil { return .sendAsAsked }  // (only a whole-file request lacks a validator)
        if wholeFile {
            headers.add(name: "Content-Length", value: "\(complete)")
            if !headers.contains("Accept-Ranges") { headers.add(name: "Accept-Ranges", value: "bytes") }
            return .rewrite(head: ResponseHead(status: 200, headers: headers), bodyLength: windowLength, rest: rest)
        }
        headers.add(name: "Content-Range", value: "bytes \(start)-\(askedLast)/\(complete)")
        headers.add(name: "Content-Length", value: "\(askedLast - start + 1)")
        return .rewrite(head: ResponseHead(status: 206, headers: headers), bodyLength: windowLength, rest: rest)
    }

    /// The rest of a windowed body: what to ask for next, and what its answers must agree with.
    struct Rest: Sendable, Hashable {
        /// The next byte to ask for.
        var next: Int64
        /// The last byte the head shown promised.
        let last: Int64
        /// The most bytes one request asks for.
        let size: Int64
        /// The strong validator sent as `If-Range`.
        let validator: String
        /// The file's complete length, as the first answer gave it.
        let completeLength: Int64
        /// The first answer's validators.
        let etag: String?
        let lastModified: String?
        /// The first answer's announced digest of the whole file.
        var digest: AnnouncedDigest? = nil

        /// The bytes the next request asks for (first and last).
        var nextWindow: (first: Int64, last: Int64) { (next, min(next + size - 1, last)) }

        /// Why `head`, the answer to a request for `window`, is not exactly those bytes of the same version of the
        /// file; nil when it is.
        func problem(with head: ResponseHead, window: (first: Int64, last: Int64)) -> String? {
            guard head.status == 206 else {
                return head.status == 200
                    ? "the server answered a request for the next bytes with the whole file (did the file change?)"
                    : "the server answered a request for the next bytes with HTTP \(head.status)"
            }
            if let problem = head.headers.bodyFramingProblem { return problem }
            let contentRanges = head.headers.filter { $0.name.lowercased() == "content-range" }
            let lengths = head.headers.filter { $0.name.lowercased() == "content-length" }
            let header = contentRanges.first?.value ?? ""
            guard contentRanges.count == 1, lengths.count <= 1, let range = ContentRange(parsing: header),
                range.first == window.first, range.last == window.last
            else { return "the server's Content-Range (\(header.isEmpty ? "none" : header)) for the next bytes "
                + "does not match the request (bytes \(window.first)-\(window.last))" }
            if let length = lengths.first, ContentRange.number(Substring(length.value.trimming(" \t")))
                != window.last - window.first + 1
            {
                return "Content-Length \(length.value) does not match Content-Range \(header)"
            }
            if range.completeLength != completeLength {
                let now = range.completeLength.map(String.init) ?? "unknown"
                return "the file changed on the server (length \(completeLength) → \(now) bytes)"
            }
            let fresh = Validators(from: head)
            if let old = etag, let new = fresh.etag, old != new {
                return "the file changed on the server (ETag \(old) → \(new))"
            }
            if let old = lastModified, let new = fresh.lastModified, old != new {
                return "the file changed on the server (Last-Modified \(old) → \(new))"
            }
            if let old = digest, let new = fresh.digest, old.algorithm == new.algorithm, old.hex != new.hex {
                return "the file changed on the server (\(new.field) \(old.text) → \(new.text))"
            }
            return nil
        }
    }

    /// `bytes=N-` or `bytes=N-M` (N ≤ M), the forms the engine sends; nil for anything else.
    static func parseRange(_ value: String) -> (Int64, Int64?)? {
        let trimmed = value.trimming(" \t")
        guard trimmed.hasPrefix("bytes=") else { return nil }
        let ends = trimmed.dropFirst(6).split(separator: "-", omittingEmptySubsequences: false)
        guard ends.count == 2, let first = ContentRange.number(ends[0]) else { return nil }
        if ends[1].isEmpty { return (first, nil) }
        guard let last = ContentRange.number(ends[1]), first <= last else { return nil }
        return (first, last)
    }
}
