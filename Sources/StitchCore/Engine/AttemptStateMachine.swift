import Foundation

/// What one request of a download ended with, as its executor saw it: the input of
/// ``AttemptStateMachine/attemptEnded(_:now:jitter:)``.
struct AttemptReport: Sendable {
    /// What the body sink ran into, if anything.
    enum SinkOutcome: Sendable {
        case none
        /// The range was written to where its segment now ends (a split may have moved the end closer).
        case reachedEnd
        /// The slow-connection monitor asked for a new connection.
        case replaced
        /// Bytes re-fetched to check a resume without a validator differed from the ones on disk.
        case overlapMismatch(at: Int64)
        /// More body than the response announced.
        case tooLong
        /// A 206's whole body did not match its `Content-Digest` (bytes `first-last`).
        case partDigestMismatch(range: String)
        /// A write, a checkpoint or an earlier write failed; the sink stopped. The download ends (the partial stays).
        case storageFailed(DownloadError)
    }

    /// The engine's reading of the response head; nil when no head arrived.
    var verdict: HeadVerdict?
    var result: Result<Void, TransportError>
    var sink: SinkOutcome = .none
    /// How far this request's range is written now, and where it has to end (nil: the length is unknown).
    var written: Int64
    var end: Int64?
    /// Bytes this request saved that were not on disk before it.
    var saved: Int64
    /// Bytes of the download that are durable now (for messages and whether a rerun can resume).
    var durable: Int64
}

/// The next step after one request.
enum AttemptAction: Sendable {
    /// Ask again at once, from where the range got to (its end moved, or the connection was replaced).
    case requestAgain
    /// Ask the redirect's target (``AttemptStateMachine/url`` has moved to it).
    case follow(URL)
    /// The bytes kept cannot be trusted for this reason: start over from zero.
    case restart(RestartReason)
    /// The range (or the whole file) is written; nothing further to ask.
    case complete
    /// Wait, then ask again from the start URL (redirect targets may expire).
    case wait(seconds: Double, attempt: Int, of: Int, reason: String)
    /// The download ends with this error; nothing a retry could change, or the retries ran out.
    case fail(DownloadError)
    /// The request was cancelled: the run is being interrupted.
    case interrupted
}

/// The decisions of one request sequence — the single connection's, or one lane's of several — as a pure state
/// machine: the executor performs a request, reports how it ended, and does what the returned action says. No
/// I/O, no clock of its own (`now` and the jitter are passed in), so every rule is a unit test.
///
/// The rules, in order:
/// - Cancellation wins: the run is being interrupted.
/// - The sink's own trouble: a failed write or checkpoint ends the download (the partial stays); a mismatch in
///   the re-fetched overlap restarts from zero; a segment cut short by a split, or a replaced connection, asks
///   again at once.
/// - The head: redirects are followed (resolved against the URL that sent them, loops and too many refused); a
///   restart verdict restarts; a 416 over a complete file completes; a status that is not temporary fails at once;
///   a body that can never be the file's bytes (conflicting lengths, an encoded body) fails at once: the same
///   server sends the same again. A response that contradicts itself (a `Content-Length` unlike its
///   `Content-Range`) is retried: one edge of a CDN may be at fault.
/// - The transport: TLS failures, a host that does not resolve, and a response libcurl refuses outright fail at
///   once. A refused or timed-out connection is tried `RetryPolicy/maxConnectTries` times in all, within seconds.
///   Everything else (a dropped connection, a stall, 408/429/5xx, a body that ended early) is retried with
///   exponential backoff (or `Retry-After`), up to `RetryPolicy/maxRetries` times without progress: a request
///   that saves `RetryPolicy/minimumProgress` bytes (counted over attempts) resets the count.
/// - Giving up offers a rerun (``DownloadError/Remedy/rerun(_:)``) only when bytes were saved, so that a rerun has
///   something to resume.
struct AttemptStateMachine: Sendable {
    /// Whose requests these are, for the words of a failure.
    enum Scope: Sendable { case download, connection }

    let policy: RetryPolicy
    let maxRedirects: Int
    let scope: Scope
    let startURL: URL
    /// The URL the next request goes to.
    private(set) var url: URL
    private var redirects: RedirectChain
    /// Retryable failures in a row without `minimumProgress` bytes saved.
    private(set) var failures = 0
    /// Connections refused or timed out in a row.
    private(set) var connectFailures = 0
    private var savedSinceReset: Int64 = 0

