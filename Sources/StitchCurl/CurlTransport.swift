#if Libcurl
import CCurl
import CStitchSystem
public import StitchTransport
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization
import StitchLocks

/// The libcurl transport: one multi handle driven by one event-loop thread.
///
/// Every transfer of the process shares the loop (`CurlTransport.shared`), so later connection pools,
/// segmented downloads and the daemon multiplex on one thread. Other threads only post commands to a
/// small locked queue and wake the loop with `curl_multi_wakeup`.
public final class CurlTransport: HTTPTransport {
    /// The process-wide transport.
    public static let shared = CurlTransport()

    let loop: CurlEventLoop
    private let receiveBufferSize: Int

    /// A transport with its own event-loop thread and connection cache.
    ///
    /// - Parameter receiveBufferSize: libcurl's receive buffer (`CURLOPT_BUFFERSIZE`), the most body bytes one
    ///   write callback hands over; 512 KiB measured best here (fewer callbacks and `pwrite`s per GiB).
    public init(receiveBufferSize: Int = CurlTransport.defaultReceiveBufferSize) {
        loop = CurlEventLoop()
        self.receiveBufferSize = receiveBufferSize
    }

    /// See ``init(receiveBufferSize:)``.
    public static let defaultReceiveBufferSize = 512 * 1024

    deinit {
        loop.submit(.shutdown(nil))
    }

    /// Stops the event-loop thread and frees the multi handle and its connections; returns once the thread has
    /// ended. Transfers in flight end as cancelled, and every later request fails at once. Calling it again
    /// returns at once. A transport that is released shuts down by itself (without waiting); ``shared`` lives as
    /// long as the process.
    public func shutdown() async {
        await withCheckedContinuation { continuation in
            loop.submit(.shutdown(continuation))
        }
    }

    public func start(_ request: TransportRequest) async -> Result<any TransportResponse, TransportError> {
        let transfer = CurlTransfer(request: request, receiveBufferSize: receiveBufferSize)
        let loop = self.loop
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                transfer.headContinuation = continuation
                loop.submit(.add(transfer))
            }
        } onCancel: {
            transfer.cancelRequested.store(true, ordering: .releasing)
            loop.submit(.cancel(transfer))
        }
        // Everything the loop thread did for this transfer happened before it released this lock. The
        // continuation orders it too, but when it is resumed before the task has suspended, the runtime's
        // uninstrumented atomics are all there is, and ThreadSanitizer (seen in a loaded `stitch` process)
        // reported the loop's writes as races with the caller's reads.
        transfer.completed.withLock { _ in }
        return result.map { head in CurlResponse(transfer: transfer, head: head, loop: loop) }
    }
}

/// A response of the libcurl transport whose head has arrived; the transfer stays paused until the engine
/// attaches a sink, discards the body or cancels.
final class CurlResponse: DecidedBodyResponse {
    let head: ResponseHead
    private let transfer: CurlTransfer
    private let loop: CurlEventLoop
    /// Whether the body was asked for (received or discarded).
    private let consumed = Atomic<Bool>(false)
    private let cancelled = Atomic<Bool>(false)

    init(transfer: CurlTransfer, head: ResponseHead, loop: CurlEventLoop) {
        self.transfer = transfer
        self.head = head
        self.loop = loop
    }

    deinit {
        if !consumed.load(ordering: .acquiring) && !cancelled.load(ordering: .acquiring) {
            loop.submit(.cancel(transfer))
        }
    }

    func receive(into sink: any BodySink) async -> Result<Void, TransportError> {
        // Chosen already: asked for from this thread, so never declined.
        await body(decidedOn: { $0() }, choosing: { .receiving(sink) }) ?? .failure(.abortedBySink)
    }

    func discard() async -> Result<Void, TransportError> {
        await body(decidedOn: { $0() }, choosing: { .discarding }) ?? .failure(.abortedBySink)
    }

    func cancel() {
        // Also while the body streams: `receive(into:)` then returns `.cancelled`; a body asked for afterwards
        // reaches the loop after the cancel, and ends as the transfer did.
        cancelled.store(true, ordering: .releasing)
        loop.submit(.cancel(transfer))
    }

    func body(
        decidedOn submit: (@escaping @Sendable () -> Void) -> Void, by choose: @escaping @Sendable () -> BodyChoice?
    ) async -> Result<Void, TransportError>? {
        await body(decidedOn: submit) {
            switch choose() {
            case .receive(let sink)?: .receiving(sink)
            case .discard?: .discarding
            case nil: nil
            }
        }
    }

