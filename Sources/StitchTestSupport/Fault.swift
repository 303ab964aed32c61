/// What a stalled response does once it is released by ``TestHTTPServer/releaseStalls()``.
public enum AfterStall: Sendable, Hashable {
    /// Continue sending the rest of the response normally (the connection stays usable).
    case resume
    /// Close the connection abruptly without sending anything more.
    case close
}

/// How ``Fault/wrongContentRange(_:)`` misreports a 206 response. The body sent is always
/// consistent with the `Content-Range` header actually claimed.
public enum ContentRangeLie: Sendable, Hashable {
    /// Serve (and claim) the range starting `delta` bytes away from the requested start
    /// (clamped to the file), ending at the requested end.
    case shiftStart(by: Int)
    /// Serve the requested range but claim a different complete length: `bytes N-M/<total>`.
    case total(Int)
    /// Send this exact `Content-Range` value. If it parses as `bytes A-B/…` with A…B inside
    /// the file, those bytes are sent; otherwise the requested range is sent.
    case header(String)
}

/// A deliberate misbehaviour applied to one response. Choose faults per request with a
/// ``FaultPolicy``. Byte counts refer to body (payload) bytes, not header bytes.
public enum Fault: Sendable {
    /// Behave normally.
    case none
    /// Send the headers (full `Content-Length`) and the first `bytes` body bytes, then shut down
    /// and close the socket (the client sees a premature EOF).
    case dropAfter(Int)
    /// Like ``dropAfter(_:)`` but close with `SO_LINGER` 0 so the client sees a TCP reset.
    case resetAfter(Int)
    /// Send the headers and `bytes` body bytes, then send nothing until ``TestHTTPServer/releaseStalls()``
    /// is called (then act per `then`), the client disconnects, or the server stops (both close).
    /// ``TestHTTPServer/waitForStall(timeout:)`` returns once the stall is reached.
    case stallAfter(Int, then: AfterStall = .resume)
    /// Stall before sending anything at all (not even the status line); see ``stallAfter(_:then:)``.
    case stallBeforeHeaders(then: AfterStall = .resume)
    /// Announce the full `Content-Length`, send only `bytes` body bytes, then close gracefully.
    case shortBody(Int)
    /// Send `Content-Length: claimed` (instead of the real length) followed by the real body, then close.
    case wrongContentLength(Int)
    /// Reply 200 with the whole body even when a satisfiable `Range` was requested.
    case ignoreRange
    /// Reply 206 with a `Content-Range` that does not match the request (see ``ContentRangeLie``),
    /// even when no `Range` was requested (the request is then treated as `bytes=0-`).
    case wrongContentRange(ContentRangeLie)
    /// Reply with this status, these extra headers and this body instead of the file
    /// (e.g. 404, 408, 429 or 503 with `Retry-After`). `Date`, `Content-Length` and `Connection`
    /// are added unless given in `headers`.
    case status(Int, headers: [(String, String)] = [], body: [UInt8] = [])
    /// Reply with a redirect status (301/302/303/307/308) and this `Location` (sent verbatim).
    case redirect(Int, location: String)
    /// Send the body with `Transfer-Encoding: chunked` and no `Content-Length` (ranges still honoured).
    case chunked
    /// Pace the body at about `bytesPerSecond` (small writes with sleeps in between).
    case throttle(bytesPerSecond: Int)
    /// Send the first `bytes` of the body at full speed, then pace the rest at about `bytesPerSecond` (as nginx's
    /// `limit_rate` does after its first chunk): a burst that a short speed probe sees, then a capped connection.
    case throttleAfter(Int, bytesPerSecond: Int)
    /// Close the connection right after reading the request, without sending any byte.
    case closeWithoutResponse
    /// Send exactly these bytes as the whole response (status line, headers and body as given, nothing added),
    /// then close the connection gracefully (`.close`) or keep it open for the next request (`.resume`; only
    /// sensible when the bytes frame a complete response). Combined with a cut (`dropAfter`, `resetAfter`,
    /// `stallAfter`, `shortBody`) or `throttle` in ``all(_:)``, body bytes are the ones after the first blank
    /// line (`CRLF CRLF`, else `LF LF`); without one, every byte counts as body.
    case raw([UInt8], then: AfterStall = .close)
    /// Answer from this file instead of the path's (its bytes, validators and range support): another version of
    /// the file, as an edge of a CDN that has another copy would send, or the file changed on the server. `If-Range`
    /// is judged against this file's validators.
    case servedAs(ServedFile)
    /// Apply several faults at once, e.g. `.all([.chunked, .dropAfter(1000)])`. For conflicting
    /// settings the later fault wins; a response-replacing fault (`status`, `redirect`,
    /// `closeWithoutResponse`, `raw`) replaces the whole response (the first one given wins).
    case all([Fault])
}

/// Chooses the ``Fault`` for each request to a path. The closure receives the recorded request
/// and its 0-based index among all requests to that path.
public struct FaultPolicy: Sendable {
    private let choose: @Sendable (RecordedRequest, Int) -> Fault

    /// Creates a policy from a closure `(request, index) -> Fault`. The closure runs on a server
    /// thread outside the server's locks, so it may call back into the server.
    public init(_ choose: @escaping @Sendable (RecordedRequest, Int) -> Fault) {
        self.choose = choose
    }

    /// Returns the fault for `request`, the `index`-th request (0-based) to its path.
    public func fault(for request: RecordedRequest, index: Int) -> Fault {
        choose(request, index)
    }

    /// Never injects a fault.
    public static var none: FaultPolicy { FaultPolicy { _, _ in .none } }

    /// Applies `fault` to every request.
    public static func always(_ fault: Fault) -> FaultPolicy {
        FaultPolicy { _, _ in fault }
    }

    /// Applies `fault` to the `index`-th request (0-based) only.
    public static func onRequest(_ index: Int, _ fault: Fault) -> FaultPolicy {
        FaultPolicy { _, current in current == index ? fault : .none }
    }

    /// Applies `faults[i]` to the i-th request; requests not in the dictionary are normal.
    public static func onRequests(_ faults: [Int: Fault]) -> FaultPolicy {
        FaultPolicy { _, current in faults[current] ?? .none }
    }

    /// Applies `faults[0]` to the first request, `faults[1]` to the second, …, then `.none`.
    public static func sequence(_ faults: [Fault]) -> FaultPolicy {
        FaultPolicy { _, current in current < faults.count ? faults[current] : .none }
    }
}