    init(startURL: URL, policy: RetryPolicy, maxRedirects: Int, scope: Scope) {
        self.startURL = startURL
        self.url = startURL
        self.policy = policy
        self.maxRedirects = maxRedirects
        self.scope = scope
        self.redirects = RedirectChain(limit: maxRedirects)
    }

    /// Asks the start URL again with a fresh redirect chain (a restart, a resume under a new name).
    mutating func resetURL() {
        url = startURL
        redirects.reset()
    }

    /// The decision after a request ended as `report` says.
    mutating func attemptEnded(_ report: AttemptReport, now: Int64, jitter: Double) -> AttemptAction {
        noteProgress(report.saved)
        // A request the engine cut short itself (a split, a replaced connection) is not an interruption.
        if case .reachedEnd = report.sink { return .requestAgain }
        if case .replaced = report.sink { return .requestAgain }
        if case .failure(let error) = report.result, error.isCancelled { return .interrupted }

        switch report.sink {
        case .storageFailed(let error):
            return .fail(error)
        case .overlapMismatch(let offset):
            return .restart(.overlapMismatch(offset: offset))
        case .partDigestMismatch(let range):
            return .restart(.partDigestMismatch(range: range))
        case .reachedEnd, .replaced:
            return .requestAgain
        case .tooLong:
            return retry(.tooLong, report: report, now: now, jitter: jitter)
        case .none:
            break
        }

        switch report.verdict {
        case .redirect(let location):
            do {
                url = try redirects.follow(location, from: url)
            } catch {
                return .fail(error)
            }
            return .follow(url)
        case .restart(let reason):
            return .restart(reason)
        case .complete:
            return .complete
        case .notModified:
            // Only the first request carries a condition, and its decision ends the run with the result.
            return .fail(DownloadError(.protocolViolation, "an unexpected 304 Not Modified from \(url.absoluteString)"))
        case .fail(let status):
            // A 407 is the proxy's, not the server's (a plain http:// URL through an HTTP proxy).
            let from =
                status == 407
                ? "from the proxy for \(url.absoluteString) (it asks for credentials)" : "from \(url.absoluteString)"
            return .fail(DownloadError(
                .httpStatus, "HTTP \(status) \(statusText(status)) \(from)", httpStatus: status,
                resumable: report.durable > 0))
        case .retry(let status, let retryAfter):
            return retry(.status(status, retryAfter: retryAfter), report: report, now: now, jitter: jitter)
        case .malformed(let why):
            return retry(.malformed(why), report: report, now: now, jitter: jitter)
        case .refused(let why):
            return .fail(DownloadError(
                .protocolViolation, "\(why) (from \(url.absoluteString))", resumable: report.durable > 0))
        case .accept, .restartWithBody:
            switch report.result {
            case .success:
                if let end = report.end, report.written < end {
                    return retry(
                        .closedEarly(written: report.written, end: end), report: report, now: now, jitter: jitter)
                }
                return .complete
            case .failure(let error):
                return transportFailed(error, report: report, now: now, jitter: jitter)
            }
        case nil:
            switch report.result {
            case .success:
                return .fail(DownloadError(.protocolViolation, "no response from \(url.absoluteString)"))
            case .failure(let error):
                return transportFailed(error, report: report, now: now, jitter: jitter)
            }
        }
    }

    /// Why a request is worth repeating.
    enum RetryCause: Sendable {
        case status(Int, retryAfter: String?)
        case transport(TransportError)
        case closedEarly(written: Int64, end: Int64)
        case tooLong
        case malformed(String)

        var reason: String {
            switch self {
            case .status(let status, _): return "HTTP \(status) \(statusText(status))".trimming(" ")
            case .transport(let error): return error.message
            case .closedEarly(let written, let end): return "the connection closed at \(written) of \(end) bytes"
            case .tooLong: return "the server sent more data than it announced"
            case .malformed(let why): return why
            }
        }
    }

    private mutating func noteProgress(_ saved: Int64) {
        guard saved > 0 else { return }
        // A request that got a response and saved bytes has connected: refused connections start counting anew.
        connectFailures = 0
        // Progress means new bytes saved: re-fetching the overlap window again and again is not progress, nor is
        // a trickle of bytes per connection. Counted over attempts, so a server that cuts every connection after
        // a few KiB still gets there, while one that sends a few bytes per connection runs out of retries.
        savedSinceReset += saved
        if savedSinceReset >= Int64(policy.minimumProgress) {
            failures = 0
            savedSinceReset = 0
        }
    }

