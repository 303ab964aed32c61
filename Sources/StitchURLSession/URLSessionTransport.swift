import Dispatch
import Foundation
import Synchronization
public import StitchTransport

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A transport over `URLSession` data tasks: Foundation's HTTP client (FoundationNetworking on Linux), for builds
/// and platforms without the libcurl backend.
///
/// Each request runs as data tasks in a session of its own, whose delegate callbacks arrive on one serial queue,
/// shared by every transfer of the process, that also holds all of the transfers' state.
///
/// A data task cannot be paused: in swift-corelibs-foundation `suspend()` takes the transfer off libcurl's multi
/// handle, which ends it, and `resume()` sends the request again from its start (Apple documents the same for data
/// tasks: "all other tasks must start over when resumed"). Nor can it be stopped promptly: `cancel()` waits behind
/// the reading on the session's queue (measured: 150 MB more arrived after a cancel at 1.6 MB; docs/urlsession.md).
/// So this backend never suspends a task, and instead:
/// - **Windows.** A request whose rest can be proven to be of one version of the file is asked for at most
///   `window` bytes at a time, and the rest window by window with `If-Range` under the first answer's strong
///   validator, on the same session (so over the same connection); each later answer must be exactly the next
///   bytes of the same version, or the body ends as a failure (`RangeWindow` has the rules). The engine sees the
///   one response it asked for. So no response brings more than a window, whatever the server and the sink do: this
///   is what keeps memory flat. A server that ignores ranges, or a file without a strong validator, is asked as the
///   engine asked, and the next two points bound it instead.
/// - **Head before body.** The bytes that arrive while the engine decides what the head means are held, and given
///   to the sink (or dropped) once it has. (On Apple platforms the response callback's completion handler also
///   holds the body back; FoundationNetworking ignores it.)
/// - **Back-pressure.** Bytes a sink refuses (`.wait`, a rate limit) or cannot take fast enough (a slow disk) are
///   held in memory: within a window, up to the window (and the next window is asked for once at most half of one
///   is held). Without windows, up to `yieldLimit`; beyond it the transfer is let go of and the body ends with
///   `TransportError` `yielded`: the engine asks for the rest with a validated range request, as after any
///   interruption, and counts it as no retry. It does so only when the sink says the rest can be asked for
///   (``BodySink/canRequestRest``); otherwise the body is held up to `holdLimit` and then the transfer fails with
///   a message saying why.
/// - **Redirects** are never followed here (the engine follows them under its own rules): the 3xx response is the
///   response.
/// - **Stalls** (fewer than `stallMinimumBytes` in `stallTimeout`) are timed here, as the libcurl backend does.
///
/// What it cannot do (a request asking for it fails at once with a message saying so, rather than being sent
/// differently from what was asked): turn certificate verification off, use another CA bundle than the system's,
/// or read a netrc file. It keeps no connections between requests (one session per request), and it cannot bound
/// the body of a redirect it does not follow (the session reads it whole before the engine sees the 3xx). TLS
/// failures are recognised from the session's message, as FoundationNetworking on Linux reports them with no code
/// of their own. A server's log shows the windows: `Range: bytes=0-8388607` where the engine asked for the whole
/// file.
public final class URLSessionTransport: HTTPTransport {
    /// The process-wide instance.
    public static let shared = URLSessionTransport()

    /// The most bytes one request asks for (see the type's notes), or nil to send every request as the engine made
    /// it.
    public let window: Int?
    /// Body bytes held for a sink that the rest can be asked for again, before the transfer is let go of.
    public let yieldLimit: Int
    /// Body bytes held for any other sink (or while the engine decides on the head) before the transfer fails.
    public let holdLimit: Int

    /// A transport that asks for at most `window` bytes per request where the rest can be proven to be of the same
    /// file, and otherwise holds at most `yieldLimit` body bytes in memory for a sink that is slower than the
    /// server, or `holdLimit` for one whose rest cannot be asked for again (see the type's notes). A window larger
    /// than `holdLimit` is cut to it.
    public init(window: Int? = 8 << 20, yieldLimit: Int = 4 << 20, holdLimit: Int = 64 << 20) {
        let holdLimit = max(max(1, yieldLimit), holdLimit)
        self.yieldLimit = max(1, yieldLimit)
        self.holdLimit = holdLimit
        self.window = window.map { max(1, min($0, holdLimit)) }
        self.onLetGo = nil
        self.onWindowEnd = nil
    }

    /// For tests: called (on the transfer's queue) each time a transfer lets go of its connection.
    let onLetGo: (@Sendable () -> Void)?
    /// For tests: called (on the transfer's queue) when a window's task has brought all its bytes and more are to
    /// be asked for, with the bytes then held for the sink; the next window is asked for (or not) right after.
    let onWindowEnd: (@Sendable (_ heldBytes: Int) -> Void)?

