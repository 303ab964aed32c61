import Glibc
import StitchLocks

/// How a connection ends.
enum CloseMode {
    /// Half-close (FIN), drain what the client still sends for a short while, then close.
    case graceful
    /// `shutdown(SHUT_RDWR)` and close at once.
    case abrupt
    /// Close with `SO_LINGER` 0 so the peer gets a TCP RST.
    case reset
}

/// The response behaviour resulting from a (possibly combined) ``Fault``.
struct ResponsePlan {
    enum Replacement {
        case close
        case status(Int, headers: [(String, String)], body: [UInt8])
        case redirect(Int, location: String)
        case raw([UInt8], then: AfterStall)
    }

    enum CutAction {
        case drop, reset, short
        case stall(AfterStall)
    }

    var replacement: Replacement?
    var stallBeforeHeaders: AfterStall?
    var ignoreRange = false
    var chunked = false
    var contentRangeLie: ContentRangeLie?
    var claimedLength: Int?
    var cut: (after: Int, action: CutAction)?
    var throttle: Int?
    /// Body bytes sent at full speed before ``throttle`` applies.
    var throttleAfter = 0
    var servedAs: ServedFile?

    init(_ fault: Fault) {
        apply(fault)
    }

    private mutating func apply(_ fault: Fault) {
        switch fault {
        case .none: break
        case .dropAfter(let bytes): cut = (max(0, bytes), .drop)
        case .resetAfter(let bytes): cut = (max(0, bytes), .reset)
        case .stallAfter(let bytes, let then): cut = (max(0, bytes), .stall(then))
        case .stallBeforeHeaders(let then): stallBeforeHeaders = then
        case .shortBody(let bytes): cut = (max(0, bytes), .short)
        case .wrongContentLength(let claimed): claimedLength = claimed
        case .ignoreRange: ignoreRange = true
        case .wrongContentRange(let lie): contentRangeLie = lie
        case .status(let code, let headers, let body):
            if replacement == nil { replacement = .status(code, headers: headers, body: body) }
        case .redirect(let code, let location):
            if replacement == nil { replacement = .redirect(code, location: location) }
        case .chunked: chunked = true
        case .throttle(let rate): throttle = rate
        case .throttleAfter(let bytes, let rate):
            throttle = rate
            throttleAfter = max(0, bytes)
        case .closeWithoutResponse:
            if replacement == nil { replacement = .close }
        case .raw(let bytes, let then):
            if replacement == nil { replacement = .raw(bytes, then: then) }
        case .servedAs(let file): servedAs = file
        case .all(let faults):
            for fault in faults { apply(fault) }
        }
    }

    /// Whether the response leaves the connection in an unusable state (it must be closed).
    var breaksFraming: Bool {
        if claimedLength != nil { return true }
        guard let cut else { return false }
        if case .stall(.resume) = cut.action { return false }
        return true
    }
}

/// Serves the requests of one connection, on that connection's thread.
final class ConnectionHandler {
    private let core: ServerCore
    private let fd: Int32
    private let id: Int
    /// Received bytes not yet consumed.
    private var buffer: [UInt8] = []

    init(core: ServerCore, fd: Int32, id: Int) {
        self.core = core
        self.fd = fd
        self.id = id
    }

    func run() {
        var handled = 0
        while true {
            guard let head = readHead() else { return }
            if head.header("Transfer-Encoding") != nil {
                finish(sendSimple(501, isHead: false, keepAlive: false) ?? .graceful)
                return
            }
            if let lengthValue = head.header("Content-Length") {
                guard let length = Int(lengthValue.trimmingSpaces()), length >= 0, discardBody(length) else {
                    finish(sendSimple(400, isHead: false, keepAlive: false) ?? .graceful)
                    return
                }
            }
            let (request, route) = core.record(head, connectionID: id, indexOnConnection: handled)
            handled += 1
            core.beginResponse(connectionID: id, fd: fd, path: request.path)
            core.progress.update { $0.activeResponses += 1 }
            let closeMode = respond(to: request, keepAlive: head.wantsKeepAlive, route: route)
            core.endResponse(connectionID: id)
            if let closeMode { finish(closeMode) }
            core.progress.update { $0.activeResponses -= 1 }
            if closeMode != nil { return }
        }
    }

    // MARK: Reading

