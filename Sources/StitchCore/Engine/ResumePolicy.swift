/// Why a download starts again from byte zero. Every case is said plainly to the user.
public enum RestartReason: Sendable, Hashable, CustomStringConvertible {
    /// The server answered a range request with the whole file (200).
    case rangeIgnored
    /// The server's `ETag` is not the one saved with the partial data.
    case etagChanged(old: String, new: String)
    /// The server's `Last-Modified` date is not the saved one (compared when the `ETag`s did not differ).
    case lastModifiedChanged(old: String, new: String)
    /// The file's complete length in bytes is not the saved one, or is shorter than the data already on disk.
    case lengthChanged(old: Int64, new: Int64)
    /// A 206 whose `Content-Range` is missing or does not match the request.
    case contentRangeMismatch(String)
    /// 416 while the local data is not the complete file.
    case rangeNotSatisfiable
    /// With no validator to send, the bytes just before the resume point differed from the file on disk.
    case overlapMismatch(offset: Int64)
    /// The saved state could not vouch for the partial data.
    case untrustedPartial(String)
    /// The digest of the whole file the server announces (`field`: `Repr-Digest`, `Digest`, `Content-Digest`) is
    /// not the one announced with the bytes kept (`old` and `new`: `algorithm=hex`).
    case digestChanged(field: String, old: String, new: String)
    /// A 206's `Content-Digest` does not match the bytes of that response (`range`: the bytes, `first-last`).
    case partDigestMismatch(range: String)

    /// The reason in words, as messages show it.
    public var description: String {
        switch self {
        case .rangeIgnored:
            return "the server sent the whole file instead of the requested range"
        case .etagChanged(let old, let new):
            return "the file changed on the server (ETag \(old) → \(new))"
        case .lastModifiedChanged(let old, let new):
            return "the file changed on the server (Last-Modified \(old) → \(new))"
        case .lengthChanged(let old, let new):
            return "the file changed on the server (length \(old) → \(new) bytes)"
        case .contentRangeMismatch(let header):
            return "the server's Content-Range (\(header.isEmpty ? "none" : header)) does not match the request"
        case .rangeNotSatisfiable:
            return "the server refused the range (416) and the local copy is not complete"
        case .overlapMismatch(let offset):
            return "the bytes before offset \(offset) no longer match the server's (no validator to check)"
        case .untrustedPartial(let why):
            return why
        case .digestChanged(let field, let old, let new):
            func short(_ text: String) -> String { text.count > 24 ? String(text.prefix(24)) + "…" : text }
            return "the file changed on the server (\(field) \(short(old)) → \(short(new)))"
        case .partDigestMismatch(let range):
            return "the bytes \(range) the server sent do not match its Content-Digest for them"
        }
    }
}

/// The request to send for the next attempt.
struct RequestPlan: Sendable, Hashable {
    /// The first byte asked for (`Range: bytes=N-`), or nil for the whole file.
    var rangeStart: Int64?
    /// The bytes below this offset are already on disk; anything the server sends below it is compared, not written.
    var resumeOffset: Int64
    var ifRange: String?
    /// One past the last byte asked for (`Range: bytes=N-(end-1)`), or nil for "to the end of the file".
    var rangeEnd: Int64? = nil
    /// For a request of the whole file with ``DownloadRequest/ifNewer``: what the file at the destination is, to
    /// ask for the server's only if it differs.
    var condition: FreshnessCondition? = nil

    var isRanged: Bool { rangeStart != nil }
}

/// What the file at a download's destination is, for ``DownloadRequest/ifNewer``: sent as `If-None-Match` and
/// `If-Modified-Since`, and compared with a server that answers 200 regardless.
struct FreshnessCondition: Sendable, Hashable {
    /// The `ETag` the file came with (its completion mark, when this download made it).
    var etag: String?
    /// The `Last-Modified` the file came with (its completion mark), else the file's modification time: the
    /// server's file is newer only if it changed after that.
    var modifiedSince: String
    /// Whether ``modifiedSince`` is the server's own date (from the mark) rather than the file's modification time.
    var serverDate: Bool
    /// The file's length in bytes.
    var length: Int64

    /// The headers sent (RFC 9110 §13.1.2–3: a server that knows ETags goes by `If-None-Match` and ignores the date).
    var headers: [(String, String)] {
        var headers: [(String, String)] = []
        if let etag { headers.append(("If-None-Match", etag)) }
        headers.append(("If-Modified-Since", modifiedSince))
        return headers
    }