    init(
        window: Int? = nil, yieldLimit: Int, holdLimit: Int, onLetGo: (@Sendable () -> Void)? = nil,
        onWindowEnd: (@Sendable (_ heldBytes: Int) -> Void)? = nil
    ) {
        let holdLimit = max(max(1, yieldLimit), holdLimit)
        self.yieldLimit = max(1, yieldLimit)
        self.holdLimit = holdLimit
        self.window = window.map { max(1, min($0, holdLimit)) }
        self.onLetGo = onLetGo
        self.onWindowEnd = onWindowEnd
    }

    public func start(_ request: TransportRequest) async -> Result<any TransportResponse, TransportError> {
        if let refusal = Self.refusal(of: request.options) { return .failure(refusal) }
        guard let url = URL(string: request.url), let scheme = url.scheme?.lowercased(),
            scheme == "http" || scheme == "https", url.host != nil
        else {
            return .failure(TransportError(.other, "not an http or https URL: \(request.url)"))
        }
        let transfer = URLSessionTransfer(
            request: request, url: url, windowSize: window, yieldLimit: yieldLimit, holdLimit: holdLimit,
            onLetGo: onLetGo, onWindowEnd: onWindowEnd)
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                transfer.begin(continuation)
            }
        } onCancel: {
            transfer.cancel()
        }
        return result.map { head in URLSessionResponse(transfer: transfer, head: head) }
    }

    /// Why this backend cannot perform a request with `options`, if it cannot.
    static func refusal(of options: TransportOptions) -> TransportError? {
        let what: String
        if options.tlsVerification == .insecure {
            what = "turn certificate verification off"
        } else if options.caCertificatePath != nil {
            what = "use a CA certificate bundle other than the system's"
        } else if options.netrc != nil {
            what = "read credentials from a netrc file"
        } else if options.proxy != nil || options.noProxy != nil || options.proxyCACertificatePath != nil {
            // FoundationNetworking has no per-session proxy on Linux; the environment's may or may not be used.
            what = "use a proxy given in its options"
        } else {
            return nil
        }
        return TransportError(.unsupported, "the URLSession transport cannot \(what); use the libcurl transport")
    }
}

/// A response of the URLSession transport whose head has arrived; the task stays held until the engine decides.
final class URLSessionResponse: TransportResponse {
    let head: ResponseHead
    private let transfer: URLSessionTransfer
    /// Whether the body was asked for (received or discarded).
    private let consumed = Atomic<Bool>(false)
    private let cancelled = Atomic<Bool>(false)

    init(transfer: URLSessionTransfer, head: ResponseHead) {
        self.transfer = transfer
        self.head = head
    }

    deinit {
        if !consumed.load(ordering: .acquiring) && !cancelled.load(ordering: .acquiring) { transfer.cancel() }
    }

    func receive(into sink: any BodySink) async -> Result<Void, TransportError> {
        await body(.receiving(sink))
    }

    func discard() async -> Result<Void, TransportError> {
        await body(.discarding)
    }

    /// A body asked for afterwards ends `.cancelled` once the task has: its connection is let go of by then.
    func cancel() {
        cancelled.store(true, ordering: .releasing)
        transfer.cancel()
    }

    private func body(_ phase: URLSessionTransfer.Phase) async -> Result<Void, TransportError> {
        guard !consumed.exchange(true, ordering: .acquiringAndReleasing) else {
            return .failure(TransportError(.other, "a response body can be read only once"))
        }
        let transfer = self.transfer
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                transfer.decide(phase, continuation)
            }
        } onCancel: {
            transfer.cancel()
        }
    }
}


/// One request: the session, its task and the state of the transfer. Everything but `begin` and `cancel` runs on
/// `queue` (the delegate queue's underlying queue); those two hop onto it. Each continuation is resumed exactly
/// once, there.
final class URLSessionTransfer: NSObject, URLSessionDataDelegate, @unchecked Sendable {
    enum Phase {
        case awaitingHead
        case awaitingDecision
        case receiving(any BodySink)
        case discarding
    }

    /// Body bytes read and dropped (redirect and error bodies) before the transfer is ended, as libcurl's backend.
    static let maximumDiscardedBytes = 64 << 10