    /// Runs `choose` through `submit` and, from there, asks the loop for the body as it chose; nil (the body not asked
    /// for) when it chose nothing.
    private func body(
        decidedOn submit: (@escaping @Sendable () -> Void) -> Void,
        choosing choose: @escaping @Sendable () -> CurlTransfer.Phase?
    ) async -> Result<Void, TransportError>? {
        guard !consumed.exchange(true, ordering: .acquiringAndReleasing) else {
            return .failure(TransportError(.other, "a response body can be read only once"))
        }
        let transfer = self.transfer
        let loop = self.loop
        // Set (under its lock, before the continuation is resumed) when `choose` chose nothing.
        let declined = Locked(false)
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<Void, TransportError>, Never>) in
                submit {
                    guard let phase = choose() else {
                        declined.withLock { $0 = true }
                        continuation.resume(returning: .failure(.abortedBySink))
                        return
                    }
                    loop.submit(.body(transfer, phase, continuation))
                }
            }
        } onCancel: {
            transfer.cancelRequested.store(true, ordering: .releasing)
            loop.submit(.cancel(transfer))
        }
        if declined.withLock({ $0 }) {
            consumed.store(false, ordering: .releasing)
            return nil
        }
        transfer.completed.withLock { _ in }  // see CurlTransport.start
        return result
    }
}

/// The state of one easy handle. After `submit(.add)` it is touched only on the loop thread; each continuation
/// is resumed exactly once, there.
final class CurlTransfer: @unchecked Sendable {
    /// Where the response is, as far as the engine is concerned.
    enum Phase {
        /// Before the final head.
        case awaitingHead
        /// The head went to the engine; body bytes are held (the transfer is paused) until it decides.
        case awaitingDecision
        /// Body bytes go to the sink.
        case receiving(any BodySink)
        /// Body bytes are read and dropped, up to `maximumDiscardedBytes`.
        case discarding
    }

    let request: TransportRequest
    let receiveBufferSize: Int
    /// Resumed with the head (or the failure before it).
    var headContinuation: CheckedContinuation<Result<ResponseHead, TransportError>, Never>?
    /// Resumed when the body phase the engine chose has ended.
    var bodyContinuation: CheckedContinuation<Result<Void, TransportError>, Never>?
    /// The outcome of a transfer that ended while the engine was still deciding (an empty or short body, a
    /// failure, a cancel), handed over when it decides.
    var pendingOutcome: Result<Void, TransportError>?
    var phase = Phase.awaitingHead
    /// Set when the write callback paused the transfer because the engine had not decided yet.
    var pausedForDecision = false
    let cancelRequested = Atomic<Bool>(false)
    /// Taken by the loop thread while it resumes a continuation (see `CurlTransport.start`).
    let completed = Locked<Bool>(false)

    var easy: UnsafeMutableRawPointer?
    var headerList: UnsafeMutablePointer<curl_slist>?
    let errorBuffer = UnsafeMutablePointer<CChar>.allocate(capacity: Int(CURL_ERROR_SIZE) + 1)

    // Response parsing state.
    var status = 0
    var headers = HTTPHeaders()
    var headDelivered = false
    /// Set when the sink stopped the transfer: it is never called again.
    var sinkAborted = false
    /// Bytes of response head so far (status lines included, interim 1xx heads too), and whether it outgrew the
    /// limit.
    var headBytes = 0
    var headTooLarge = false
    /// The largest response head accepted: far beyond any real server's, below libcurl's own 300 KB.
    static let maximumHeadBytes = 256 << 10

    // Stall detection: seconds (monotonic) of the last sign of progress — the request sent, a whole head,
    // `activityThreshold` bytes, the end of a pause we asked for. libcurl's low-speed limit averages over several
    // seconds, so a stall after fast data was seen late.
    var lastActivity = 0.0
    /// Bytes received since `lastActivity`; reaching `activityThreshold` moves `lastActivity` to now.
    var bytesSinceActivity = 0
    /// `stallMinimumBytes`, or the body's length once a head announces a smaller one.
    lazy var activityThreshold = max(1, request.options.stallMinimumBytes)
    /// Body bytes thrown away (redirect and error bodies); more than `maximumDiscardedBytes` ends the transfer.
    var discardedBytes = 0
    var discardCapped = false
    /// The body of a response the engine does not want is read (so the connection can be reused) up to this much.
    static let maximumDiscardedBytes = 64 << 10
    var requestSent = false
    var stalled = false
    /// While paused by the sink: when (monotonic seconds) to read again.
    var resumeAt: Double?

    init(request: TransportRequest, receiveBufferSize: Int = CurlTransport.defaultReceiveBufferSize) {
        self.request = request
        self.receiveBufferSize = receiveBufferSize
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
    }

    deinit {
        if let easy { curl_easy_cleanup(easy) }
        if let headerList { curl_slist_free_all(headerList) }
        errorBuffer.deallocate()
    }