    /// Why a 200 still shows the server's file to be the one at the destination (a server that ignores conditional
    /// requests): the same strong ETag and length; or, without an ETag to go by, a `Last-Modified` no later than
    /// the file's date and the same length (wget `-N`'s rule). Nil when it may be newer.
    func unchanged(by fresh: Validators) -> String? {
        guard fresh.totalLength == length else { return nil }
        // With an ETag to go by, only the same strong one says "the same file" (a weak, missing or other one may be
        // a new file that kept its date).
        if let etag { return fresh.strongETag == etag && !etag.hasPrefix("W/") ? "the same ETag \(etag)" : nil }
        guard let text = fresh.lastModified, let modified = HTTPDate.parse(text),
            let since = HTTPDate.parse(modifiedSince), modified <= since
        else { return nil }
        return serverDate ? "the same Last-Modified \(modifiedSince)" : "a Last-Modified no later than the file's date"
    }
}

/// What to do with a response head. Pure decisions, tested without sockets.
enum HeadVerdict: Sendable, Hashable {
    /// Take the body; its first byte belongs at `bodyStart`.
    case accept(bodyStart: Int64, validators: Validators)
    /// A 200 to a range request: discard the partial and take this body as the file from zero.
    case restartWithBody(RestartReason, validators: Validators)
    /// Abort this transfer, discard the partial, request the whole file again.
    case restart(RestartReason)
    /// 416 confirming the local data already is the whole file.
    case complete
    /// A conditional request (``RequestPlan/condition``) showed the file at the destination to be the server's:
    /// a 304, or a 200 with what ``FreshnessCondition/unchanged(by:)`` says (why, in words).
    case notModified(String)
    case redirect(location: String)
    /// A temporary failure (408, 429, 5xx); `retryAfter` is the raw header.
    case retry(status: Int, retryAfter: String?)
    /// A response that contradicts itself (e.g. a Content-Length unlike its Content-Range) without saying the
    /// file changed: not taken, tried again.
    case malformed(String)
    /// A body framed so that it can never be taken as the file's bytes (encoded despite `identity`, conflicting
    /// lengths): the same server sends the same again, so it is not tried again.
    case refused(String)
    case fail(status: Int)
}

/// The resume rules of DEVELOPERS.md rule 3 as functions of (what we know, what we asked, what came back).
enum ResumePolicy {
    /// Bytes re-fetched and compared when no validator can be sent with the range request.
    static let defaultOverlapWindow: Int64 = 64 * 1024
    /// The most bytes compared: they are read from the part file into memory before the body flows.
    static let maximumOverlapWindow: Int64 = 4 << 20

    /// Plans the next request given `offset` trusted bytes and what we know of the resource.
    static func plan(offset: Int64, known: Validators?, overlapWindow: Int64 = defaultOverlapWindow) -> RequestPlan {
        guard offset > 0, let known else { return RequestPlan(rangeStart: nil, resumeOffset: 0, ifRange: nil) }
        if let ifRange = known.ifRange {
            return RequestPlan(rangeStart: offset, resumeOffset: offset, ifRange: ifRange)
        }
        let window = min(max(0, overlapWindow), maximumOverlapWindow)
        return RequestPlan(rangeStart: max(0, offset - window), resumeOffset: offset, ifRange: nil)
    }

    /// Request headers the engine alone sets (lowercased); a caller's values for them are dropped.
    static let ownedHeaders: Set<String> = ["range", "if-range", "accept-encoding"]
    /// Request headers a caller's values are dropped for when the engine sends its own (``RequestPlan/condition``).
    static let conditionHeaders: Set<String> = ["if-none-match", "if-modified-since"]

    /// The headers of a request: the caller's, less the ones the engine owns (a caller's Range, If-Range or
    /// Accept-Encoding would splice or encode the file behind its back, so they are replaced, never merged),
    /// then the plan's.
    static func requestHeaders(user: HTTPHeaders, plan: RequestPlan) -> HTTPHeaders {
        var headers = HTTPHeaders()
        for field in user where !ownedHeaders.contains(field.name.lowercased()) {
            if plan.condition != nil, !plan.isRanged, conditionHeaders.contains(field.name.lowercased()) { continue }
            headers.add(name: field.name, value: field.value)
        }
        for (name, value) in Self.headers(for: plan) { headers.add(name: name, value: value) }
        return headers
    }