    let request: TransportRequest
    let url: URL
    /// The window the request is first asked for in, until its response says it cannot be (then nil: asked as made).
    private var window: RangeWindow?
    /// The rest of a windowed body, to be asked for window by window; nil once nothing more is to be asked for.
    private var rest: RangeWindow.Rest?
    /// The bytes the running task of a windowed body asks for, and how many of them it has brought.
    private var taskWindow: (first: Int64, last: Int64)?
    private var taskBytes: Int64 = 0
    /// Whether the running task's answer has been judged (the engine's head, or a later window's).
    private var taskHeadSeen = false
    /// A window's task ended with all its bytes, and the next is not asked for yet (the engine has not decided, or
    /// too many bytes are still held for the sink).
    private var betweenWindows = false
    /// Whether the running task has ended (its completion came): cancelling it does nothing, and no callback follows.
    private var taskDone = false
    /// The running task's answer was dropped (`sendAsAsked`): its end sends the engine's request as made.
    private var resendOnEnd = false
    /// Whether the response can bring at most a window (or is no longer than one): then nothing is let go of.
    private var bounded = false
    /// Why a later window's answer was refused.
    private var windowProblem: String?
    /// The transport's window size, if it windows requests.
    let windowSize: Int?
    let yieldLimit: Int
    let holdLimit: Int
    /// One serial queue for every transfer of the process: the delegate callbacks, the transfers' state, and the
    /// calls into FoundationNetworking that wait on a session's own work queue (`dataTask(with:)`, `resume()`,
    /// `cancel()`, `invalidateAndCancel()`). With a queue per transfer, a burst of transfers starting at once held
    /// every dispatch worker thread (255 on Linux) in those waits while the work queues they waited for needed a
    /// worker to run, and the process stopped (seen in CI: 121 threads in `resume()`, 109 in `dataTask(with:)`, 24
    /// in `cancel()`). One queue blocks at most one worker; the libcurl backend likewise runs every transfer on one
    /// thread.
    static let sharedQueue = DispatchQueue(label: "stitch.urlsession")
    let queue = URLSessionTransfer.sharedQueue
    private let operations = OperationQueue()
    private var session: URLSession?
    private var task: URLSessionDataTask?
    private var timer: (any ClockTimer)?

    private var phase = Phase.awaitingHead
    private var headContinuation: CheckedContinuation<Result<ResponseHead, TransportError>, Never>?
    private var bodyContinuation: CheckedContinuation<Result<Void, TransportError>, Never>?
    /// How the task ended, kept until the engine's body phase (or the bytes still held for the sink) can take it.
    private var outcome: Result<Void, TransportError>?
    private var finished = false
    private var headDelivered = false

    /// Body bytes the sink has not taken yet, in order: arrived before the engine's decision, refused by a
    /// `.wait`, or arrived during one.
    private var held: [Data] = []
    private var heldBytes = 0
    private var waiting = false
    /// The largest chunk the session has delivered, to estimate what waits on the delegate queue.
    private var largestChunk = 0

    /// Why we ended the task ourselves, if we did.
    private enum Stop { case cancelled, sinkAborted, stalled, discardCapped, yielded, overHoldLimit, windowRefused }
    private var stopReason: Stop?
    /// Let go of while the engine decided, past `holdLimit`: the bytes held until then still go to a sink whose
    /// rest can be asked for again (then the transfer ends `yielded`); any other sink gets the hold limit's failure.
    private var keepsHeld = false
    private var discarded = 0
    /// Bytes the sink took.
    private var received: Int64 = 0
    private var expectedLength: Int64?

    private var lastActivity = 0.0
    private var bytesSinceActivity = 0
    private var activityThreshold: Int

    let onLetGo: (@Sendable () -> Void)?
    let onWindowEnd: (@Sendable (Int) -> Void)?

    init(
        request: TransportRequest, url: URL, windowSize: Int?, yieldLimit: Int, holdLimit: Int,
        onLetGo: (@Sendable () -> Void)?, onWindowEnd: (@Sendable (Int) -> Void)?
    ) {
        self.onWindowEnd = onWindowEnd
        self.windowSize = windowSize
        let window = windowSize.flatMap { RangeWindow(requestHeaders: request.headers, size: $0) }
        self.onLetGo = onLetGo
        self.request = request
        self.url = url
        self.window = window
        self.yieldLimit = yieldLimit
        self.holdLimit = holdLimit
        activityThreshold = max(1, request.options.stallMinimumBytes)
        super.init()
        operations.maxConcurrentOperationCount = 1
        operations.underlyingQueue = queue
    }

    // MARK: Calls from the transport and the response

    func begin(_ continuation: CheckedContinuation<Result<ResponseHead, TransportError>, Never>) {
        queue.async { [self] in
            headContinuation = continuation
            if stopReason == .cancelled {
                finish(.failure(.cancelled))
                return
            }
            startTask()
        }
    }