    private mutating func transportFailed(
        _ error: TransportError, report: AttemptReport, now: Int64, jitter: Double
    ) -> AttemptAction {
        let host = Self.serverName(url)
        switch error.code {
        case .tls:
            return .fail(DownloadError(.tls, "TLS error: \(error.message)", cause: error, resumable: report.durable > 0))
        case .resolve:
            // A name that does not resolve now will not in a second either; a rerun later may.
            return .fail(DownloadError(
                .network, "cannot resolve host \(host): \(error.message)", cause: error,
                resumable: report.durable > 0))
        case .connect, .connectTimeout:
            connectFailures += 1
            let tries = max(1, policy.maxConnectTries)
            if connectFailures >= tries {
                let saved = report.durable > 0 ? "; \(report.durable) bytes saved" : ""
                return .fail(DownloadError(
                    .network, "cannot connect to \(host): \(error.message) (\(tries) tries)\(saved)", cause: error,
                    resumable: report.durable > 0, remedy: report.durable > 0 ? .rerun(.resume) : nil))
            }
            let delay = policy.connectRetryDelay * Double(1 << min(connectFailures - 1, 10))
            resetURL()
            return .wait(seconds: delay, attempt: connectFailures, of: tries - 1, reason: error.message)
        case .malformedResponse, .other, .abortedBySink:
            return .fail(DownloadError(
                .protocolViolation, "\(error.message) (from \(url.absoluteString))", cause: error,
                resumable: report.durable > 0))
        case .unsupported:
            return .fail(DownloadError(.invalidOption, error.message, cause: error, resumable: report.durable > 0))
        case .cancelled:
            return .interrupted
        case .yielded:
            // The transport let go of the connection to keep memory flat; the next request resumes from what was
            // written, under the same validators, and counts as no retry.
            return .requestAgain
        case .stalled, .partialBody, .network, .protocolError:
            return retry(.transport(error), report: report, now: now, jitter: jitter)
        }
    }

    private mutating func retry(_ cause: RetryCause, report: AttemptReport, now: Int64, jitter: Double) -> AttemptAction {
        failures += 1
        let reason = cause.reason
        if failures > policy.maxRetries {
            if case .status(let status, _) = cause {
                return .fail(DownloadError(
                    .httpStatus,
                    "HTTP \(status) \(statusText(status)) from \(url.absoluteString) after \(policy.maxRetries) retries"
                        .replacingOccurrences(of: "  ", with: " "),
                    httpStatus: status, resumable: report.durable > 0))
            }
            let whose = scope == .connection ? " on one connection" : ""
            let saved = report.durable > 0 ? "; \(report.durable) bytes saved" : ""
            return .fail(DownloadError(
                .retriesExhausted, "giving up after \(policy.maxRetries) retries\(whose): \(reason)\(saved)",
                resumable: report.durable > 0, remedy: report.durable > 0 ? .rerun(.resume) : nil))
        }
        var retryAfter: String?
        if case .status(_, let after) = cause { retryAfter = after }
        let delay = policy.delay(attempt: failures, retryAfter: retryAfter, now: now, jitter: jitter)
        resetURL()
        return .wait(seconds: delay, attempt: failures, of: policy.maxRetries, reason: reason)
    }

    /// `host:port` of a URL (the host alone without a port), for messages.
    static func serverName(_ url: URL) -> String {
        let host = url.host ?? url.absoluteString
        let shown = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        return url.port.map { "\(shown):\($0)" } ?? shown
    }
}

func statusText(_ status: Int) -> String {
    switch status {
    case 400: return "Bad Request"
    case 401: return "Unauthorized"
    case 403: return "Forbidden"
    case 404: return "Not Found"
    case 405: return "Method Not Allowed"
    case 407: return "Proxy Authentication Required"
    case 408: return "Request Timeout"
    case 410: return "Gone"
    case 416: return "Range Not Satisfiable"
    case 429: return "Too Many Requests"
    case 500: return "Internal Server Error"
    case 502: return "Bad Gateway"
    case 503: return "Service Unavailable"
    case 504: return "Gateway Timeout"
    default: return ""
    }
}