    /// The request headers a plan needs (besides the user's).
    static func headers(for plan: RequestPlan) -> [(String, String)] {
        var headers = [("Accept-Encoding", "identity")]
        if let start = plan.rangeStart {
            headers.append(("Range", "bytes=\(start)-" + (plan.rangeEnd.map { "\($0 - 1)" } ?? "")))
            if let ifRange = plan.ifRange { headers.append(("If-Range", ifRange)) }
        } else if let condition = plan.condition {
            headers += condition.headers
        }
        return headers
    }

    /// Judges a final response head against the plan and the known validators.
    static func evaluate(_ head: ResponseHead, plan: RequestPlan, known: Validators?) -> HeadVerdict {
        let status = head.status
        if status == 304, plan.condition != nil, !plan.isRanged {
            return .notModified("the server answered 304 Not Modified")
        }
        // Checked first: an encoded or ambiguously framed body is never taken as the file's bytes.
        if status == 200 || status == 206, let problem = head.headers.bodyFramingProblem {
            return .refused(problem)
        }
        switch status {
        case 301, 302, 303, 307, 308:
            guard let location = head.headers["Location"], !location.isEmpty else { return .fail(status: status) }
            return .redirect(location: location)
        case 206:
            guard let start = plan.rangeStart else {
                return .restart(.contentRangeMismatch("a partial response to a request for the whole file"))
            }
            let header = head.headers["Content-Range"] ?? ""
            guard let range = ContentRange(parsing: header), let first = range.first, let last = range.last,
                let complete = range.completeLength, first == start, last < complete
            else { return .restart(.contentRangeMismatch(header)) }
            // Shorter than what is already on disk: whatever we hold past its end is not this file.
            if complete < plan.resumeOffset {
                return .restart(.lengthChanged(old: known?.totalLength ?? plan.resumeOffset, new: complete))
            }
            if let length = head.headers["Content-Length"].flatMap({ Int64($0) }), length != last - first + 1 {
                return .malformed("Content-Length \(length) does not match Content-Range \(header)")
            }
            var fresh = Validators(from: head)
            if let change = change(from: known, to: fresh) { return .restart(change) }
            // Keep what we knew where the partial response is silent.
            fresh.etag = fresh.etag ?? known?.etag
            fresh.lastModified = fresh.lastModified ?? known?.lastModified
            fresh.digest = fresh.digest ?? known?.digest
            fresh.date = known?.date ?? fresh.date
            fresh.acceptRanges = true
            return .accept(bodyStart: start, validators: fresh)
        case 200:
            let fresh = Validators(from: head)
            if plan.isRanged {
                return .restartWithBody(change(from: known, to: fresh) ?? .rangeIgnored, validators: fresh)
            }
            if let condition = plan.condition, let same = condition.unchanged(by: fresh) {
                return .notModified("the server ignored the condition but sent \(same)")
            }
            return .accept(bodyStart: 0, validators: fresh)
        case 416:
            let complete = head.headers["Content-Range"].flatMap(ContentRange.init(parsing:))?.completeLength
            if let complete, let total = known?.totalLength, complete == total, plan.resumeOffset == total {
                return .complete
            }
            return .restart(.rangeNotSatisfiable)
        case 408, 429, 500...599:
            return .retry(status: status, retryAfter: head.headers["Retry-After"])
        default:
            return .fail(status: status)
        }
    }

    /// The first difference between what we knew and what the server says now, if any.
    static func change(from known: Validators?, to fresh: Validators) -> RestartReason? {
        guard let known else { return nil }
        if let old = known.etag, let new = fresh.etag, old != new { return .etagChanged(old: old, new: new) }
        if let old = known.lastModified, let new = fresh.lastModified, old != new {
            return .lastModifiedChanged(old: old, new: new)
        }
        if let old = known.totalLength, let new = fresh.totalLength, old != new {
            return .lengthChanged(old: old, new: new)
        }
        // A digest in another algorithm says nothing either way.
        if let old = known.digest, let new = fresh.digest, old.algorithm == new.algorithm, old.hex != new.hex {
            return .digestChanged(field: new.field, old: old.text, new: new.text)
        }
        return nil
    }
}