    /// A task for the request: in its first window, if it has one, or as the engine made it; or, with `range` and
    /// `ifRange`, for a later window. One session serves the request's tasks, so a later window reuses the
    /// connection.
    private func startTask(range: String? = nil, ifRange: String? = nil) {
        let options = request.options
        let session = self.session ?? makeSession()
        var urlRequest = URLRequest(url: url)
        urlRequest.httpMethod = "GET"
        urlRequest.setValue(options.userAgent, forHTTPHeaderField: "User-Agent")
        for field in request.headers {
            if urlRequest.value(forHTTPHeaderField: field.name) == nil || field.name.lowercased() == "user-agent" {
                urlRequest.setValue(field.value, forHTTPHeaderField: field.name)
            } else {
                urlRequest.addValue(field.value, forHTTPHeaderField: field.name)
            }
        }
        if let credentials = options.credentials, !request.headers.contains("Authorization"),
            let origin = TransportOptions.Credentials.origin(of: request.url), credentials.origins.contains(origin)
        {
            let token = Data("\(credentials.user):\(credentials.password)".utf8).base64EncodedString()
            urlRequest.setValue("Basic \(token)", forHTTPHeaderField: "Authorization")
        }
        if let range {
            urlRequest.setValue(range, forHTTPHeaderField: "Range")
            urlRequest.setValue(ifRange, forHTTPHeaderField: "If-Range")
        } else if let window {
            urlRequest.setValue(window.rangeValue, forHTTPHeaderField: "Range")
        }
        taskBytes = 0
        taskHeadSeen = false
        taskDone = false
        let task = session.dataTask(with: urlRequest)
        self.session = session
        self.task = task
        markActive()
        if timer == nil { startTimer() }
        task.resume()
    }

    private func makeSession() -> URLSession {
        let options = request.options
        let configuration = URLSessionConfiguration.ephemeral
        configuration.keepsNothing()
        // A backstop only: the session's request timeout restarts with every byte; stalls are timed below.
        configuration.timeoutIntervalForRequest = max(options.connectTimeout, options.stallTimeout) + 1
        configuration.timeoutIntervalForResource = 365 * 86_400
        configuration.httpMaximumConnectionsPerHost = 1
        return URLSession(configuration: configuration, delegate: self, delegateQueue: operations)
    }

    /// Drops the windowed request whose answer cannot stand for the engine's, and sends the engine's as it made it,
    /// once the dropped task has ended: one request never holds two connections, even for a moment (the per-host
    /// cap counts connections).
    private func sendAsAsked() {
        guard stopReason == nil else { return }
        window = nil
        if let task, !taskDone {
            resendOnEnd = true
            task.cancel()  // `didCompleteWithError` follows, and sends it
            return
        }
        resend()
    }

    /// The engine's request as it made it, on a session of its own (nothing of the dropped task's can reach it).
    private func resend() {
        session?.invalidateAndCancel()
        session = nil
        startTask()
    }

    /// Asks for the next window of the body once the engine takes the body and at most half a window waits for the
    /// sink: memory stays within one and a half windows, and the next window's bytes come while the sink takes the
    /// held ones.
    private func askForNextWindow() {
        guard betweenWindows, let rest, case .receiving(let sink) = phase, stopReason == nil, !finished,
            Int64(heldBytes) <= rest.size / 2
        else { return }
        var window = rest.nextWindow
        if let wanted = sink.bytesWanted {
            // No further than one byte past what the sink still wants (beyond the bytes held for it): the byte
            // shows the sink where its bytes end, as one response would. None at all when the held bytes reach it.
            let beyondHeld = wanted - Int64(heldBytes)
            if beyondHeld < 0 { return }  // the sink stops within what is held; its abort ends the body
            window.last = min(window.last, window.first + beyondHeld)
        }
        betweenWindows = false
        taskWindow = window
        startTask(range: "bytes=\(window.first)-\(window.last)", ifRange: rest.validator)
    }

    func decide(_ phase: Phase, _ continuation: CheckedContinuation<Result<Void, TransportError>, Never>) {
        queue.async { [self] in
            bodyContinuation = continuation
            if stopReason == .cancelled, !finished, outcome == nil, task != nil, !taskDone {
                // Cancelled before the engine decided: answered when the task's end comes (`didCompleteWithError`
                // follows the cancel), so that the caller's next request never overlaps this one's connection.
                return
            }
            if finished || stopReason == .cancelled {
                finish(outcome ?? .failure(.cancelled))
                return
            }
            self.phase = phase
            markActive()
            switch phase {
            case .receiving(let sink):
                if keepsHeld && !sink.canRequestRest {
                    keepsHeld = false
                    dropHeld()
                    stopReason = .overHoldLimit
                    if outcome != nil { outcome = result(nil) }
                }
                offerHeld()
                askForNextWindow()
            default:
                if betweenWindows {
                    // A windowed body to drop: what its first window brought is all that is read.
                    betweenWindows = false
                    rest = nil
                    outcome = .success(())
                }
                if keepsHeld {
                    // A body to drop, let go of already: as a capped discard (the task's end completes it).
                    keepsHeld = false
                    stopReason = .discardCapped
                    dropHeld()
                    if outcome != nil { outcome = .success(()) }
                    complete()
                    return
                }
                discarded += heldBytes
                dropHeld()
                if discarded > Self.maximumDiscardedBytes {
                    stop(.discardCapped)
                } else {
                    complete()
                }
            }
        }
    }