    /// Creates and configures the easy handle. Returns an error for options libcurl refuses.
    func configure() -> TransportError? {
        guard let easy = curl_easy_init() else { return TransportError(.other, "curl_easy_init failed") }
        self.easy = easy
        let options = request.options
        var failed: CURLcode = CURLE_OK
        func set(_ code: CURLcode) { if code != CURLE_OK && failed == CURLE_OK { failed = code } }

        let me = Unmanaged.passUnretained(self).toOpaque()
        set(stitch_easy_setopt_string(easy, CURLOPT_URL, request.url))
        set(stitch_easy_setopt_string(easy, CURLOPT_PROTOCOLS_STR, "http,https"))
        set(stitch_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1))
        set(stitch_easy_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0))  // the engine follows, checking loops
        set(stitch_easy_setopt_long(easy, CURLOPT_BUFFERSIZE, receiveBufferSize))
        set(stitch_easy_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, Int(options.connectTimeout * 1000)))
        // A stall: no byte for `stallTimeout` seconds once the request is out, checked by the progress callback
        // (libcurl calls it at least once a second, also while idle).
        set(stitch_easy_setopt_long(easy, CURLOPT_NOPROGRESS, 0))
        set(stitch_easy_setopt_pointer(easy, CURLOPT_XFERINFODATA, me))
        set(stitch_easy_setopt_xferinfo_callback(easy, curlProgressCallback))
        set(stitch_easy_setopt_long(easy, CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_2TLS)))
        set(stitch_easy_setopt_long(easy, CURLOPT_TCP_KEEPALIVE, 1))
        if request.lane != nil {
            // A lane of a segmented download: an HTTP/2 connection would otherwise carry every lane as a stream
            // of one TCP connection.
            set(stitch_easy_setopt_long(easy, CURLOPT_PIPEWAIT, 0))
            if request.url.lowercased().hasPrefix("https:") {
                set(stitch_easy_setopt_long(easy, CURLOPT_FRESH_CONNECT, 1))
            }
        }
        set(stitch_easy_setopt_long(easy, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1))
        set(stitch_easy_setopt_string(easy, CURLOPT_USERAGENT, options.userAgent))
        set(stitch_easy_setopt_pointer(easy, CURLOPT_ERRORBUFFER, errorBuffer))
        switch options.tlsVerification {
        case .verify:
            set(stitch_easy_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 1))
            set(stitch_easy_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 2))
        case .insecure:
            set(stitch_easy_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 0))
            set(stitch_easy_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 0))
        }
        if let ca = options.caCertificatePath {
            // Instead of the system store, not beside it: Debian's libcurl also has a built-in CA path.
            set(stitch_easy_setopt_string(easy, CURLOPT_CAINFO, ca))
            set(stitch_easy_setopt_string(easy, CURLOPT_CAPATH, nil))
        }
        if let proxy = options.proxy {
            // Set, even empty, it replaces the environment's proxy: the option wins, and "" means none.
            set(stitch_easy_setopt_string(easy, CURLOPT_PROXY, proxy.url))
            if let user = proxy.user {
                set(stitch_easy_setopt_string(easy, CURLOPT_PROXYUSERNAME, user))
                set(stitch_easy_setopt_string(easy, CURLOPT_PROXYPASSWORD, proxy.password ?? ""))
            }
            if proxy.url.hasPrefix("https:") {
                // TLS to the proxy is always checked, against the system's trust store or `--proxy-ca-cert`'s:
                // `-k` and `--ca-cert` are for servers, and the proxy's password travels inside this TLS.
                set(stitch_easy_setopt_long(easy, CURLOPT_PROXY_SSL_VERIFYPEER, 1))
                set(stitch_easy_setopt_long(easy, CURLOPT_PROXY_SSL_VERIFYHOST, 2))
            }
        }
        if let proxyCA = options.proxyCACertificatePath {
            // The proxy's own trust, whichever proxy is used (the option's or the environment's); the
            // servers' stays as set above.
            set(stitch_easy_setopt_string(easy, CURLOPT_PROXY_CAINFO, proxyCA))
            set(stitch_easy_setopt_string(easy, CURLOPT_PROXY_CAPATH, nil))
        }
        if let noProxy = options.noProxy { set(stitch_easy_setopt_string(easy, CURLOPT_NOPROXY, noProxy)) }
        if let credentials = options.credentials,
            let origin = TransportOptions.Credentials.origin(of: request.url), credentials.origins.contains(origin)
        {
            set(stitch_easy_setopt_string(easy, CURLOPT_USERNAME, credentials.user))
            set(stitch_easy_setopt_string(easy, CURLOPT_PASSWORD, credentials.password))
            set(stitch_easy_setopt_long(easy, CURLOPT_HTTPAUTH, 1))  // CURLAUTH_BASIC, as curl -u
        } else if let netrc = options.netrc {
            set(stitch_easy_setopt_long(easy, CURLOPT_NETRC, Int(CURL_NETRC_OPTIONAL.rawValue)))
            if let file = netrc.file { set(stitch_easy_setopt_string(easy, CURLOPT_NETRC_FILE, file)) }
        }
        for field in request.headers {
            headerList = curl_slist_append(headerList, "\(field.name): \(field.value)")
        }
        set(stitch_easy_setopt_slist(easy, CURLOPT_HTTPHEADER, headerList))
        set(stitch_easy_setopt_pointer(easy, CURLOPT_PRIVATE, me))
        set(stitch_easy_setopt_pointer(easy, CURLOPT_HEADERDATA, me))
        set(stitch_easy_setopt_data_callback(easy, CURLOPT_HEADERFUNCTION, curlHeaderCallback))
        set(stitch_easy_setopt_pointer(easy, CURLOPT_WRITEDATA, me))
        set(stitch_easy_setopt_data_callback(easy, CURLOPT_WRITEFUNCTION, curlWriteCallback))
        if failed != CURLE_OK {
            return TransportError(.other, "libcurl refused an option: \(String(cString: curl_easy_strerror(failed)))",
                underlyingCode: Int(failed.rawValue))
        }
        return nil
    }

    /// Called by libcurl's progress callback. Returns false when the transfer has stalled.
    func checkStall() -> Bool {
        let now = request.clock.uptime()
        if !requestSent {
            var pretransfer: curl_off_t = 0
            _ = stitch_easy_getinfo_off(easy, CURLINFO_PRETRANSFER_TIME_T, &pretransfer)
            markActive()  // connecting is bounded by the connect timeout, not this one
            requestSent = pretransfer > 0
            return true
        }
        if resumeAt != nil { return true }  // a pause we asked for is not a stall
        if case .awaitingDecision = phase { return true }  // nor is the engine deciding (it may hash a file)
        if now - lastActivity > request.options.stallTimeout {
            stalled = true
            return false
        }
        return true
    }

    /// Counts `count` bytes received: once `activityThreshold` have come since the last mark, the transfer is
    /// active now. A drip of a few bytes never gets there, so it stalls like silence does.
    @inline(__always)
    func noteReceived(_ count: Int) {
        bytesSinceActivity += count
        if bytesSinceActivity >= activityThreshold { markActive() }
    }

    /// The transfer is making progress now.
    func markActive() {
        lastActivity = request.clock.uptime()
        bytesSinceActivity = 0
    }

    /// One header line (with its CRLF). Returns false to abort.
    func receiveHeaderLine(_ raw: UnsafeRawBufferPointer) -> Bool {
        noteReceived(raw.count)
        // Trailer fields after a body are not a new head: ignore them.
        if headDelivered { return true }
        headBytes += raw.count
        if headBytes > Self.maximumHeadBytes {
            // Refused here, not left to libcurl (whose limit and error code vary by version: 300 KB and a
            // retryable receive error in 7.88): a server sending this much head will send it again.
            headTooLarge = true
            return false
        }
        var length = raw.count
        while length > 0, raw[length - 1] == 0x0A || raw[length - 1] == 0x0D { length -= 1 }
        let line = Substring(String(decoding: UnsafeRawBufferPointer(rebasing: raw[0..<length]), as: UTF8.self))
        if line.hasPrefix("HTTP/") {
            let parts = line.split(separator: " ", maxSplits: 2)
            status = parts.count > 1 ? Int(parts[1]) ?? 0 : 0
            headers = HTTPHeaders()
            headDelivered = false
            // `headBytes` keeps counting: interim 1xx heads share the limit with the final one (one transfer, one
            // final response: redirects are new transfers), or endless 1xx heads would evade it.
            return status != 0
        }
        if line.isEmpty {
            if (100..<200).contains(status) { return true }  // interim response; a final one follows
            headDelivered = true
            // A whole head is progress however small; a body shorter than the stall minimum need only arrive whole.
            markActive()
            if let length = headers["Content-Length"].flatMap({ Int($0) }), length >= 0 {
                activityThreshold = max(1, min(activityThreshold, length))
            }
            // The engine decides on its own executor; body bytes wait (see `receiveBody`).
            phase = .awaitingDecision
            Trace.note("\(request.url) loop head \(status)")
            resumeHead(.success(ResponseHead(status: status, headers: headers)))
            return true
        }
        if line.first == " " || line.first == "\t" {
            return true  // obsolete line folding: ignored, as RFC 9112 allows a client to
        }
        guard let colon = line.firstIndex(of: ":") else { return true }
        let name = line[..<colon].trimmingWhitespace()
        let value = line[line.index(after: colon)...].trimmingWhitespace()
        headers.add(name: String(name), value: String(value))
        return true
    }

    /// Body bytes: what libcurl's write callback returns (all taken, pause, or abort).
    func receiveBody(_ raw: UnsafeRawBufferPointer) -> Int {
        noteReceived(raw.count)
        switch phase {
        case .awaitingHead:
            return raw.count  // an interim response's body (none in practice)
        case .awaitingDecision:
            // libcurl keeps these bytes and offers them again when the engine attaches a sink.
            pausedForDecision = true
            return Int(CURL_WRITEFUNC_PAUSE)
        case .discarding:
            discardedBytes += raw.count
            if discardedBytes > Self.maximumDiscardedBytes {
                // An endless (or huge) error or redirect body: the head already said all the engine needs.
                discardCapped = true
                return 0
            }
            return raw.count
        case .receiving(let sink):
            // Once the sink has said stop it is never asked again, whatever libcurl does next (see `resume`).
            if sinkAborted || !headDelivered { return 0 }
            switch sink.receive(raw) {
            case .accepted:
                return raw.count
            case .wait(let duration):
                let (seconds, attoseconds) = duration.components
                resumeAt = request.clock.uptime() + max(0.001, Double(seconds) + Double(attoseconds) * 1e-18)
                return Int(CURL_WRITEFUNC_PAUSE)
            case .abort:
                sinkAborted = true
                return 0
            }
        }
    }

    private func resumeHead(_ result: Result<ResponseHead, TransportError>) {
        guard let continuation = headContinuation else { return }
        headContinuation = nil
        completed.withLock { $0 = true }
        continuation.resume(returning: result)
    }

    /// The transfer has ended (it is no longer in the multi handle): whoever waits learns how.
    func complete(_ result: Result<Void, TransportError>) {
        if headContinuation != nil {
            let error: TransportError
            switch result {
            case .failure(let failure): error = failure
            case .success: error = .protocolError("the server sent no complete response")
            }
            resumeHead(.failure(error))
        } else if let continuation = bodyContinuation {
            bodyContinuation = nil
            completed.withLock { $0 = true }
            continuation.resume(returning: result)
        } else {
            pendingOutcome = result
        }
    }

    /// Maps libcurl's result to ours.
    func outcome(for code: CURLcode) -> Result<Void, TransportError> {
        if code == CURLE_OK {
            if !headDelivered { return .failure(.protocolError("the server sent no complete response")) }
            return .success(())
        }
        if sinkAborted { return .failure(.abortedBySink) }
        if discardCapped && headDelivered { return .success(()) }
        if headTooLarge {
            return .failure(
                TransportError(.malformedResponse, "the response headers exceed \(Self.maximumHeadBytes >> 10) KiB"))
        }
        if stalled {
            let seconds = String(format: "%g", request.options.stallTimeout)
            let what = bytesSinceActivity == 0 ? "no data" : "only \(bytesSinceActivity) bytes"
            return .failure(.stalled("\(what) in \(seconds) s (stalled transfer)"))
        }
        let detail = String(cString: errorBuffer)
        var message = detail.isEmpty ? String(cString: curl_easy_strerror(code)) : detail
        var kind: TransportError.Code
        switch code {
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY: kind = .resolve
        case CURLE_COULDNT_CONNECT:
            kind = .connect
            // libcurl's words ("Failed to connect to H port P after 0 ms: Couldn't connect to server") say less
            // than the system's ("Connection refused").
            var osErrno = 0
            if stitch_easy_getinfo_long(easy, CURLINFO_OS_ERRNO, &osErrno) == CURLE_OK, osErrno != 0 {
                message = String(cString: strerror(Int32(osErrno))).lowercased()
            }
        case CURLE_OPERATION_TIMEDOUT: kind = headDelivered ? .stalled : .connectTimeout
        case CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CONNECT_ERROR, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER,
            CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ENGINE_NOTFOUND, CURLE_SSL_ENGINE_SETFAILED,
            CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS,
            CURLE_SSL_CRL_BADFILE, CURLE_USE_SSL_FAILED:
            kind = .tls
        case CURLE_PARTIAL_FILE: kind = .partialBody
        case CURLE_RECV_ERROR, CURLE_SEND_ERROR, CURLE_GOT_NOTHING, CURLE_HTTP2, CURLE_HTTP2_STREAM,
            CURLE_HTTP3, CURLE_QUIC_CONNECT_ERROR:
            kind = .network
        case CURLE_WEIRD_SERVER_REPLY, CURLE_BAD_CONTENT_ENCODING:
            kind = .malformedResponse
            message = "the server's response is malformed: \(message)"
        case CURLE_OUT_OF_MEMORY where !headDelivered:
            // libcurl 7.88 rejects a header line over 100 KB with this code ("Rejected … bytes header").
            kind = .malformedResponse
            if detail.isEmpty { message = "the server sent a response header libcurl refuses (too long)" }
        case CURLE_ABORTED_BY_CALLBACK: kind = .cancelled
        default: kind = .other
        }
        if let proxy = request.options.proxy, !proxy.url.isEmpty, !headDelivered {
            (kind, message) = proxyFailure(code, kind: kind, message: message, proxy: proxy.url)
        }
        if kind == .tls, !headDelivered, tlsToProxyFailed {
            // The TLS that failed is the one to the proxy (an https:// proxy), not to the server.
            let proxy = request.options.proxy.map(\.url).flatMap { $0.isEmpty ? nil : $0 } ?? "(the environment's)"
            let what =
                code == CURLE_PEER_FAILED_VERIFICATION
                ? "the proxy's own certificate, not the server's" : "TLS to the proxy, not to the server"
            message = "proxy \(proxy): \(message) (\(what))"
        } else if kind == .tls, let server = URLComponents(string: request.url).flatMap(Self.serverName) {
            // After redirects the failing server is not the one the user named.
            message += " (server \(server))"
        }
        return .failure(TransportError(kind, message, underlyingCode: Int(code.rawValue)))
    }

    /// Whether a TLS failure was in the TLS to an `https://` proxy rather than to the server: the option's proxy is
    /// one, no no-proxy list is in force, and no tunnel was made through it yet (or the URL is http://, which has no
    /// TLS of its own); or libcurl kept a failed verification for the proxy (apart from the server's: also for the
    /// environment's proxy).
    private var tlsToProxyFailed: Bool {
        guard let easy else { return false }
        // Only where the proxy was surely used: a no-proxy list could have sent the request direct.
        let noProxyList = request.options.noProxy != nil || getenv("no_proxy") != nil || getenv("NO_PROXY") != nil
        if let proxy = request.options.proxy, proxy.url.hasPrefix("https:"), !noProxyList {
            var connectCode = 0
            _ = stitch_easy_getinfo_long(easy, CURLINFO_HTTP_CONNECTCODE, &connectCode)
            if connectCode == 0 || request.url.lowercased().hasPrefix("http:") { return true }
        }
        var result = 0
        return stitch_easy_getinfo_long(easy, CURLINFO_PROXY_SSL_VERIFYRESULT, &result) == CURLE_OK && result != 0
    }

    /// A failure before any response through `proxy` (the option's, not the environment's), said as the proxy's:
    /// one that cannot be reached or resolved, a tunnel it refuses (`CONNECT` answered with an error: 407 wants
    /// credentials and is not retried, nor 403; a 5xx is the proxy failing to reach the server, retried as a
    /// connection), a SOCKS handshake it fails (credentials refused: not retried; the server unreachable from it:
    /// retried as a connection).
    private func proxyFailure(
        _ code: CURLcode, kind: TransportError.Code, message: String, proxy: String
    ) -> (TransportError.Code, String) {
        guard let easy else { return (kind, message) }
        var connectCode = 0
        if stitch_easy_getinfo_long(easy, CURLINFO_HTTP_CONNECTCODE, &connectCode) == CURLE_OK, connectCode >= 300 {
            let words = connectCode == 407 ? "Proxy Authentication Required" : connectCode == 403 ? "Forbidden" : ""
            let said = "the proxy \(proxy) refused the tunnel: HTTP \(connectCode)" + (words.isEmpty ? "" : " \(words)")
            if connectCode == 407 { return (.other, said + "; it asks for credentials") }
            return ((500...599).contains(connectCode) ? .connect : .other, said)
        }
        switch code {
        case CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_PROXY, CURLE_OPERATION_TIMEDOUT:
            return (kind, "proxy \(proxy): \(message)")
        case CURLE_PROXY:
            var detail = 0
            _ = stitch_easy_getinfo_long(easy, CURLINFO_PROXY_ERROR, &detail)
            let refusedCredentials = [CURLPX_USER_REJECTED, CURLPX_NO_AUTH, CURLPX_RECV_AUTH, CURLPX_SEND_AUTH]
                .contains { Int($0.rawValue) == detail }
            if refusedCredentials { return (.other, "the proxy \(proxy) refused the credentials: \(message)") }
            return (.connect, "proxy \(proxy): \(message)")
        default:
            return (kind, message)
        }
    }

    /// `host:port` (or the host alone) of a URL, for error messages.
    static func serverName(_ components: URLComponents) -> String? {
        guard let host = components.host, !host.isEmpty else { return nil }
        let shown = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        return components.port.map { "\(shown):\($0)" } ?? shown
    }
}