    /// Reads the next request head; on EOF, error or an invalid head it answers if
    /// appropriate, closes the connection and returns nil.
    private func readHead() -> RequestHead? {
        while true {
            switch parseRequestHead(buffer, limit: ServerCore.headerLimit) {
            case .head(let head, let consumed):
                buffer.removeFirst(consumed)
                return head
            case .tooLarge:
                finish(sendSimple(431, isHead: false, keepAlive: false) ?? .graceful)
                return nil
            case .malformed:
                finish(sendSimple(400, isHead: false, keepAlive: false) ?? .graceful)
                return nil
            case .incomplete:
                if !receiveMore() {
                    finish(.abrupt)
                    return nil
                }
            }
        }
    }

    /// Appends received bytes to `buffer`; false on EOF or error (including shutdown by `stop`).
    private func receiveMore() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                buffer.append(contentsOf: chunk[0..<count])
                return true
            }
            if count < 0, errno == EINTR { continue }
            return false
        }
    }

    /// Consumes and drops a request body of `length` bytes.
    private func discardBody(_ length: Int) -> Bool {
        var remaining = length
        while true {
            let take = min(remaining, buffer.count)
            buffer.removeFirst(take)
            remaining -= take
            if remaining == 0 { return true }
            if !receiveMore() { return false }
        }
    }

    // MARK: Responding

    /// Sends the response; returns how to close the connection, or nil to keep it open.
    private func respond(to request: RecordedRequest, keepAlive: Bool, route: Route?) -> CloseMode? {
        let fault = route?.faults.fault(for: request, index: request.index) ?? .none
        var plan = ResponsePlan(fault)
        if plan.throttle == nil { plan.throttle = core.state.withLock { $0.throttle } }
        let isHead = request.method == "HEAD"

        if let then = plan.stallBeforeHeaders {
            guard stall() == .released, then == .resume else { return .abrupt }
        }
        switch plan.replacement {
        case .close?:
            return .abrupt
        case .status(let code, let headers, let body)?:
            return sendSimple(code, headers: headers, body: body, isHead: isHead, keepAlive: keepAlive)
        case .redirect(let code, let location)?:
            return sendSimple(code, headers: [("Location", location)], isHead: isHead, keepAlive: keepAlive)
        case .raw(let bytes, let then)?:
            return sendRaw(bytes, then: then, plan: plan, keepAlive: keepAlive, path: request.path, serial: request.serial)
        case nil:
            break
        }
        guard let route else {
            return sendSimple(404, body: Array("not found\n".utf8), isHead: isHead, keepAlive: keepAlive)
        }
        switch route.kind {
        case .redirect(let location, let status):
            return sendSimple(status, headers: [("Location", location)], isHead: isHead, keepAlive: keepAlive)
        case .file(let file):
            guard request.method == "GET" || isHead else {
                return sendSimple(405, headers: [("Allow", "GET, HEAD")], isHead: false, keepAlive: keepAlive)
            }
            return sendFile(plan.servedAs ?? file, request: request, plan: plan, keepAlive: keepAlive)
        }
    }

    /// Sends a complete non-file response. Headers in `headers` replace the defaults of the same name.
    private func sendSimple(
        _ status: Int, headers: [(String, String)] = [], body: [UInt8] = [], isHead: Bool, keepAlive: Bool
    ) -> CloseMode? {
        let names = Set(headers.map { $0.0.lowercased() })
        let customFraming = names.contains("content-length") || names.contains("transfer-encoding")
        let close = !keepAlive || customFraming
        var lines = ["HTTP/1.1 \(status) \(reasonPhrase(status))"]
        if !names.contains("date") { lines.append("Date: \(ServedFile.httpDateNow())") }
        if !names.contains("server") { lines.append("Server: StitchTestServer") }
        // A 304 has no body and no length of its own (RFC 9110 §15.4.5).
        if !customFraming, status != 304 { lines.append("Content-Length: \(body.count)") }
        if !body.isEmpty, !names.contains("content-type") { lines.append("Content-Type: text/plain") }
        for (name, value) in headers { lines.append("\(name): \(value)") }
        if !keepAlive, !names.contains("connection") { lines.append("Connection: close") }
        var bytes = Array((lines.joined(separator: "\r\n") + "\r\n\r\n").utf8)
        if !isHead { bytes += body }
        core.endResponse(connectionID: id)  // the client may see the whole response from now on
        guard sendAll(fd, bytes) else { return .abrupt }
        return close ? .graceful : nil
    }

    /// Sends `bytes` verbatim as the whole response, applying the plan's cut and pacing to the bytes after the
    /// head (see ``Fault/raw(_:then:)``).
    private func sendRaw(
        _ bytes: [UInt8], then: AfterStall, plan: ResponsePlan, keepAlive: Bool, path: String, serial: Int? = nil
    ) -> CloseMode? {
        let bodyStart = Self.headEnd(of: bytes) ?? 0
        if plan.cut == nil, bodyStart == bytes.count {
            core.endResponse(connectionID: id)  // the head is the whole response
        }
        guard sendAll(fd, Array(bytes[0..<bodyStart])) else { return .abrupt }
        let outcome = sendBody(
            bytes, slice: bodyStart..<bytes.count, chunked: false, cut: plan.cut, throttle: plan.throttle, throttleAfter: plan.throttleAfter,
            path: path, serial: serial)
        switch outcome {
        case .complete: return then == .resume && keepAlive ? nil : .graceful
        case .cut(let mode): return mode
        case .failed: return .abrupt
        }
    }

    /// The offset just past the first `CRLF CRLF` (or `LF LF`) in `bytes`, if any.
    static func headEnd(of bytes: [UInt8]) -> Int? {
        var index = 0
        while index < bytes.count {
            if bytes[index] == 10 {
                if index + 1 < bytes.count, bytes[index + 1] == 10 { return index + 2 }
                if index + 2 < bytes.count, bytes[index + 1] == 13, bytes[index + 2] == 10 { return index + 3 }
            }
            index += 1
        }
        return nil
    }

    private func sendFile(_ file: ServedFile, request: RecordedRequest, plan: ResponsePlan, keepAlive: Bool)
        -> CloseMode?
    {
        let total = file.data.count
        let isHead = request.method == "HEAD"
        var status = 200
        var slice = 0..<total
        var contentRange: String?

        if file.notModified(ifNoneMatch: request.header("If-None-Match"), ifModifiedSince: request.header("If-Modified-Since")) {
            var headers: [(String, String)] = []
            if let etag = file.etag { headers.append(("ETag", etag)) }
            if let lastModified = file.lastModified { headers.append(("Last-Modified", lastModified)) }
            return sendSimple(304, headers: headers, isHead: true, keepAlive: keepAlive)
        }

        if file.acceptRanges, !plan.ignoreRange, let rangeValue = request.header("Range"),
            request.header("If-Range").map({ ifRangeMatches($0, file: file) }) ?? true
        {
            switch evaluateRange(rangeValue, total: total) {
            case .ignore:
                break
            case .unsatisfiable:
                var headers = [("Content-Range", "bytes */\(total)"), ("Accept-Ranges", "bytes")]
                if let etag = file.etag { headers.append(("ETag", etag)) }
                if let lastModified = file.lastModified { headers.append(("Last-Modified", lastModified)) }
                return sendSimple(416, headers: headers, isHead: isHead, keepAlive: keepAlive)
            case .range(let first, let last):
                status = 206
                slice = first..<(last + 1)
                contentRange = "bytes \(first)-\(last)/\(total)"
            }
        }

        if let lie = plan.contentRangeLie {
            let base = slice
            status = 206
            switch lie {
            case .shiftStart(let delta):
                if total == 0 {
                    contentRange = "bytes 0-0/0"
                } else {
                    let first = min(max(base.lowerBound + delta, 0), total - 1)
                    let last = max(base.upperBound - 1, first)
                    slice = first..<(last + 1)
                    contentRange = "bytes \(first)-\(last)/\(total)"
                }
            case .total(let claimed):
                contentRange =
                    base.isEmpty
                    ? "bytes */\(claimed)" : "bytes \(base.lowerBound)-\(base.upperBound - 1)/\(claimed)"
            case .header(let value):
                contentRange = value
                if let claimed = parseContentRange(value), claimed.last < total {
                    slice = claimed.first..<(claimed.last + 1)
                }
            }
        }

        let closeAfter = !keepAlive || plan.breaksFraming
        var lines = [
            "HTTP/1.1 \(status) \(reasonPhrase(status))",
            "Date: \(ServedFile.httpDateNow())",
            "Server: StitchTestServer",
            "Content-Type: \(file.contentType)",
        ]
        if plan.chunked { lines.append("Transfer-Encoding: chunked") }
        if let claimed = plan.claimedLength {
            lines.append("Content-Length: \(claimed)")
        } else if !plan.chunked {
            lines.append("Content-Length: \(slice.count)")
        }
        if file.acceptRanges { lines.append("Accept-Ranges: bytes") }
        if let etag = file.etag { lines.append("ETag: \(etag)") }
        if let lastModified = file.lastModified { lines.append("Last-Modified: \(lastModified)") }
        if let disposition = file.contentDisposition { lines.append("Content-Disposition: \(disposition)") }
        if let contentRange { lines.append("Content-Range: \(contentRange)") }
        for (name, value) in file.extraHeaders { lines.append("\(name): \(value)") }
        if !keepAlive { lines.append("Connection: close") }
        if isHead || (slice.isEmpty && !plan.chunked && plan.cut == nil && plan.claimedLength == nil) {
            core.endResponse(connectionID: id)  // the headers are the whole response
        }
        let bodySlice = isHead ? slice.lowerBound..<slice.lowerBound : slice
        core.state.withLock { state in
            state.responses[request.serial] = ServedResponse(
                request: request, status: status, bodyStart: bodySlice.lowerBound, bodyLength: bodySlice.count,
                bodyBytesSent: 0)
        }
        guard sendAll(fd, Array((lines.joined(separator: "\r\n") + "\r\n\r\n").utf8)) else { return .abrupt }

        let outcome = sendBody(
            file.data, slice: bodySlice,
            chunked: plan.chunked && !isHead, cut: plan.cut, throttle: plan.throttle,
            throttleAfter: plan.throttleAfter, path: request.path, serial: request.serial)
        switch outcome {
        case .complete: return closeAfter ? .graceful : nil
        case .cut(let mode): return mode
        case .failed: return .abrupt
        }
    }

    private enum BodyOutcome {
        case complete
        case cut(CloseMode)
        case failed
    }

    /// Sends `data[slice]` (chunk-framed if asked), applying the cut point and pacing.
    private func sendBody(
        _ data: [UInt8], slice: Range<Int>, chunked: Bool,
        cut initialCut: (after: Int, action: ResponsePlan.CutAction)?,
        throttle: Int?, throttleAfter: Int = 0, path: String, serial: Int? = nil
    ) -> BodyOutcome {
        let length = slice.count
        let rate = throttle.flatMap { $0 > 0 ? $0 : nil }
        let pieceLimit = rate.map { max(1, min(64 * 1024, $0 / 50)) } ?? 256 * 1024
        let clock = ContinuousClock()
        var paceStart = clock.now
        var paceBase = 0
        var sent = 0
        var cut = initialCut
        return data.withUnsafeBytes { raw -> BodyOutcome in
            while true {
                if let point = cut, sent == point.after {
                    cut = nil
                    switch point.action {
                    case .drop: return .cut(.abrupt)
                    case .reset: return .cut(.reset)
                    case .short: return .cut(.graceful)
                    case .stall(let then):
                        guard stall() == .released, then == .resume else { return .cut(.abrupt) }
                        paceStart = clock.now
                        paceBase = sent
                    }
                }
                if sent >= length { break }
                var count = min(sent < throttleAfter ? 256 * 1024 : pieceLimit, length - sent)
                if sent < throttleAfter { count = min(count, throttleAfter - sent) }
                if let point = cut, point.after > sent { count = min(count, point.after - sent) }
                let start = slice.lowerBound + sent
                let piece = UnsafeRawBufferPointer(rebasing: raw[start..<(start + count)])
                if !chunked, sent + count == length {
                    core.endResponse(connectionID: id)  // the client may see the whole body from now on
                }
                if chunked {
                    guard sendAll(fd, Array("\(String(count, radix: 16))\r\n".utf8), more: true) else { return .failed }
                }
                guard sendCounted(piece, path: path, serial: serial, more: chunked) else { return .failed }
                if chunked {
                    guard sendAll(fd, [13, 10]) else { return .failed }
                }
                let before = sent
                sent += count
                if rate != nil, before < throttleAfter, sent >= throttleAfter {
                    paceStart = clock.now  // the burst is over: pacing starts here
                    paceBase = sent
                }
                if let rate, sent > throttleAfter {
                    let due = paceStart + .seconds(Double(sent - paceBase) / Double(rate))
                    let now = clock.now
                    if due > now, !pause(due - now) { return .failed }
                }
            }
            if chunked {
                core.endResponse(connectionID: id)
                guard sendAll(fd, Array("0\r\n\r\n".utf8)) else { return .failed }
            }
            return .complete
        }
    }

    /// Sends body bytes, keeping the server's body counters exact (counted before each `send`
    /// so a client that has the bytes always sees them counted; unaccepted bytes are taken back).
    private func sendCounted(_ bytes: UnsafeRawBufferPointer, path: String, serial: Int? = nil, more: Bool) -> Bool {
        sendAll(
            fd, bytes, more: more,
            willSend: { count in
                core.state.withLock { state in
                    state.bodyBytes += count
                    state.bodyBytesPerPath[path, default: 0] += count
                    if let serial { state.responses[serial]?.bodyBytesSent += count }
                }
            },
            didSend: { attempted, accepted in
                guard accepted < attempted else { return }
                core.state.withLock { state in
                    state.bodyBytes -= attempted - accepted
                    state.bodyBytesPerPath[path, default: 0] -= attempted - accepted
                    if let serial { state.responses[serial]?.bodyBytesSent -= attempted - accepted }
                }
            })
    }

    /// Sleeps for `duration` unless the server stops or the client closes the connection first (then
    /// returns false).
    private func pause(_ duration: Duration) -> Bool {
        let (seconds, attoseconds) = duration.components
        let milliseconds = Int32(clamping: seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
        var fds = [
            pollfd(fd: core.stopSignal.read, events: Int16(POLLIN), revents: 0),
            pollfd(fd: fd, events: pollReadHangUp, revents: 0),
        ]
        while true {
            let result = poll(&fds, 2, milliseconds)
            if result < 0, errno == EINTR { continue }
            return result == 0
        }
    }

    private enum StallResult {
        case released, clientGone, stopped
    }

    /// Blocks until `releaseStalls()`, client disconnect, or server stop.
    private func stall() -> StallResult {
        guard let wake = makePipe() else { return .stopped }
        defer {
            closeDescriptor(wake.read)
            closeDescriptor(wake.write)
        }
        let stallID: Int? = core.state.withLock { state in
            if state.stopped { return nil }
            let id = state.nextStallID
            state.nextStallID += 1
            state.stalls[id] = wake.write
            return id
        }
        guard let stallID else { return .stopped }
        // Deregister before the pipe is closed (defers run in reverse order).
        defer { core.state.withLock { _ = $0.stalls.removeValue(forKey: stallID) } }
        core.progress.update { $0.stallsReached += 1 }
        while true {
            var fds = [
                pollfd(fd: fd, events: pollReadHangUp, revents: 0),
                pollfd(fd: core.stopSignal.read, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0),
            ]
            if poll(&fds, 3, -1) < 0 {
                if errno == EINTR { continue }
                return .stopped
            }
            if fds[1].revents != 0 { return .stopped }
            if fds[2].revents != 0 { return .released }
            if fds[0].revents & (pollReadHangUp | Int16(POLLHUP) | Int16(POLLERR) | Int16(POLLNVAL)) != 0 {
                return .clientGone
            }
        }
    }

    // MARK: Closing

    /// Closes the connection. The descriptor is removed from the live set first, so `stop()`
    /// never shuts down a descriptor number that has been reused.
    private func finish(_ mode: CloseMode) {
        core.state.withLock { _ = $0.connections.removeValue(forKey: id) }
        switch mode {
        case .abrupt:
            _ = shutdown(fd, Int32(SHUT_RDWR))
        case .reset:
            setLingerReset(fd)
        case .graceful:
            _ = shutdown(fd, Int32(SHUT_WR))
            lingerDrain()
        }
        closeDescriptor(fd)
    }

    /// After a half-close, reads and drops client data until EOF, one second, or server stop,
    /// so unread input does not turn our close into a reset that could destroy the response.
    private func lingerDrain() {
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(1)
        var scratch = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let remaining = deadline - clock.now
            if remaining <= .zero { return }
            let milliseconds = Int32(
                clamping: remaining.components.seconds * 1000
                    + remaining.components.attoseconds / 1_000_000_000_000_000 + 1)
            var fds = [
                pollfd(fd: fd, events: Int16(POLLIN), revents: 0),
                pollfd(fd: core.stopSignal.read, events: Int16(POLLIN), revents: 0),
            ]
            let ready = poll(&fds, 2, milliseconds)
            if ready < 0, errno == EINTR { continue }
            if ready <= 0 || fds[1].revents != 0 { return }
            let count = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if count == 0 { return }
            if count < 0, errno != EINTR, errno != EAGAIN { return }
        }
    }
}

/// Standard reason phrases for the status line.
func reasonPhrase(_ status: Int) -> String {
    switch status {
    case 200: "OK"
    case 204: "No Content"
    case 206: "Partial Content"
    case 301: "Moved Permanently"
    case 302: "Found"
    case 303: "See Other"
    case 304: "Not Modified"
    case 307: "Temporary Redirect"
    case 308: "Permanent Redirect"
    case 400: "Bad Request"
    case 401: "Unauthorized"
    case 403: "Forbidden"
    case 404: "Not Found"
    case 405: "Method Not Allowed"
    case 408: "Request Timeout"
    case 410: "Gone"
    case 412: "Precondition Failed"
    case 416: "Range Not Satisfiable"
    case 429: "Too Many Requests"
    case 431: "Request Header Fields Too Large"
    case 500: "Internal Server Error"
    case 501: "Not Implemented"
    case 502: "Bad Gateway"
    case 503: "Service Unavailable"
    case 504: "Gateway Timeout"
    default: "Status \(status)"
    }
}