    func cancel() {
        queue.async { [self] in
            guard !finished else { return }
            stop(.cancelled)
        }
    }

    // MARK: Delegate callbacks (on `queue`)

    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
        newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void
    ) {
        completionHandler(nil)  // the engine follows redirects itself
    }

    func urlSession(
        _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void
    ) {
        guard !finished, dataTask === task, let http = response as? HTTPURLResponse else {
            completionHandler(.cancel)
            return
        }
        guard acceptTaskHead(http) else {
            completionHandler(.cancel)
            return
        }
        // Apple's Foundation holds the body until this is called; FoundationNetworking does not wait for it, so
        // the body is held here instead (see the type's notes).
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        guard !finished, stopReason == nil, dataTask === task, !resendOnEnd else { return }
        if !taskHeadSeen {
            if let http = dataTask.response as? HTTPURLResponse {
                guard acceptTaskHead(http) else { return }
            } else if headDelivered {
                return  // a later window's bytes before its head (never seen): not taken unjudged; it ends short
            }
        }
        taskBytes += Int64(data.count)
        if let taskWindow, taskBytes > taskWindow.last - taskWindow.first + 1 {
            // (A chunked answer can run past its Content-Range; its extra bytes are not the next ones.)
            windowProblem = "the server sent more than the bytes \(taskWindow.first)-\(taskWindow.last) it announced"
            stop(.windowRefused)
            return
        }
        noteReceived(data.count)
        largestChunk = max(largestChunk, data.count)
        switch phase {
        case .awaitingHead, .awaitingDecision:
            hold(data)
        case .discarding:
            discarded += data.count
            if discarded > Self.maximumDiscardedBytes { stop(.discardCapped) }
        case .receiving:
            if waiting || !held.isEmpty {
                hold(data)
            } else {
                offer(data)
            }
        }
        limitMemory()
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard !finished, task === self.task else { return }
        taskDone = true
        if resendOnEnd {
            resendOnEnd = false
            // Stopped meanwhile (a cancel, a stall): that is how the transfer ends, below.
            if stopReason == nil {
                resend()
                return
            }
        }
        if !taskHeadSeen, error == nil, let http = task.response as? HTTPURLResponse {
            // A 3xx the session read to its end before asking about the redirect comes without the response
            // callback.
            guard acceptTaskHead(http) else {
                // Refused: sent again as the engine asked (a task of its own follows), or the end is now.
                guard task === self.task, outcome == nil else { return }
                outcome = result(nil)
                complete()
                return
            }
        }
        if error == nil, stopReason == nil, let rest, let taskWindow,
            taskBytes == taskWindow.last - taskWindow.first + 1
        {
            // A window's end: the next window comes (once the engine takes the body), or the body is complete.
            if taskWindow.last < rest.last {
                self.rest?.next = taskWindow.last + 1
                switch phase {
                case .awaitingDecision, .receiving:
                    betweenWindows = true
                    onWindowEnd?(heldBytes)
                    askForNextWindow()
                    return
                default:
                    break
                }
            } else {
                self.rest = nil
            }
        }
        outcome = result(error)
        complete()
    }

    // MARK: The body

    private func hold(_ data: Data) {
        held.append(data)
        heldBytes += data.count
    }

    private func dropHeld() {
        held.removeAll()
        heldBytes = 0
    }

    /// Hands `data` to the sink (nothing held before it); refused bytes go back to the front of `held`.
    private func offer(_ data: Data) {
        guard case .receiving(let sink) = phase, stopReason == nil || keepsHeld else { return }
        let decision = data.withUnsafeBytes { sink.receive($0) }
        switch decision {
        case .accepted:
            received += Int64(data.count)
        case .wait(let duration):
            held.insert(data, at: 0)
            heldBytes += data.count
            waiting = true
            let (seconds, attoseconds) = duration.components
            let delay = max(0.001, Double(seconds) + Double(attoseconds) * 1e-18)
            queue.asyncAfter(deadline: .now() + delay) { [self] in
                waiting = false
                if stopReason == .yielded && !keepsHeld { complete() } else { offerHeld() }
            }
            // What arrived before the wait may be past the limit already, with nothing more to come until the
            // server sends more (or never, if it waits for us): judge it now, not only when more arrives.
            limitMemory()
        case .abort:
            dropHeld()
            stop(.sinkAborted)
        }
    }

    /// Offers the held bytes in order until the sink waits again or they are gone; completes a task that ended
    /// meanwhile once they are.
    private func offerHeld() {
        guard case .receiving = phase, !finished else { return }
        if stopReason != nil && !keepsHeld {
            complete()  // stopped meanwhile: nothing more goes to the sink
            return
        }
        while !held.isEmpty, !waiting, stopReason == nil || keepsHeld {
            let data = held.removeFirst()
            heldBytes -= data.count
            offer(data)
        }
        if held.isEmpty && !waiting { complete() }
        askForNextWindow()
    }

    /// Keeps what the sink has not taken — held here or waiting on the delegate queue — within the limits.
    private func limitMemory() {
        // A window's response brings at most the window (no larger than `holdLimit`), whatever the sink does.
        guard stopReason == nil, outcome == nil, !bounded else { return }
        let pending = heldBytes + max(0, operations.operationCount - 1) * largestChunk
        switch phase {
        case .receiving(let sink) where sink.canRequestRest:
            if pending > yieldLimit { stop(.yielded) }
        case .awaitingHead, .awaitingDecision:
            // Whether the rest can be asked for is the sink's to say, once the engine has decided: keep what is
            // held for it, stop reading more.
            if pending > holdLimit {
                keepsHeld = true
                stop(.yielded)
            }
        default:
            if pending > holdLimit { stop(.overHoldLimit) }
        }
    }

    // MARK: The head and the end

    /// Judges the answer of the running task: the engine's head, or a later window's, which must be exactly the
    /// next bytes of the same version of the file. False when the task's bytes are not to be taken.
    private func acceptTaskHead(_ http: HTTPURLResponse) -> Bool {
        guard !taskHeadSeen else { return true }
        taskHeadSeen = true
        // Stopped already (a cancel, a stall) while this answer was on its way: nothing of it is taken, and no
        // request is sent in its place.
        guard stopReason == nil else { return false }
        guard headDelivered else { return deliverHead(http) }
        guard let rest, let taskWindow else { return true }
        if let problem = rest.problem(with: Self.head(of: http), window: taskWindow) {
            windowProblem = problem
            stop(.windowRefused)
            return false
        }
        markActive()
        return true
    }

    /// Shows the engine the head of `http` (or what it stands for, in a window); false when the response is dropped
    /// and the request sent again as the engine made it.
    @discardableResult
    private func deliverHead(_ http: HTTPURLResponse) -> Bool {
        guard !headDelivered else { return true }
        var head = Self.head(of: http)
        if let window {
            switch window.adapt(head) {
            case .pass:
                break
            case .sendAsAsked:
                sendAsAsked()
                return false
            case .rewrite(let shown, let bodyLength, let rest):
                head = shown
                bounded = true
                self.rest = rest
                taskWindow = (window.start, window.start + bodyLength - 1)
            }
        }
        headDelivered = true
        if let length = head.headers["Content-Length"].flatMap({ Int64($0) }), length >= 0 {
            expectedLength = length
            activityThreshold = max(1, min(activityThreshold, Int(clamping: length)))
            // No longer than a window, and framed by that length (no transfer coding; no content coding, which
            // FoundationNetworking may undo into more bytes): nothing to let go of.
            let coded = head.headers["Transfer-Encoding"] != nil
                || head.headers["Content-Encoding"].map { $0.trimming(" \t").lowercased() != "identity" } == true
            if let windowSize, length <= windowSize, !coded { bounded = true }
        }
        markActive()
        phase = .awaitingDecision
        if let continuation = headContinuation {
            headContinuation = nil
            continuation.resume(returning: .success(head))
        }
        return true
    }

    /// The status and header fields of `http`, as the engine reads them.
    static func head(of http: HTTPURLResponse) -> ResponseHead {
        var headers = HTTPHeaders()
        let fields = http.allHeaderFields.compactMap { key, value -> (String, String)? in
            guard let name = key as? String else { return nil }
            return (name, value as? String ?? "\(value)")
        }
        for (name, value) in fields.sorted(by: { $0.0.lowercased() < $1.0.lowercased() }) {
            if name.lowercased() == "content-length" {
                // The session joins repeated fields with commas; the engine must see conflicting lengths as such.
                for part in value.split(separator: ",") { headers.add(name: name, value: String(part).trimming(" \t")) }
            } else {
                headers.add(name: name, value: value)
            }
        }
        return ResponseHead(status: http.statusCode, headers: headers)
    }

    /// Ends the task from our side; `didCompleteWithError` follows (or, before there is a task, the end is now).
    private func stop(_ reason: Stop) {
        if stopReason == .yielded, reason != .yielded, reason == .cancelled || keepsHeld {
            // Let go of already — the task's end still on its way, or come while a sink's wait runs out or the
            // bytes held for it are offered: a cancel, or the sink's abort of those bytes, is what the transfer
            // ends with, now or (no outcome yet) when the task's end comes (`result` maps it).
            keepsHeld = false
            dropHeld()
            stopReason = reason
            if outcome != nil {
                outcome = result(nil)
                complete()
            }
            return
        }
        guard stopReason == nil else { return }
        stopReason = reason
        if reason == .yielded { onLetGo?() }
        if reason != .discardCapped && !keepsHeld { dropHeld() }
        betweenWindows = false
        if let task, outcome == nil, !taskDone {
            task.cancel()  // `didCompleteWithError` follows
        } else {
            // No task yet, or it has ended already (its completion ran: cancelling it now does nothing and no
            // callback follows): the end is now, in the words of why we stopped.
            outcome = result(nil)
            complete()
        }
    }

    /// The task has ended (`outcome` is set): whoever waits learns how, once the held bytes are gone.
    private func complete() {
        guard var outcome, !finished else { return }
        if case .receiving = phase, !held.isEmpty || waiting {
            if case .success = outcome { return }  // after them
            if keepsHeld { return }  // let go of before the decision: the held bytes still go first
        }
        if keepsHeld, stopReason == .yielded {
            outcome = result(nil)  // says how many bytes the sink took
            self.outcome = outcome
        }
        // Let go of during a sink's wait: the engine's next request comes when the wait is over, not at once.
        if waiting, stopReason == .yielded { return }
        // A clean end short of the announced length, once every held byte has been taken.
        if case .success = outcome, case .receiving = phase, stopReason == nil, let expectedLength,
            received < expectedLength
        {
            self.outcome = .failure(.partialBody("the body ended after \(received) of \(expectedLength) bytes"))
        }
        // With nobody waiting the engine is still deciding: `decide` finds the outcome kept.
        finish(self.outcome ?? outcome)
    }

    /// Resumes whoever waits with `result`, once, and lets the session go.
    private func finish(_ result: Result<Void, TransportError>) {
        if let continuation = headContinuation {
            headContinuation = nil
            finished = true
            switch result {
            case .failure(let error): continuation.resume(returning: .failure(error))
            case .success: continuation.resume(returning: .failure(.protocolError("the server sent no complete response")))
            }
        } else if let continuation = bodyContinuation {
            bodyContinuation = nil
            finished = true
            continuation.resume(returning: result)
        } else if stopReason == .cancelled {
            // Cancelled with nobody waiting (a dropped response): let the session go now; a late `decide` or
            // `begin` still finds the outcome.
            finished = true
        } else {
            return
        }
        timer?.cancel()
        timer = nil
        dropHeld()
        session?.finishTasksAndInvalidate()  // releases the session's hold on this delegate
        session = nil
    }

    /// How the task ended, in the engine's terms.
    private func result(_ error: (any Error)?) -> Result<Void, TransportError> {
        switch stopReason {
        case .sinkAborted:
            return .failure(.abortedBySink)
        case .stalled:
            let seconds = String(format: "%g", request.options.stallTimeout)
            let what = bytesSinceActivity == 0 ? "no data" : "only \(bytesSinceActivity) bytes"
            return .failure(.stalled("\(what) in \(seconds) s (stalled transfer)"))
        case .discardCapped:
            return .success(())
        case .cancelled:
            return .failure(.cancelled)
        case .windowRefused:
            // The engine's next request (a range under its validator) finds out what changed, and says so.
            return .failure(.partialBody(
                "the body ended after \(received) bytes: \(windowProblem ?? "a later window was refused")"))
        case .yielded:
            return .failure(TransportError(
                .yielded, "let go of the connection after \(received) bytes: the sink is slower than the server"))
        case .overHoldLimit:
            return .failure(TransportError(
                .unsupported,
                "the URLSession transport cannot slow this server down to the rate the download is written at "
                    + "(\(holdLimit >> 20) MiB held in memory), and the server cannot send the rest on its own; "
                    + "use the libcurl transport"))
        case nil:
            break
        }
        guard let error else {
            if !headDelivered { return .failure(.protocolError("the server sent no complete response")) }
            return .success(())  // (a body short of its length is caught in `complete`, after the held bytes)
        }
        let nsError = error as NSError
        let message = nsError.localizedDescription.isEmpty ? "\(error)" : nsError.localizedDescription
        let lowered = message.lowercased()
        let code: TransportError.Code
        switch nsError.code {
        case NSURLErrorCancelled: code = .cancelled
        case NSURLErrorCannotFindHost, NSURLErrorDNSLookupFailed: code = .resolve
        case NSURLErrorCannotConnectToHost: code = .connect
        case NSURLErrorTimedOut: code = headDelivered ? .stalled : .connectTimeout
        case NSURLErrorSecureConnectionFailed, NSURLErrorServerCertificateHasBadDate,
            NSURLErrorServerCertificateUntrusted, NSURLErrorServerCertificateHasUnknownRoot,
            NSURLErrorServerCertificateNotYetValid, NSURLErrorClientCertificateRejected,
            NSURLErrorClientCertificateRequired:
            code = .tls
        case NSURLErrorBadServerResponse, NSURLErrorCannotParseResponse:
            code = headDelivered ? .network : .protocolError
        case NSURLErrorNetworkConnectionLost: code = headDelivered ? .partialBody : .network
        case NSURLErrorUnsupportedURL, NSURLErrorBadURL: code = .other
        default:
            // FoundationNetworking reports most libcurl failures as "unknown", with libcurl's message.
            if lowered.contains("ssl") || lowered.contains("certificate") || lowered.contains("tls") {
                code = .tls
            } else if !headDelivered, Self.refusedHeadMessages.contains(where: { lowered.contains($0) }) {
                code = .malformedResponse
                return .failure(TransportError(
                    code, "the server's response is malformed: \(message)", underlyingCode: nsError.code))
            } else if headDelivered, lowered.contains("transfer closed") || lowered.contains("partial") {
                code = .partialBody
            } else {
                code = .network
            }
        }
        // A later window's connection that cannot be made: the body was cut, not the download's start refused.
        if headDelivered, code == .resolve || code == .connect || code == .connectTimeout {
            return .failure(.partialBody("the body ended after \(received) bytes: asking for the next bytes: \(message)"))
        }
        var shown = message
        // FoundationNetworking passes on libcurl's words ("Failed to connect to H port P after 0 ms: Couldn't
        // connect to server"), which repeat the host the engine names and lose the system's reason.
        if code == .connect { shown = "refused, or the host cannot be reached" }
        if code == .tls, let host = url.host { shown += " (server \(host)\(url.port.map { ":\($0)" } ?? ""))" }
        return .failure(TransportError(code, shown, underlyingCode: nsError.code))
    }

    /// What libcurl (and FoundationNetworking's own header parser: "failed writing header") says of a response
    /// head it refuses; the same server would send the same again.
    static let refusedHeadMessages = [
        "invalid content-length", "nul byte in header", "too large response headers", "out of memory",
        "failed writing header", "weird server reply", "header without colon", "unsupported http version",
        "invalid status line",
    ]

    // MARK: Stalls

    private func startTimer() {
        // On the download's clock; the check itself runs on this transfer's queue (the clock's thread only posts).
        let interval = max(0.05, min(1, request.options.stallTimeout / 4))
        let queue = self.queue
        // Resolved on the queue: the clock's thread must never drop what could be the last reference.
        let check: @Sendable () -> Void = { [weak self] in self?.checkStall() }
        timer = request.clock.every(interval) { queue.async(execute: check) }
    }

    /// Bytes keep arriving from the network whatever the sink does (nothing is paused), so a stall is the
    /// server's.
    private func checkStall() {
        guard !finished, outcome == nil, stopReason == nil else { return }
        if betweenWindows {
            markActive()  // nothing asked of the server: the sink is taking the held bytes
            return
        }
        if case .awaitingDecision = phase {
            // The engine deciding (a resume check on a busy machine can take a while) is not the server stalling:
            // the time starts again when the decision comes.
            markActive()
            return
        }
        if request.clock.uptime() - lastActivity > request.options.stallTimeout { stop(.stalled) }
    }

    private func noteReceived(_ count: Int) {
        bytesSinceActivity += count
        if bytesSinceActivity >= activityThreshold { markActive() }
    }

    private func markActive() {
        lastActivity = request.clock.uptime()
        bytesSinceActivity = 0
    }
}

extension URLSessionConfiguration {
    /// No cache, no cookies, no stored credentials: every request is sent as made, and nothing of one download
    /// reaches another.
    func keepsNothing() {
        urlCache = nil
        requestCachePolicy = .reloadIgnoringLocalAndRemoteCacheData
        httpCookieAcceptPolicy = .never
        httpShouldSetCookies = false
        httpCookieStorage = nil
        urlCredentialStorage = nil
    }
}