extension Substring {
    func trimmingWhitespace() -> Substring {
        var s = self
        while let f = s.first, f == " " || f == "\t" { s.removeFirst() }
        while let l = s.last, l == " " || l == "\t" { s.removeLast() }
        return s
    }
}

private let curlHeaderCallback: stitch_curl_data_callback = { pointer, size, count, userdata in
    let length = size * count
    guard let pointer, let userdata else { return 0 }
    let transfer = Unmanaged<CurlTransfer>.fromOpaque(userdata).takeUnretainedValue()
    return transfer.receiveHeaderLine(UnsafeRawBufferPointer(start: pointer, count: length)) ? length : 0
}

private let curlProgressCallback: stitch_curl_xferinfo_callback = { userdata, _, _, _, _ in
    guard let userdata else { return 0 }
    let transfer = Unmanaged<CurlTransfer>.fromOpaque(userdata).takeUnretainedValue()
    return transfer.checkStall() ? 0 : 1
}

private let curlWriteCallback: stitch_curl_data_callback = { pointer, size, count, userdata in
    let length = size * count
    guard let userdata else { return 0 }
    guard let pointer, length > 0 else { return length }
    let transfer = Unmanaged<CurlTransfer>.fromOpaque(userdata).takeUnretainedValue()
    return transfer.receiveBody(UnsafeRawBufferPointer(start: pointer, count: length))
}

/// Owns the multi handle and the thread that drives it.
final class CurlEventLoop: @unchecked Sendable {
    enum Command {
        case add(CurlTransfer)
        /// The engine's decision on a response whose head it has: read the body into a sink, or discard it.
        case body(CurlTransfer, CurlTransfer.Phase, CheckedContinuation<Result<Void, TransportError>, Never>)
        case cancel(CurlTransfer)
        /// End the loop (resumed once it has); nil from a deinit, which does not wait.
        case shutdown(CheckedContinuation<Void, Never>?)
    }

    private struct Queue {
        var commands: [Command] = []
        /// Set by the loop as it ends: commands are then answered by `submit` itself, and the multi handle (being
        /// cleaned up) is never woken again.
        var stopped = false
        /// Set once the multi handle is cleaned up; until then a late `shutdown()` waits here for it.
        var finished = false
        var lateWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let multi: UnsafeMutableRawPointer
    private let queue = Locked(Queue())
    /// The loop thread's kernel id, once it runs (tests look for it in /proc/self/task).
    let threadID = Atomic<Int32>(0)
    /// Loop thread only.
    private var active: [UnsafeMutableRawPointer: CurlTransfer] = [:]

    init() {
        curlGlobalInit
        guard let multi = curl_multi_init() else { fatalError("curl_multi_init failed") }
        self.multi = multi
        let thread = Thread { [self] in self.run() }
        thread.name = "stitch.curl"
        thread.start()
    }

    func submit(_ command: Command) {
        let stopped = queue.withLock { queue in
            guard !queue.stopped else {
                // A shutdown asked for while the loop ends returns once it has ended, as the first one does.
                if case .shutdown(let continuation?) = command, !queue.finished {
                    queue.lateWaiters.append(continuation)
                    return false
                }
                return true
            }
            queue.commands.append(command)
            // Under the lock, so that it never follows the loop's `curl_multi_cleanup`.
            curl_multi_wakeup(multi)
            return false
        }
        if stopped { Self.refuse(command) }
    }

    /// Answers a command the loop will never see (it has ended; nothing else touches the transfer any more).
    private static func refuse(_ command: Command) {
        switch command {
        case .add(let transfer):
            transfer.complete(.failure(Self.shutDown))
        case .body(let transfer, _, let continuation):
            transfer.bodyContinuation = continuation
            // What happened to it while the engine decided, if it ended then (an empty body, a failure).
            transfer.complete(transfer.pendingOutcome ?? .failure(Self.shutDown))
        case .cancel:
            break
        case .shutdown(let continuation):
            continuation?.resume()
        }
    }

    static let shutDown = TransportError(.cancelled, "the transport was shut down")

    private func run() {
        #if os(Linux)
        threadID.store(stitch_thread_id(), ordering: .releasing)
        #endif
        var waiters: [CheckedContinuation<Void, Never>] = []
        var stopping = false
        while !stopping {
            let batch = queue.withLock { queue -> [Command] in
                defer { queue.commands.removeAll(keepingCapacity: true) }
                return queue.commands
            }
            for command in batch {
                if case .shutdown(let continuation) = command {
                    stopping = true
                    if let continuation { waiters.append(continuation) }
                } else {
                    handle(command)
                }
            }
            if stopping { break }
            var running: Int32 = 0
            curl_multi_perform(multi, &running)
            var left: Int32 = 0
            while let message = curl_multi_info_read(multi, &left) {
                guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
                let code = stitch_msg_result(message)
                finish(easy, outcome: nil, code: code)
            }
            // Paused transfers whose time has come read again; the poll sleeps no longer than the next one.
            var timeout = 1000.0
            var resumable: [(UnsafeMutableRawPointer, CurlTransfer)] = []
            for transfer in active.values {
                guard let resumeAt = transfer.resumeAt, let easy = transfer.easy else { continue }
                let now = transfer.request.clock.uptime()
                if resumeAt <= now {
                    resumable.append((easy, transfer))
                } else {
                    timeout = min(timeout, (resumeAt - now) * 1000)
                }
            }
            for (easy, transfer) in resumable {
                timeout = 0
                resume(easy, transfer)
            }
            var ready: Int32 = 0
            curl_multi_poll(multi, nil, 0, Int32(max(0, timeout.rounded(.up))), &ready)
        }
        // Shutting down: what is running ends as cancelled; what comes later is refused by `submit`.
        for (easy, _) in active { finish(easy, outcome: .failure(Self.shutDown), code: CURLE_OK) }
        let late = queue.withLock { queue -> [Command] in
            queue.stopped = true
            defer { queue.commands.removeAll() }
            return queue.commands
        }
        for command in late {
            if case .shutdown(let continuation) = command {
                if let continuation { waiters.append(continuation) }
            } else {
                Self.refuse(command)
            }
        }
        curl_multi_cleanup(multi)
        let lateWaiters = queue.withLock { queue in
            queue.finished = true
            defer { queue.lateWaiters.removeAll() }
            return queue.lateWaiters
        }
        for waiter in waiters + lateWaiters { waiter.resume() }
    }

    /// Ends a pause (the sink's, or the one while the engine decided). libcurl hands back the bytes it held from
    /// inside `curl_easy_pause`; if the sink refuses them (aborts), libcurl frees the rest of what it held, returns
    /// the error from here and would go on reading the socket as if nothing happened: the bytes after a hole would
    /// reach the sink as if they followed. Any error here ends the transfer (issue 10: a shifted file saved with exit 0).
    private func resume(_ easy: UnsafeMutableRawPointer, _ transfer: CurlTransfer) {
        transfer.resumeAt = nil
        transfer.markActive()
        let code = curl_easy_pause(easy, CURLPAUSE_CONT)
        if code != CURLE_OK || transfer.sinkAborted {
            finish(easy, outcome: transfer.outcome(for: code == CURLE_OK ? CURLE_WRITE_ERROR : code), code: code)
        }
    }

    private func handle(_ command: Command) {
        switch command {
        case .add(let transfer):
            Trace.note("\(transfer.request.url) loop add")
            if transfer.cancelRequested.load(ordering: .acquiring) {
                transfer.complete(.failure(.cancelled))
                return
            }
            if let error = transfer.configure() {
                transfer.complete(.failure(error))
                return
            }
            guard let easy = transfer.easy else { return }
            active[easy] = transfer
            let code = curl_multi_add_handle(multi, easy)
            if code != CURLM_OK {
                active[easy] = nil
                transfer.complete(.failure(TransportError(.other, "curl_multi_add_handle failed")))
            }
        case .body(let transfer, let phase, let continuation):
            Trace.note("\(transfer.request.url) loop body \(phase), in the multi handle: \(isActive(transfer))")
            transfer.bodyContinuation = continuation
            guard let easy = transfer.easy, active[easy] != nil else {
                // It ended while the engine decided: an empty body, a failure or a cancel.
                transfer.complete(transfer.pendingOutcome ?? .failure(.cancelled))
                return
            }
            transfer.phase = phase
            // However long the decision took, the stall clock starts now.
            transfer.markActive()
            if transfer.pausedForDecision {
                transfer.pausedForDecision = false
                resume(easy, transfer)
            }
        case .cancel(let transfer):
            Trace.note("\(transfer.request.url) loop cancel, in the multi handle: \(isActive(transfer))")
            guard let easy = transfer.easy, active[easy] != nil else { return }
            finish(easy, outcome: .failure(.cancelled), code: CURLE_OK)
        case .shutdown:
            break  // taken by `run`
        }
    }

    private func isActive(_ transfer: CurlTransfer) -> Bool {
        transfer.easy.map { active[$0] != nil } ?? false
    }

    private func finish(_ easy: UnsafeMutableRawPointer, outcome: Result<Void, TransportError>?, code: CURLcode) {
        guard let transfer = active.removeValue(forKey: easy) else { return }
        Trace.note("\(transfer.request.url) loop finish code \(code.rawValue) outcome \(String(describing: outcome))")
        curl_multi_remove_handle(multi, easy)
        transfer.complete(outcome ?? transfer.outcome(for: code))
    }
}

/// `curl_global_init` must run once before any other libcurl call, before threads use libcurl.
private let curlGlobalInit: Void = {
    curl_global_init(Int(CURL_GLOBAL_ALL))
}()
#endif  // Libcurl
